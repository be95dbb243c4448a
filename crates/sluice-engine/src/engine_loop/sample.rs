//! Sampling a step's rows: those the model samples itself (marked before the forward, their
//! random numbers drawn here), the grammars' masks, and the sampler for the rest, merged back
//! in row order.

use std::sync::LazyLock;
use std::time::Instant;

use rayon::prelude::*;

use super::{EngineLoop, ModelRow};
use crate::params::SamplingParams;
use crate::rng::SeqRng;
use crate::sampler::{draws_per_row, model_rule, SampleRow, Sampled, TokenLogprobs};

/// Sampling parameters for a row whose request is unknown, which would be an engine bug; the
/// row is still sampled so the step's rows line up, and its token is dropped at commit.
static ORPHAN_PARAMS: LazyLock<SamplingParams> = LazyLock::new(SamplingParams::greedy);

impl EngineLoop {
    /// With a model that samples rows itself, marks the step's rows it may sample: those
    /// whose request needs nothing but temperature, `top_k`, `top_p`, `min_p` and logprobs,
    /// and that neither a grammar nor `min_tokens` restricts this step. Their random numbers
    /// are drawn here, from each sequence's generator, as the sampler would have drawn them.
    pub(super) fn mark_model_sampled_rows(&mut self) {
        self.sampling.model_rows.clear();
        if !self.sampling.model_samples_rows {
            return;
        }
        for (s, records) in self.scheduler.scheduled_records() {
            // A sequence verifying drafts has a row per position, each sampled as plain
            // decoding would sample it there: its generator advanced by the rows before it.
            for i in 0..s.num_rows() {
                let row = records.and_then(|(r, seq)| {
                    let banned = r.stop.banned(seq.generated + i);
                    if seq.constraint.is_some() || !banned.is_empty() {
                        return None;
                    }
                    let mut rng = seq.rng.advanced(i * draws_per_row(&r.sampling));
                    let rule = model_rule(&r.sampling, &mut rng)?;
                    let logprob = r.sampling.logprobs.is_some();
                    Some((rule, ModelRow { rng, logprob }))
                });
                self.batch.model_sampling.push(row.map(|(rule, _)| rule));
                self.sampling.model_rows.push(row.map(|(_, kept)| kept));
            }
        }
    }

    /// Computes the token masks of the step's constrained rows, all at once on the rayon
    /// pool. While no request has a grammar this is one comparison.
    pub(super) fn compute_masks(&mut self) {
        if self.kinds.constrained == 0 {
            return;
        }
        let mut any = false;
        self.scheduler.for_each_scheduled_mut(|s, records| {
            let constraint = records.and_then(|(_, seq)| seq.constraint.as_deref_mut());
            if let Some(c) = constraint.filter(|_| s.sample) {
                c.due = true;
                any = true;
            }
        });
        if !any {
            return;
        }
        let start = Instant::now();
        let mut jobs = emptied(std::mem::take(&mut self.sampling.mask_jobs));
        jobs.extend(
            self.scheduler
                .sequence_records_mut()
                .filter_map(|seq| seq.constraint.as_deref_mut())
                .filter(|c| c.due),
        );
        jobs.par_iter_mut().for_each(|c| {
            c.due = false;
            c.compute_mask();
        });
        self.sampling.mask_jobs = emptied(jobs);
        self.telemetry
            .metrics
            .mask_duration
            .record(start.elapsed().as_secs_f64());
    }

    /// Samples every row of the step into `self.sampling.tokens` (and
    /// `self.sampling.sampled`): the rows the model sampled come from its output, the others
    /// from the sampler.
    pub(super) fn sample(&mut self) {
        self.compute_masks();
        let model_rows = &self.sampling.model_rows;
        let by_model = |i: usize| matches!(model_rows.get(i), Some(Some(_)));
        let mut rows = emptied(std::mem::take(&mut self.sampling.rows));
        rows.extend(
            self.scheduler
                .scheduled_records()
                .flat_map(|(s, records)| (0..s.num_rows()).map(move |i| (i, records)))
                .enumerate()
                .filter(|&(row, _)| !by_model(row))
                // Row `i` of a sequence's drafts: as plain decoding samples `i` tokens on.
                .map(|(_, (i, records))| match records {
                    Some((r, seq)) => SampleRow {
                        params: &r.sampling,
                        rng: seq.rng.advanced(i * draws_per_row(&r.sampling)),
                        prompt_tokens: &r.prompt_set,
                        output_counts: seq.counts.as_ref(),
                        banned: r.stop.banned(seq.generated + i),
                        allowed: seq.constraint.as_ref().and_then(|c| c.allowed()),
                    },
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
        self.sampling.rngs.clear();
        if self.sampling.model_rows.is_empty() {
            self.sampling.sampler.sample(
                &mut self.output.logits,
                &mut rows,
                &mut self.sampling.sampled,
            );
            self.sampling.rngs.extend(rows.iter().map(|r| r.rng));
        } else {
            self.sampling.sampler.sample(
                &mut self.output.logits,
                &mut rows,
                &mut self.sampling.host_sampled,
            );
            self.sampling.sampled.clear();
            let mut host = self
                .sampling
                .host_sampled
                .drain(..)
                .zip(rows.iter().map(|r| r.rng));
            let mut picked = self.output.sampled.iter();
            for kept in &self.sampling.model_rows {
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
                self.sampling.sampled.push(sampled);
                self.sampling.rngs.push(rng);
            }
        }
        self.sampling.rows = emptied(rows);
        self.sampling.tokens.clear();
        self.sampling
            .tokens
            .extend(self.sampling.sampled.iter().map(|s| s.token));
    }
}

/// `buffer`'s allocation, emptied, retyped: the step's rows and mask jobs borrow the step's
/// records, so their buffers are kept between steps under another lifetime. Collecting a
/// mapped `vec::IntoIter` into a `Vec` whose element has the same layout reuses the source
/// allocation (std's in-place collect), and the iterator is empty, so this is free: a step's
/// rows cost no allocation once the buffer has grown to the batch.
fn emptied<T, U>(mut buffer: Vec<T>) -> Vec<U> {
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
        let reused: Vec<SampleRow<'static>> = emptied(rows);
        assert!(reused.is_empty());
        assert_eq!(reused.capacity(), 64);
        assert_eq!(reused.as_ptr() as usize, ptr);
    }
}
