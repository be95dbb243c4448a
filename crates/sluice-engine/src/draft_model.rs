//! Speculation with a draft model: a second, smaller model of the same tokenizer, run by the
//! engine thread before each step over the sequences about to draft
//! ([`crate::Scheduler::draft_candidates`]), on its own paged KV cache. Its guesses are
//! greedy and handed to the scheduler ([`crate::Scheduler::set_proposal`]), which verifies
//! them inside the ordinary step exactly as it verifies n-gram guesses: what the draft model
//! says only decides how many tokens a step may save, never which tokens come out.
//!
//! One round of `k` drafts is `k` batched forwards of the draft model: the first computes
//! what its cache lacks of each sequence (the tokens the target kept since the last round,
//! or the whole prompt the first time) and guesses the first draft; each next one computes
//! the previous guess and guesses the next. Its cache then holds the sequence up to its last
//! token and the first `k - 1` guesses; at the next round the guesses the target kept are
//! found still in place (compared token by token) and the rest are recomputed over, as the
//! target's rolled-back slots are.
//!
//! How many guesses a sequence makes is chosen each round for speed: each costs a draft
//! forward, and a guess is worth something only if every one before it comes true. The loop
//! keeps the time of a draft forward and of a target step, and each sequence the rate at
//! which its guesses came true (how the target's tokens went on, which speculation never
//! changes); the round guesses the `k` that maximises tokens a step over a step's time,
//! `(1 - a^(k+1)) / (1 - a) / (1 + k * draft/target)`, and nothing where no `k` beats plain
//! decoding (probing with one guess every [`PROBE_EVERY`] rounds, so a sequence whose text
//! becomes easier drafts again).
//!
//! A sequence's draft blocks are freed as soon as it is no longer running (finished,
//! aborted, cancelled or preempted: [`DraftModel::release_stopped`]); a preempted one
//! computes its text again when it next drafts. A sequence drafts nothing in a step where the
//! draft cache has no blocks for it, or where what it must first catch up on exceeds the
//! step's token budget (it then catches up a chunk per step, as a prefill does).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sluice_model::sampling::RowSampling;
use sluice_model::{StepBatch, StepOutput};

use crate::block_manager::{BlockManager, BlockTable};
use crate::model::Model;
use crate::scheduler::{DraftCandidate, Scheduler};
use crate::sequence::{SeqId, SequenceStatus};

/// A sequence whose guesses do not pay still guesses once every this many rounds, to notice
/// when they would.
pub(crate) const PROBE_EVERY: u32 = 16;

/// Weight of the newest observation in the running averages of times and acceptance.
const SMOOTHING: f64 = 0.2;

/// The draft model with its cache's bookkeeping, owned by the engine thread.
pub(crate) struct DraftModel {
    model: Box<dyn Model>,
    blocks: BlockManager,
    seqs: HashMap<SeqId, DraftSeq>,
    /// Tokens the target accepts: a guess past it ends the draft (a draft model with a larger
    /// embedding table could name a token the target has no row for).
    target_vocab: usize,
    /// Most tokens one draft forward computes.
    max_batch_tokens: usize,
    samples_rows: bool,
    /// Running averages, in seconds: one draft forward, and one target step that verified
    /// guesses (`None` until measured).
    draft_forward: Option<f64>,
    target_step: Option<f64>,
    // Buffers reused every step.
    candidates: Vec<DraftCandidate>,
    /// The sequences guessing in this round, in batch order.
    guessing: Vec<Guessing>,
    /// Sequences computing a catch-up chunk without guessing, with its length.
    catching_up: Vec<(SeqId, usize)>,
    /// Per logits row of the forward in flight: its sequence's index in `guessing`.
    row_owners: Vec<usize>,
    batch: StepBatch,
    output: StepOutput,
}

/// What the draft cache holds of one sequence.
#[derive(Default)]
struct DraftSeq {
    table: BlockTable,
    /// Leading tokens of the sequence whose K/V the draft cache holds.
    confirmed: usize,
    /// Tokens past `confirmed` whose K/V the draft cache also holds: guesses of the last
    /// round, which the target may or may not have kept.
    guessed: Vec<u32>,
    /// This round's guesses, made when the sequence was `round_len` tokens long.
    drafts: Vec<u32>,
    round_len: usize,
    /// Running sums of guesses that came true and of guesses that did not (at most one a
    /// round: the first wrong one ends it).
    hits: f64,
    misses: f64,
    /// Rounds in a row it guessed nothing because guessing did not pay.
    idle_rounds: u32,
}

