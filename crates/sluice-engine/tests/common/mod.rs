//! A mock model for driving the scheduler without weights. Its K/V cache holds, per slot, a
//! hash of the token written there and of everything before it (read back through the block
//! table), and its "logits" for a sampling row fold every slot of that sequence's context. So a
//! sampled token depends on the exact contents of every block the sequence attends to: a wrong
//! block table, a wrong position, a block overwritten while shared, or a bad prefix-cache hit
//! all change the generated tokens, which [`reference_generate`] predicts without a cache.
//! With a recurrent group it also keeps each state as a real hybrid does (moved by every token
//! computed through it, started from a checkpoint, saved mid-step) and checks at every token
//! that it is the chain of the sequence's tokens so far: a state left past a rejected draft, a
//! wrong checkpoint or a wrong save fails there.
#![allow(dead_code)]

use std::collections::HashMap;

use sluice_engine::{
    EngineHandle, Event, FinishReason, KvGroupSpec, Request, RequestStream, Scheduler,
    SchedulerConfig, SeqId, WindowPool,
};
use sluice_model::{GroupTables, StepBatch};

pub const VOCAB: u32 = 1000;
/// Tokens that end a sequence early when `eos` is on.
pub const EOS_MOD: u32 = 23;
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

pub fn mix(h: u64, x: u64) -> u64 {
    let mut z = h ^ x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The hash the mock K/V holds at each position of `tokens`.
pub fn chain(tokens: &[u32]) -> Vec<u64> {
    let mut h = SEED;
    tokens
        .iter()
        .map(|&t| {
            h = mix(h, u64::from(t));
            h
        })
        .collect()
}

fn fold_context(values: impl Iterator<Item = u64>) -> u64 {
    values.fold(SEED, mix)
}

/// The sampler: per-sequence, so the `n` sequences of a request diverge.
pub fn sample(logits: u64, seq: SeqId) -> u32 {
    (mix(logits, u64::from(seq.index) + 1) % u64::from(VOCAB)) as u32
}

pub fn is_eos(token: u32) -> bool {
    token.is_multiple_of(EOS_MOD)
}

/// The token the mock model and sampler give `seq` after `tokens`, whatever else is batched.
pub fn next_token(seq: SeqId, tokens: &[u32]) -> u32 {
    sample(fold_context(chain(tokens).into_iter()), seq)
}

/// A sampler whose output repeats itself, so n-gram drafts come true: mostly a fixed function
/// of the row's last token (a cycle of 50 tokens), and one row in five [`sample`], which
/// depends on the whole context's K/V, so a wrong slot still changes the output.
pub fn sample_periodic(logits: u64, seq: SeqId, last: u32) -> u32 {
    if mix(logits, 99).is_multiple_of(5) {
        sample(logits, seq)
    } else {
        (last * 7 + 3) % 50
    }
}

/// [`next_token`] for [`sample_periodic`].
pub fn next_token_periodic(seq: SeqId, tokens: &[u32]) -> u32 {
    let last = *tokens.last().expect("a non-empty context");
    sample_periodic(fold_context(chain(tokens).into_iter()), seq, last)
}

/// What sequence `seq` generates from `prompt` when nothing else happens: the oracle.
pub fn reference_generate(seq: SeqId, prompt: &[u32], max_tokens: usize, eos: bool) -> Vec<u32> {
    reference_generate_with(next_token, seq, prompt, max_tokens, eos)
}

/// [`reference_generate`] with another sampler.
pub fn reference_generate_with(
    next: fn(SeqId, &[u32]) -> u32,
    seq: SeqId,
    prompt: &[u32],
    max_tokens: usize,
    eos: bool,
) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < max_tokens {
        let t = next(seq, &tokens);
        out.push(t);
        tokens.push(t);
        if eos && is_eos(t) {
            break;
        }
    }
    out
}

pub struct HashModel {
    block_size: usize,
    pub kv: Vec<Option<u64>>,
    /// A sliding-window layer's pool (its group's index, its window and its slots), when the
    /// scheduler has one: written through that group's tables, and checked at every read to
    /// hold what the full cache holds across each query's window.
    window: Option<(usize, usize, Vec<Option<u64>>)>,
    /// A recurrent group's states (its index and each state's value), when the scheduler has
    /// one.
    recurrent: Option<(usize, Vec<Option<u64>>)>,
}

