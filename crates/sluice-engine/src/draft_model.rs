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
//! forward and a row more in the target's step (on a CPU a row of a 1.5B model costs a third
//! of a one-row step: verifying is not free), and a guess is worth something only if every
//! one before it comes true. The loop keeps the time of a draft forward, a line fitted to the
//! target's step time against its token count, and per sequence the rate at which its
//! guesses came true (scored against how its text went on, which speculation never changes);
//! each round takes the `k` that maximises the step's tokens per second, and none where no
//! `k` beats plain decoding, probing with one guess every [`PROBE_EVERY`] rounds so that a
//! sequence whose text becomes easier drafts again. Where even guesses that always came true
//! would not pay (a draft model nearly as slow as its target, or a target whose step grows
//! steeply with its rows), nothing is drafted or probed at all: speculation then costs only
//! the timing, and the line fitted to the steps real traffic makes decides when it pays again.
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

/// The acceptance of guesses that nearly always come true: where even they would not pay,
/// nothing is drafted and nothing probed.
const CERTAIN: f64 = 0.99;

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
    /// Whether guesses are sized by their cost ([`crate::SpeculationConfig::cost_aware`]).
    cost_aware: bool,
    samples_rows: bool,
    /// Running average of one draft forward, in seconds (`None` until measured).
    draft_forward: Option<f64>,
    /// The target's step time against its token count.
    target_steps: StepTimeFit,
    // Buffers reused every step.
    candidates: Vec<DraftCandidate>,
    /// The sequences guessing in this round, in batch order.
    guessing: Vec<Guessing>,
    /// Sequences computing a catch-up chunk without guessing, with its length.
    catching_up: Vec<(SeqId, usize)>,
    /// Per logits row of the forward in flight: its sequence.
    row_owners: Vec<SeqId>,
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

/// What a round with `k` guesses yields against a plain step: `others` other sequences
/// decoding one token each in the same step, a draft forward taking `draft` seconds, the
/// target's step taking `step(n)` seconds for `n` tokens, each guess true with chance `a`.
/// Returns the step's tokens per second with the guesses over without them.
fn speedup(k: usize, a: f64, others: usize, draft: f64, step: impl Fn(usize) -> f64) -> f64 {
    let n = others + 1;
    let tokens = others as f64 + (1.0 - a.powi(k as i32 + 1)) / (1.0 - a);
    let time = step(n + k) + k as f64 * draft;
    (tokens / time) / (n as f64 / step(n))
}

/// The expected speedup a round must promise before it guesses: the model leaves out what a
/// draft cache catching up after rounds without guesses costs, and timings are noisy.
const MIN_GAIN: f64 = 1.1;

/// How many of at most `max` guesses to make: the count with the best expected speedup, or
/// 0 when none promises at least [`MIN_GAIN`].
fn best_guess_count(
    max: usize,
    a: f64,
    others: usize,
    draft: f64,
    step: impl Fn(usize) -> f64,
) -> usize {
    let (best, gain) = (1..=max)
        .map(|k| (k, speedup(k, a, others, draft, &step)))
        .fold((0, 1.0), |b, c| if c.1 > b.1 { c } else { b });
    if gain >= MIN_GAIN {
        best
    } else {
        0
    }
}

/// Steps of more tokens than this say nothing about a decode's cost (they prefill).
const FIT_MAX_TOKENS: usize = 64;

/// A least-squares line through the target's recent (tokens, seconds) steps, older ones
/// weighing less: `time(n) = base + per_token * n`.
#[derive(Default)]
struct StepTimeFit {
    weight: f64,
    n: f64,
    t: f64,
    nn: f64,
    nt: f64,
}

impl StepTimeFit {
    /// How fast older steps stop counting (a memory of about 1 / (1 - DECAY) steps).
    const DECAY: f64 = 0.98;

    fn observe(&mut self, tokens: usize, elapsed: Duration) {
        let (n, t) = (tokens as f64, elapsed.as_secs_f64());
        let d = Self::DECAY;
        self.weight = self.weight * d + 1.0;
        self.n = self.n * d + n;
        self.t = self.t * d + t;
        self.nn = self.nn * d + n * n;
        self.nt = self.nt * d + n * t;
    }

    /// `(base, per_token)`, or `None` before any step. While the steps seen have (nearly) one
    /// size, the time is taken as proportional to the tokens: the cautious guess, under which
    /// a guess pays only as a decode's share, and the steps that follow give the line its
    /// slope.
    fn line(&self) -> Option<(f64, f64)> {
        if self.weight == 0.0 {
            return None;
        }
        let (mean_n, mean_t) = (self.n / self.weight, self.t / self.weight);
        let var_n = self.nn / self.weight - mean_n * mean_n;
        if var_n < 0.25 {
            return Some((0.0, mean_t / mean_n.max(1.0)));
        }
        let per_token = ((self.nt / self.weight - mean_n * mean_t) / var_n).max(0.0);
        let base = (mean_t - per_token * mean_n).max(0.0);
        Some((base, per_token))
    }
}

#[derive(Clone, Copy)]
struct Guessing {
    id: SeqId,
    /// The most guesses it may make this round.
    max: usize,
}

/// Why a round of drafts was dropped; the step goes on without them.
#[derive(Debug, thiserror::Error)]
#[error("draft model: {0}")]
pub(crate) struct DraftFailure(String);