impl DraftSeq {
    /// Scores last round's guesses against how the sequence went on.
    fn score_last_round(&mut self, tokens: &[u32]) {
        if self.drafts.is_empty() || tokens.len() <= self.round_len {
            return;
        }
        let known = &tokens[self.round_len..];
        let compared = self.drafts.len().min(known.len());
        let hits = self.drafts[..compared]
            .iter()
            .zip(known)
            .take_while(|(guess, token)| guess == token)
            .count();
        let missed = hits < compared;
        self.hits = self.hits * (1.0 - SMOOTHING) + hits as f64;
        self.misses = self.misses * (1.0 - SMOOTHING) + f64::from(u8::from(missed));
        self.drafts.clear();
    }

    /// The chance that a guess comes true, from its record (2 in 3 before any).
    fn acceptance(&self) -> f64 {
        (self.hits + 2.0) / (self.hits + self.misses + 3.0)
    }
}

/// Tokens a step is expected to yield over its cost relative to plain decoding's, for `k`
/// guesses each true with chance `a`, a draft forward costing `cost` target steps.
fn speedup(k: usize, a: f64, cost: f64) -> f64 {
    let tokens = (1.0 - a.powi(k as i32 + 1)) / (1.0 - a);
    tokens / (1.0 + k as f64 * cost)
}

/// How many of at most `max` guesses to make: the count with the best expected speedup, or
/// 0 when none beats plain decoding.
fn best_guess_count(max: usize, a: f64, cost: f64) -> usize {
    let (best, gain) = (1..=max)
        .map(|k| (k, speedup(k, a, cost)))
        .fold((0, 1.0), |b, c| if c.1 > b.1 { c } else { b });
    if gain > 1.0 {
        best
    } else {
        0
    }
}

#[derive(Clone, Copy)]
struct Guessing {
    id: SeqId,
    /// The most guesses it may make this round.
    max: usize,
    /// The sequence's length before this round's guesses.
    len: usize,
}

/// Why a round of drafts was dropped; the step goes on without them.
#[derive(Debug, thiserror::Error)]
#[error("draft model: {0}")]
pub(crate) struct DraftFailure(String);

impl DraftModel {
    pub fn new(model: Box<dyn Model>, target_vocab: usize, max_batch_tokens: usize) -> Self {
        let blocks = BlockManager::new(model.num_blocks(), model.block_size());
        Self {
            batch: StepBatch::new(model.block_size()),
            samples_rows: model.samples_rows(),
            draft_forward: None,
            target_step: None,
            model,
            blocks,
            seqs: HashMap::new(),
            target_vocab,
            max_batch_tokens: max_batch_tokens.max(1),
            candidates: Vec::new(),
            guessing: Vec::new(),
            catching_up: Vec::new(),
            row_owners: Vec::new(),
            output: StepOutput::default(),
        }
    }

    pub fn num_used_blocks(&self) -> usize {
        self.blocks.num_used_blocks()
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.num_blocks()
    }

    pub fn block_size(&self) -> usize {
        self.blocks.block_size()
    }

    /// Runs a round of guesses for the scheduler's draft candidates and hands each its
    /// guesses (none where it cannot guess this step). On a failed forward every candidate
    /// gets none, and the error says why.
    pub fn propose<R, S>(&mut self, scheduler: &mut Scheduler<R, S>) -> Result<(), DraftFailure> {
        scheduler.draft_candidates(&mut self.candidates);
        if self.candidates.is_empty() {
            return Ok(());
        }
        let result = self.guess(scheduler);
        if result.is_err() {
            // What the failed forward wrote is unknown: only what earlier ones confirmed holds.
            for g in &self.guessing {
                if let Some(seq) = self.seqs.get_mut(&g.id) {
                    seq.guessed.clear();
                    seq.drafts.clear();
                }
            }
        }
        for c in &self.candidates {
            let drafts = match (&result, self.seqs.get(&c.id)) {
                (Ok(()), Some(seq)) => &seq.drafts[..],
                _ => &[],
            };
            scheduler.set_proposal(c.id, drafts);
        }
        result
    }