impl HashModel {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size,
            kv: vec![None; num_blocks * block_size],
            window: None,
            recurrent: None,
        }
    }

    /// This model with a recurrent group of `num_states` states, layer group `group`.
    pub fn with_recurrent(mut self, group: usize, num_states: usize) -> Self {
        self.recurrent = Some((group, vec![None; num_states]));
        self
    }

    /// [`HashModel::new`] with a window pool of `pool.num_blocks` blocks, layer group `group`.
    pub fn with_window(
        num_blocks: usize,
        block_size: usize,
        group: usize,
        pool: WindowPool,
    ) -> Self {
        Self {
            window: Some((group, pool.window, vec![None; pool.num_blocks * block_size])),
            ..Self::new(num_blocks, block_size)
        }
    }

    fn slot(&self, table: &[u32], pos: usize) -> usize {
        table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    /// One value per logits row: a fold of every K/V slot of the row's context (its
    /// position and all before it), so it depends on the whole context as the cache holds it.
    pub fn forward(&mut self, batch: &StepBatch) -> Vec<u64> {
        let mut logits = Vec::with_capacity(batch.logits_indices.len());
        for (i, seq) in batch.sequences.iter().enumerate() {
            let table = batch.block_table(seq);
            // The sequence's recurrent state: started fresh, from a checkpoint, or where its
            // last step left it.
            let state = self.recurrent.as_mut().map(|(group, values)| {
                let GroupTables::Recurrent {
                    states,
                    restore,
                    save,
                } = &batch.groups[*group]
                else {
                    panic!("group {group} is not recurrent in the step");
                };
                let own = states[i] as usize;
                if let Some(c) = restore[i] {
                    values[own] = Some(values[c as usize].expect("a checkpoint never saved"));
                } else if seq.context_len == seq.query_len {
                    values[own] = Some(SEED);
                }
                (own, save[i])
            });
            for q in seq.query_start..seq.query_start + seq.query_len {
                let pos = batch.positions[q] as usize;
                if let Some((group, window, wkv)) = &self.window {
                    let wtable = seq.block_table(batch.tables(Some(*group)).1);
                    let wslot = |p: usize| {
                        wtable[p / self.block_size] as usize * self.block_size + p % self.block_size
                    };
                    for p in (pos + 1).saturating_sub(*window)..pos {
                        let full = self.kv[table[p / self.block_size] as usize * self.block_size
                            + p % self.block_size];
                        assert_eq!(wkv[wslot(p)], full, "window K/V at {p} of a query at {pos}");
                    }
                }
                let prev = if pos == 0 {
                    SEED
                } else {
                    self.kv[self.slot(table, pos - 1)].expect("read of a K/V slot never written")
                };
                let value = Some(mix(prev, u64::from(batch.input_ids[q])));
                if let (Some((own, save)), Some((_, values))) = (state, &mut self.recurrent) {
                    let moved = values[own].map(|v| mix(v, u64::from(batch.input_ids[q])));
                    assert_eq!(
                        moved, value,
                        "the recurrent state at position {pos} is not the chain of its tokens"
                    );
                    values[own] = moved;
                    if let Some((c, _)) = save.filter(|s| q + 1 == seq.query_start + s.1 as usize) {
                        values[c as usize] = moved;
                    }
                }
                self.kv[batch.slot_mapping[q] as usize] = value;
                if let Some((group, _, wkv)) = &mut self.window {
                    wkv[batch.tables(Some(*group)).0[q] as usize] = value;
                }
                if batch.logits_indices.contains(&(q as u32)) {
                    let ctx = (0..=pos)
                        .map(|p| self.kv[self.slot(table, p)].expect("context slot written"));
                    logits.push(fold_context(ctx));
                }
            }
        }
        logits
    }
}

/// The engine loop in miniature: schedule, one forward, sample, commit, finish.
pub struct Driver {
    pub sched: Scheduler,
    pub model: HashModel,
    pub batch: StepBatch,
    /// Generated tokens of every sequence seen, kept after it finishes.
    pub generated: HashMap<SeqId, Vec<u32>>,
    pub finished: Vec<SeqId>,
    pub eos: bool,
    /// Samples with [`sample_periodic`] instead of [`sample`].
    pub periodic: bool,
    pub steps: usize,
}

impl Driver {
    pub fn new(config: SchedulerConfig) -> Self {
        let window = config
            .kv_groups
            .iter()
            .enumerate()
            .find_map(|(i, g)| match *g {
                KvGroupSpec::SlidingWindow(pool) => Some((i, pool)),
                KvGroupSpec::Recurrent(_) => None,
            });
        let mut model = match window {
            Some((group, pool)) => {
                HashModel::with_window(config.num_blocks, config.block_size, group, pool)
            }
            None => HashModel::new(config.num_blocks, config.block_size),
        };
        if let Some((group, pool)) = config
            .kv_groups
            .iter()
            .enumerate()
            .find_map(|(i, g)| match *g {
                KvGroupSpec::Recurrent(pool) => Some((i, pool)),
                KvGroupSpec::SlidingWindow(_) => None,
            })
        {
            model = model.with_recurrent(group, pool.num_states);
        }
        let batch = StepBatch::new(config.block_size);
        Self {
            sched: Scheduler::new(config).expect("valid config"),
            model,
            batch,
            generated: HashMap::new(),
            finished: Vec::new(),
            eos: false,
            periodic: false,
            steps: 0,
        }
    }