impl DraftModel {
    pub fn new(
        model: Box<dyn Model>,
        target_vocab: usize,
        max_batch_tokens: usize,
        cost_aware: bool,
    ) -> Self {
        let blocks = BlockManager::new(model.num_blocks(), model.block_size());
        Self {
            batch: StepBatch::new(model.block_size()),
            samples_rows: model.samples_rows(),
            draft_forward: None,
            target_steps: StepTimeFit::default(),
            model,
            blocks,
            seqs: HashMap::new(),
            target_vocab,
            max_batch_tokens: max_batch_tokens.max(1),
            cost_aware,
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
        // Until a draft forward and a target step have been timed: as many guesses as allowed.
        let costs = self
            .draft_forward
            .zip(self.target_steps.line())
            .filter(|_| self.cost_aware);
        let others = self.candidates.len() - 1;
        for c in &self.candidates {
            let Some(tokens) = scheduler.get(c.id).map(|s| s.tokens()) else {
                continue;
            };
            let seq = self.seqs.entry(c.id).or_default();
            seq.score_last_round(tokens);
            seq.drafts.clear();
            // Tokens the draft cache lacks, at least.
            let lag = tokens
                .len()
                .saturating_sub(seq.confirmed + seq.guessed.len());
            let wanted = match costs {
                None => c.max,
                Some((draft, (base, per_token))) => {
                    let step = |n: usize| base + per_token * n as f64;
                    match best_guess_count(c.max, seq.acceptance(), others, draft, step) {
                        // Its guesses do not pay; a probe may find they do now, unless even
                        // certain ones would not (the steps' times alone can change that), or
                        // its draft cache lags so far behind (a long prompt never drafted)
                        // that catching up would cost more than a probe can tell.
                        0 if seq.idle_rounds + 1 >= PROBE_EVERY
                            && lag <= 2 * PROBE_EVERY as usize
                            && best_guess_count(c.max, CERTAIN, others, draft, step) > 0 =>
                        {
                            1
                        }
                        k => k,
                    }
                }
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
            self.row_owners.push(c.id);
            self.guessing.push(Guessing { id: c.id, max });
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
                seq.confirmed = seq.round_len;
            }
        }
        // Each further forward computes every still-guessing sequence's latest guess.
        for round in 1.. {
            self.batch.clear();
            self.row_owners.clear();
            for g in &self.guessing {
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
                let position = seq.round_len + round - 1;
                self.batch
                    .push_sequence_rows(&[last], position, seq.table.blocks(), 1);
                self.row_owners.push(g.id);
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
        // What a guess costs is a decode's time: a forward that also caught a sequence up on
        // a prompt would make every later guess look dear.
        if self.batch.num_tokens() <= 2 * rows.max(1) {
            average(&mut self.draft_forward, start.elapsed());
        }
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
        for (row, id) in self.row_owners.iter().enumerate() {
            let token = if self.samples_rows {
                self.output.sampled[row].token
            } else {
                argmax(&self.output.logits[row * vocab..(row + 1) * vocab])
            };
            if (token as usize) < self.target_vocab {
                let seq = self
                    .seqs
                    .get_mut(id)
                    .expect("a guessing sequence has a record");
                seq.drafts.push(token);
            }
        }
        Ok(())
    }

    /// The target's forward of a step of `tokens` tokens took `elapsed`.
    pub fn observe_target_step(&mut self, tokens: usize, elapsed: Duration) {
        if tokens <= FIT_MAX_TOKENS {
            self.target_steps.observe(tokens, elapsed);
        }
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
        // A memory-bound target (a row more costs 1% of a step) and a draft at 0.3 of a step.
        let flat = |n: usize| 1.0 + 0.01 * n as f64;
        // Free guesses: as many as allowed.
        assert_eq!(best_guess_count(8, 0.5, 0, 0.0, |_| 1.0), 8);
        // Good guesses pay a few, poor ones none.
        let k = best_guess_count(8, 0.9, 0, 0.3, flat);
        assert!((3..=6).contains(&k), "{k}");
        assert_eq!(best_guess_count(8, 0.2, 0, 0.3, flat), 0);
        // A gain of under 10% is not worth the model's error: one guess true 40% of the time
        // at 0.3 of a step would gain 8%.
        assert!((speedup(1, 0.4, 0, 0.3, |_| 1.0) - 1.4 / 1.3).abs() < 1e-12);
        assert_eq!(best_guess_count(8, 0.4, 0, 0.3, |_| 1.0), 0);
        // More acceptance, more guesses.
        assert!(best_guess_count(16, 0.95, 0, 0.1, flat) > best_guess_count(16, 0.8, 0, 0.1, flat));
        // A target whose step grows by a third of a decode per row (a 1.5B model on two CPU
        // cores) with a draft at half a decode: good guesses do not pay.
        let steep = |n: usize| 0.67 + 0.33 * n as f64;
        assert_eq!(best_guess_count(8, 0.8, 0, 0.5, steep), 0);
        // Other sequences in the step share its cost: guesses pay less in a crowd.
        assert!(best_guess_count(8, 0.9, 3, 0.3, flat) <= best_guess_count(8, 0.9, 0, 0.3, flat));
        assert!((speedup(2, 0.5, 0, 0.0, |_| 1.0) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn the_step_time_line_is_fitted_or_proportional_until_it_can_be() {
        let mut fit = StepTimeFit::default();
        assert_eq!(fit.line(), None);
        let ms = |m: f64| Duration::from_secs_f64(m / 1e3);
        fit.observe(9, ms(120.0));
        let (base, per) = fit.line().unwrap();
        assert_eq!(base, 0.0);
        assert!((per - 0.12 / 9.0).abs() < 1e-9);
        for _ in 0..20 {
            fit.observe(1, ms(33.0));
            fit.observe(5, ms(77.0));
            fit.observe(9, ms(121.0));
        }
        let (base, per) = fit.line().unwrap();
        assert!((per - 0.011).abs() < 1e-4, "{per}");
        assert!((base - 0.022).abs() < 1e-3, "{base}");
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