    /// The round itself: leaves each guessing sequence's guesses in its `drafts`.
    fn guess<R, S>(&mut self, scheduler: &Scheduler<R, S>) -> Result<(), DraftFailure> {
        self.batch.clear();
        self.guessing.clear();
        self.catching_up.clear();
        self.row_owners.clear();
        let mut budget = self.max_batch_tokens;
        let max_len = self.model.max_model_len();
        // A draft forward's cost in target steps.
        let cost = match (self.draft_forward, self.target_step) {
            (Some(d), Some(t)) if t > 0.0 => Some(d / t),
            _ => None,
        };
        for c in &self.candidates {
            let Some(tokens) = scheduler.get(c.id).map(|s| s.tokens()) else {
                continue;
            };
            let seq = self.seqs.entry(c.id).or_default();
            seq.score_last_round(tokens);
            seq.drafts.clear();
            // Until both times are measured, as many guesses as allowed.
            let wanted = match cost {
                None => c.max,
                Some(cost) => match best_guess_count(c.max, seq.acceptance(), cost) {
                    0 if seq.idle_rounds + 1 >= PROBE_EVERY => 1,
                    k => k,
                },
            };
            seq.idle_rounds = if wanted == 0 { seq.idle_rounds + 1 } else { 0 };
            // The guesses the target kept are still valid in the cache; the rest are not.
            let kept = seq
                .guessed
                .iter()
                .zip(&tokens[seq.confirmed.min(tokens.len())..])
                .take_while(|(guess, token)| guess == token)
                .count();
            seq.guessed.clear();
            // The last token is never in the cache (it is the next forward's input).
            seq.confirmed = (seq.confirmed + kept).min(tokens.len() - 1);
            let todo = tokens.len() - seq.confirmed;
            let max = wanted.min(max_len.saturating_sub(tokens.len()));
            if budget == 0 {
                break;
            }
            if max == 0 {
                // Not guessing this round; it catches up in one that does.
                continue;
            }
            if todo > budget {
                // Catch up a chunk now, guess in a later step.
                if !self.blocks.allocate(&mut seq.table, seq.confirmed + budget) {
                    continue;
                }
                self.batch.push_sequence_rows(
                    &tokens[seq.confirmed..seq.confirmed + budget],
                    seq.confirmed,
                    seq.table.blocks(),
                    0,
                );
                self.catching_up.push((c.id, budget));
                budget = 0;
                continue;
            }
            // Room for the sequence and the guesses the cache will hold (all but the last).
            if !self.blocks.allocate(&mut seq.table, tokens.len() + max - 1) {
                continue;
            }
            self.batch.push_sequence_rows(
                &tokens[seq.confirmed..],
                seq.confirmed,
                seq.table.blocks(),
                1,
            );
            budget -= todo;
            seq.round_len = tokens.len();
            self.row_owners.push(self.guessing.len());
            self.guessing.push(Guessing {
                id: c.id,
                max,
                len: tokens.len(),
            });
        }
        if self.batch.is_empty() {
            return Ok(());
        }
        self.forward_and_guess()?;
        for &(id, chunk) in &self.catching_up {
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.confirmed += chunk;
            }
        }
        for g in &self.guessing {
            if let Some(seq) = self.seqs.get_mut(&g.id) {
                seq.confirmed = g.len;
            }
        }
        // Each further forward computes every still-guessing sequence's latest guess.
        for round in 1.. {
            self.batch.clear();
            self.row_owners.clear();
            for (i, g) in self.guessing.iter().enumerate() {
                let seq = self
                    .seqs
                    .get_mut(&g.id)
                    .expect("a guessing sequence has a record");
                // Those whose last forward gave a usable guess and that may guess more.
                if seq.drafts.len() != round || round >= g.max {
                    continue;
                }
                let last = seq.drafts[round - 1];
                seq.guessed.push(last);
                self.batch
                    .push_sequence_rows(&[last], g.len + round - 1, seq.table.blocks(), 1);
                self.row_owners.push(i);
            }
            if self.batch.is_empty() {
                break;
            }
            self.forward_and_guess()?;
        }
        Ok(())
    }

    /// Runs the draft model over `self.batch` and appends each row's greedy guess to its
    /// owner's drafts. A guess the target has no token for is dropped, which ends that
    /// sequence's drafts.
    fn forward_and_guess(&mut self) -> Result<(), DraftFailure> {
        let rows = self.row_owners.len();
        self.batch.model_sampling.clear();
        if self.samples_rows {
            self.batch
                .model_sampling
                .resize(rows, Some(RowSampling::GREEDY));
        }
        let start = Instant::now();
        self.model
            .forward(&self.batch, &mut self.output)
            .map_err(|e| DraftFailure(e.to_string()))?;
        average(&mut self.draft_forward, start.elapsed());
        let vocab = self.model.vocab_size();
        let returned = if self.samples_rows {
            self.output.sampled.len()
        } else {
            self.output.logits.len()
        };
        let wanted = if self.samples_rows {
            rows
        } else {
            rows * vocab
        };
        if returned != wanted {
            return Err(DraftFailure(format!(
                "{returned} values back for {rows} rows"
            )));
        }
        for (row, &owner) in self.row_owners.iter().enumerate() {
            let token = if self.samples_rows {
                self.output.sampled[row].token
            } else {
                argmax(&self.output.logits[row * vocab..(row + 1) * vocab])
            };
            if (token as usize) < self.target_vocab {
                let id = self.guessing[owner].id;
                let seq = self
                    .seqs
                    .get_mut(&id)
                    .expect("a guessing sequence has a record");
                seq.drafts.push(token);
            }
        }
        Ok(())
    }

    /// The target's forward of a step that verified guesses took `elapsed`.
    pub fn observe_target_step(&mut self, elapsed: Duration) {
        average(&mut self.target_step, elapsed);
    }

    /// Whether the last round made any guess.
    pub fn guessed(&self) -> bool {
        !self.guessing.is_empty()
    }

    /// Frees the draft cache of every sequence that is no longer running.
    pub fn release_stopped<R, S>(&mut self, scheduler: &Scheduler<R, S>) {
        if self.seqs.is_empty() {
            return;
        }
        let blocks = &mut self.blocks;
        self.seqs.retain(|&id, seq| {
            let running = scheduler
                .get(id)
                .is_some_and(|s| s.status() == SequenceStatus::Running);
            if !running {
                blocks.free(&mut seq.table);
            }
            running
        });
    }
}

