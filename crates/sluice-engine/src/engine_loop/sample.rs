//! Sampling a step's rows: those the model samples itself (marked before the forward, their
//! random numbers drawn here), the grammars' masks, and the sampler for the rest, merged back
//! in row order.

use std::sync::LazyLock;
use std::time::Instant;

use rayon::prelude::*;

use super::{EngineLoop, ModelRow};
use crate::constraint::SeqConstraint;
use crate::params::SamplingParams;
use crate::rng::SeqRng;
use crate::sampler::{model_rule, SampleRow, Sampled, TokenLogprobs};

/// Sampling parameters for a row whose request is unknown, which would be an engine bug; the
/// row is still sampled so the step's rows line up, and its token is dropped at commit.
static ORPHAN_PARAMS: LazyLock<SamplingParams> = LazyLock::new(SamplingParams::greedy);

impl EngineLoop {
    /// With a model that samples rows itself, marks the step's rows it may sample: those
    /// whose request needs nothing but temperature, `top_k`, `top_p`, `min_p` and logprobs,
    /// and that neither a grammar nor `min_tokens` restricts this step. Their random numbers
    /// are drawn here, from each sequence's generator, as the sampler would have drawn them.
    pub(super) fn mark_model_sampled_rows(&mut self) {
        self.model_rows.clear();
        if !self.model_samples_rows {
            return;
        }
        let requests = &self.requests;
        for s in self.scheduler.output().sampling() {
            let row = requests.get(&s.seq_id.request).and_then(|r| {
                let seq = r.seqs.get(s.seq_id.index as usize)?;
                if seq.constraint.is_some() || !r.stop.banned(seq.generated).is_empty() {
                    return None;
                }
                let mut rng = seq.rng;
                let rule = model_rule(&r.sampling, &mut rng)?;
                let logprob = r.sampling.logprobs.is_some();
                Some((rule, ModelRow { rng, logprob }))
            });
            self.batch.model_sampling.push(row.map(|(rule, _)| rule));
            self.model_rows.push(row.map(|(_, kept)| kept));
        }
    }

    /// Computes the token masks of the step's constrained rows, all at once on the rayon
    /// pool. While no request has a grammar this is one comparison.
    pub(super) fn compute_masks(&mut self) {
        if self.kinds.constrained == 0 {
            return;
        }
        let mut any = false;
        for s in self.scheduler.output().sampling() {
            let seq = self
                .requests
                .get_mut(&s.seq_id.request)
                .and_then(|r| r.seqs.get_mut(s.seq_id.index as usize));
            if let Some(c) = seq.and_then(|seq| seq.constraint.as_deref_mut()) {
                c.due = true;
                any = true;
            }
        }
        if !any {
            return;
        }
        let start = Instant::now();
        let mut jobs = recycle(std::mem::take(&mut self.mask_jobs));
        jobs.extend(
            self.requests
                .values_mut()
                .flat_map(|r| r.seqs.iter_mut())
                .filter_map(|seq| seq.constraint.as_deref_mut())
                .filter(|c| c.due),
        );
        jobs.par_iter_mut().for_each(|c| {
            c.due = false;
            c.compute_mask();
        });
        self.mask_jobs = recycle(jobs);
        self.telemetry
            .metrics
            .mask_duration
            .record(start.elapsed().as_secs_f64());
    }

    /// Samples every row of the step into `self.tokens` (and `self.sampled`): the rows the
    /// model sampled come from its output, the others from the sampler.
    pub(super) fn sample(&mut self) {
        self.compute_masks();
        let requests = &self.requests;
        let model_rows = &self.model_rows;
        let by_model = |i: usize| matches!(model_rows.get(i), Some(Some(_)));
        let mut rows = reuse_rows(std::mem::take(&mut self.rows));
        rows.extend(
            self.scheduler
                .output()
                .sampling()
                .enumerate()
                .filter(|&(i, _)| !by_model(i))
                .map(|(_, s)| match requests.get(&s.seq_id.request) {
                    Some(r) => {
                        let seq = &r.seqs[s.seq_id.index as usize];
                        SampleRow {
                            params: &r.sampling,
                            rng: seq.rng,
                            prompt_tokens: &r.prompt_set,
                            output_counts: seq.counts.as_ref(),
                            banned: r.stop.banned(seq.generated),
                            allowed: seq.constraint.as_ref().and_then(|c| c.allowed()),
                        }
                    }
                    None => SampleRow {
                        params: &ORPHAN_PARAMS,
                        rng: SeqRng::new(0, 0),
                        prompt_tokens: &[],
                        output_counts: None,
                        banned: &[],
                        allowed: None,
                    },
                }),
        );
        self.rngs.clear();
        if self.model_rows.is_empty() {
            self.sampler
                .sample(&mut self.output.logits, &mut rows, &mut self.sampled);
            self.rngs.extend(rows.iter().map(|r| r.rng));
        } else {
            self.sampler
                .sample(&mut self.output.logits, &mut rows, &mut self.host_sampled);
            self.sampled.clear();
            let mut host = self.host_sampled.drain(..).zip(rows.iter().map(|r| r.rng));
            let mut picked = self.output.sampled.iter();
            for kept in &self.model_rows {
                let from_model = kept.as_ref().and_then(|k| Some((k, picked.next()?)));
                let (sampled, rng) = match from_model {
                    Some((kept, t)) => {
                        let logprobs = kept.logprob.then(|| TokenLogprobs {
                            token: t.token,
                            logprob: t.logprob,
                            top: t.top.as_slice().to_vec(),
                        });
                        let sampled = Sampled {
                            token: t.token,
                            logprobs,
                        };
                        (sampled, kept.rng)
                    }
                    // Counts were checked after the forward: every row has its result.
                    None => host.next().expect("a sampler result per row"),
                };
                self.sampled.push(sampled);
                self.rngs.push(rng);
            }
        }
        self.rows = reuse_rows(rows);
        self.tokens.clear();
        self.tokens.extend(self.sampled.iter().map(|s| s.token));
    }
}

/// `buffer`'s allocation, emptied, retyped to borrow for another step (see [`reuse_rows`]).
fn recycle<'b>(mut buffer: Vec<&mut SeqConstraint>) -> Vec<&'b mut SeqConstraint> {
    buffer.clear();
    buffer
        .into_iter()
        .map(|_| unreachable!("the buffer was cleared"))
        .collect()
}

/// `buffer`'s allocation, emptied, retyped for rows borrowing from another step. Collecting a
/// mapped `vec::IntoIter` into a `Vec` whose element has the same layout reuses the source
/// allocation (std's in-place collect), and the iterator is empty, so this is free: the rows
/// of a step cost no allocation once the buffer has grown to the batch.
fn reuse_rows<'a, 'b>(mut buffer: Vec<SampleRow<'a>>) -> Vec<SampleRow<'b>> {
    buffer.clear();
    buffer
        .into_iter()
        .map(|_| unreachable!("the buffer was cleared"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_rows_keep_their_allocation() {
        let params = SamplingParams::greedy();
        let mut rows: Vec<SampleRow<'_>> = Vec::with_capacity(64);
        rows.push(SampleRow {
            params: &params,
            rng: SeqRng::new(0, 0),
            prompt_tokens: &[],
            output_counts: None,
            banned: &[],
            allowed: None,
        });
        let ptr = rows.as_ptr() as usize;
        let reused: Vec<SampleRow<'static>> = reuse_rows(rows);
        assert!(reused.is_empty());
        assert_eq!(reused.capacity(), 64);
        assert_eq!(reused.as_ptr() as usize, ptr);
    }
}