    /// One step; returns the number of tokens computed.
    pub fn step(&mut self) -> usize {
        let num_tokens = self.sched.schedule().num_tokens();
        self.execute();
        num_tokens
    }

    /// The rest of a step after `schedule`: forward, sample, commit, finish what is done.
    /// Returns the tokens each sequence kept, in row order (a sequence that verified drafts
    /// may keep several).
    pub fn execute(&mut self) -> Vec<(SeqId, u32)> {
        self.sched.fill_step_batch(&mut self.batch);
        let logits = self.model.forward(&self.batch);
        let mut rows = logits.iter().zip(&self.batch.logits_indices);
        let mut sampled = Vec::with_capacity(logits.len());
        for s in self.sched.output().sampling() {
            for (&l, &row) in rows.by_ref().take(s.num_rows()) {
                let last = self.batch.input_ids[row as usize];
                sampled.push(match self.periodic {
                    true => sample_periodic(l, s.seq_id, last),
                    false => sample(l, s.seq_id),
                });
            }
        }
        self.sched.commit(&sampled).expect("commit");
        let mut kept = Vec::new();
        let mut done = Vec::new();
        let mut row = 0;
        for s in self.sched.output().sampling() {
            let rows = &sampled[row..row + s.num_rows()];
            row += rows.len();
            let max_tokens = self.sched.get(s.seq_id).expect("live").max_tokens();
            let generated = self.generated.entry(s.seq_id).or_default();
            for &t in &rows[..s.accepted] {
                kept.push((s.seq_id, t));
                generated.push(t);
                if generated.len() >= max_tokens || (self.eos && is_eos(t)) {
                    done.push(s.seq_id);
                    break;
                }
            }
        }
        for id in done {
            assert!(self.sched.finish(id).is_some());
            self.finished.push(id);
        }
        self.sched.check_invariants().expect("scheduler invariants");
        self.steps += 1;
        kept
    }

    pub fn run_to_completion(&mut self, max_steps: usize) {
        let start = self.steps;
        while self.sched.has_unfinished() {
            assert!(
                self.steps - start < max_steps,
                "not done after {max_steps} steps"
            );
            self.step();
        }
        assert_eq!(self.sched.num_used_blocks(), 0, "blocks leaked");
    }

    /// Request `r` (sequence `r`, prompt `prompts[r]`) generated what it generates alone:
    /// batching, preemption and the cache groups changed no token.
    pub fn assert_same_as_alone(&self, prompts: &[Vec<u32>], max_tokens: usize) {
        for (r, p) in prompts.iter().enumerate() {
            let id = SeqId::new(r as u64, 0);
            assert_eq!(
                self.generated[&id],
                reference_generate(id, p, max_tokens, self.eos),
                "request {r}"
            );
        }
    }
}

/// A deterministic pseudo-random token stream, for prompts.
pub fn tokens(seed: u64, len: usize) -> Vec<u32> {
    (0..len as u64)
        .map(|i| (mix(seed, i) % u64::from(VOCAB)) as u32)
        .collect()
}

/// Validates and submits every request before reading any, so that they share steps (the
/// requests here are valid).
pub fn submit_all(h: &EngineHandle, requests: &[Request]) -> Vec<RequestStream> {
    requests
        .iter()
        .map(|r| h.submit(h.validate(r.clone()).unwrap()).unwrap())
        .collect()
}

/// The tokens `r` generates alone on `h` (a failed finish fails the test).
pub fn generate_alone(h: &EngineHandle, r: &Request) -> Vec<u32> {
    let mut tokens = Vec::new();
    for e in h
        .submit(h.validate(r.clone()).unwrap())
        .unwrap()
        .collect_blocking()
    {
        match e {
            Event::Token(t) => tokens.push(t.token),
            Event::Finished(f) => assert_ne!(f.reason, FinishReason::Error, "{:?}", f.error),
        }
    }
    tokens
}

/// The tokens each of `rs` generates, all submitted at once on `h`.
pub fn generate_together(h: &EngineHandle, rs: &[Request]) -> Vec<Vec<u32>> {
    submit_all(h, rs)
        .into_iter()
        .map(|s| {
            s.collect_blocking()
                .into_iter()
                .filter_map(|e| match e {
                    Event::Token(t) => Some(t.token),
                    Event::Finished(_) => None,
                })
                .collect()
        })
        .collect()
}