fn average(mean: &mut Option<f64>, elapsed: Duration) {
    let x = elapsed.as_secs_f64();
    *mean = Some(mean.map_or(x, |m| m * (1.0 - SMOOTHING) + x * SMOOTHING));
}

/// The first maximum of a row: greedy, as plain decoding picks.
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guesses_are_sized_by_what_they_cost_and_how_often_they_come_true() {
        // Free guesses: as many as allowed.
        assert_eq!(best_guess_count(8, 0.5, 0.0), 8);
        // A draft forward at 0.3 target steps: good guesses pay a few, poor ones none.
        let k = best_guess_count(8, 0.9, 0.3);
        assert!((3..=6).contains(&k), "{k}");
        assert_eq!(best_guess_count(8, 0.2, 0.3), 0);
        // A draft as slow as the target never pays.
        assert_eq!(best_guess_count(8, 0.99, 1.0), 0);
        // More acceptance, more guesses.
        assert!(best_guess_count(16, 0.95, 0.1) > best_guess_count(16, 0.8, 0.1));
        assert!((speedup(2, 0.5, 0.0) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn a_round_is_scored_against_how_the_sequence_went_on() {
        let mut seq = DraftSeq {
            drafts: vec![5, 6, 7],
            round_len: 2,
            ..DraftSeq::default()
        };
        // Two came true, the third did not.
        seq.score_last_round(&[1, 2, 5, 6, 9, 4]);
        assert_eq!((seq.hits, seq.misses), (2.0, 1.0));
        assert!(seq.drafts.is_empty());
        // All that can be compared came true: no miss.
        seq.drafts = vec![4, 4];
        seq.round_len = 6;
        seq.score_last_round(&[1, 2, 5, 6, 9, 4, 4]);
        assert_eq!(seq.misses, 0.8);
        assert!((seq.hits - 2.6).abs() < 1e-12);
    }
}
