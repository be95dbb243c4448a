//! Decides, once per step, which tokens of which sequences the next forward computes. vLLM-V1
//! style: a per-step token budget and a cap on running sequences; running sequences go first
//! (one decode token each, or their next prefill chunk), then waiting ones are admitted in
//! arrival order while blocks and budget last. Prompts longer than what is left of the budget
//! are prefilled in chunks over several steps, in the same batches as other sequences' decodes.
//!
//! When a running sequence needs a block and none is free, the newest running sequence is
//! preempted by recompute: its blocks are freed, it keeps its tokens, and it returns to the head
//! of the waiting queue (its full blocks usually stay in the prefix cache, so re-prefilling it is
//! mostly cache hits). Admission guarantees that every sequence fits the pool alone, and the
//! oldest running sequence can always take the blocks of newer ones, so everything admitted
//! eventually completes.
//!
//! `n > 1`: the request's sequences share the full blocks of the prompt through the prefix
//! cache. Sequence 0 goes first; the others stay at the head of the waiting queue (admission
//! stays strictly first-come first-served, so this holds back later requests for the few steps
//! of that prefill) until it has computed those blocks, then find them cached and take them by
//! reference. Each recomputes the prompt's partial last block on its own, which is
//! at most `block_size` tokens, so no block is ever written by two sequences and no
//! copy-on-write is needed.
//!
//! Speculation ([`SchedulerConfig::speculation`]): a running sequence the engine allowed to
//! speculate ([`Scheduler::allow_speculation`]) may, in a step of few sequences, put tokens
//! guessed by n-gram lookup ([`crate::speculation`]), or handed over by the engine's draft
//! model ([`Scheduler::draft_candidates`], [`Scheduler::set_proposal`]), after its last
//! token; the step computes
//! them all and returns a sampling row for each position. [`Scheduler::commit`] keeps the
//! drafts up to the first that differs from its row's sampled token, then that token, and
//! takes the rest back as if never computed (their slots are rewritten later; the prefix cache
//! only ever registers kept tokens). Drafts never preempt: a sequence drafts only when its
//! blocks can grow for them from the free pool.
//!
//! Each request and each sequence carries its user's record (`R` and `S`: the engine loop's
//! request and sequence state; `()` when the scheduler runs alone, as in its tests), kept with
//! the scheduler's own and handed back when the sequence leaves, so a sequence is one record
//! in one place. The scheduler never looks inside them.
//!
//! Protocol, per step: [`Scheduler::schedule`], [`Scheduler::fill_step_batch`], the forward and
//! sampling, then [`Scheduler::commit`] with one token per sampling row. Between `commit` and the
//! next `schedule` the engine calls [`Scheduler::finish`] for sequences that are done (EOS, stop,
//! `max_tokens`, ...). `finish` and [`Scheduler::abort`] may also be called between `fill_step_batch`
//! and `commit`; the sequence's part of the step is then dropped.
//!
//! LoRA adapters ([`SchedulerConfig::max_loras`]): the model holds that many adapters at once,
//! in slots. A waiting sequence with an adapter is admitted when its adapter is in a slot, or
//! a slot is free of running sequences (the adapter then goes there:
//! [`SchedulerOutput::adapter_loads`] tells the engine to load it before the forward).
//! Otherwise it waits, and admission goes on with the sequences behind it: an adapter never
//! evicts one that running sequences use, and a step holds at most `max_loras` adapters.
//!
//! Its parts: this module holds the types, queueing, and the step's core (`schedule`,
//! `fill_step_batch`, `commit`); speculation's drafting, which feeds the core's plan, is in
//! `drafting`; sequences and requests leaving, their records, counts and invariants in
//! `records`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use sluice_model::{GroupTables, StepBatch};

use crate::block_manager::AdapterKey;
use crate::block_pools::{BlockPools, Holding, KvGroupSpec, RecurrentPool, WindowPool};
use crate::images::ImageSpan;
use crate::sequence::{RequestId, SeqId, Sequence, SequenceStatus};
use crate::speculation::{next_draft_len, SpeculationConfig};

mod drafting;
mod records;

pub use drafting::DraftCandidate;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences running (holding blocks, scheduled each step) at once.
    pub max_num_seqs: usize,
    /// Most tokens computed by one step's forward, prefill and decode together.
    pub max_num_batched_tokens: usize,
    /// Tokens per KV-cache block.
    pub block_size: usize,
    /// Blocks in the KV cache.
    pub num_blocks: usize,
    /// Longest sequence (prompt + generated) the model accepts.
    pub max_model_len: usize,
    /// Speculative decoding by n-gram lookup; `None`: off.
    pub speculation: Option<SpeculationConfig>,
    /// The model's layer groups beside its full-attention layers, each with its own pool
    /// (`crate::block_pools`): sliding-window layers, recurrent layers.
    pub kv_groups: Vec<KvGroupSpec>,
    /// LoRA adapters the model holds at once (its slots 1 to `max_loras`); 0: none.
    pub max_loras: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            block_size: 16,
            num_blocks: 4096,
            max_model_len: 4096,
            speculation: None,
            kv_groups: Vec::new(),
            max_loras: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    #[error("invalid scheduler configuration: {0}")]
    InvalidConfig(String),
    #[error("commit got {got} sampled tokens for {expected} sampling rows")]
    SampleCountMismatch { got: usize, expected: usize },
    #[error("commit without a scheduled step")]
    NothingScheduled,
}

/// One sequence's part of a step: tokens `start..start + len` of its known tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub seq_id: SeqId,
    /// Tokens already in the cache, which is also the position of the first computed token.
    pub start: usize,
    /// Tokens computed this step (a prefill chunk, or 1 when decoding).
    pub len: usize,
    /// The chunk reaches the end of the known tokens, so the sequence gets a new token this
    /// step; sampling rows are those of the scheduled sequences with `sample` set, in order.
    pub sample: bool,
    /// Draft tokens at the chunk's end (speculation): the entry has a sampling row for its
    /// last known token and one for each draft.
    pub draft: usize,
    /// After [`Scheduler::commit`]: how many of its sampling rows' tokens the sequence kept,
    /// from the first (the drafts that matched, then the token after them). Zero before.
    pub accepted: usize,
    /// After [`Scheduler::commit`]: the last kept token was the sequence's `max_tokens`-th, the
    /// last it may generate.
    pub reached_length: bool,
    slot: usize,
    serial: u64,
}

impl ScheduledSeq {
    /// Its sampling rows: none, or one plus one per draft.
    pub fn num_rows(&self) -> usize {
        if self.sample {
            1 + self.draft
        } else {
            0
        }
    }
}

/// What one step computes. Reused across steps.
#[derive(Debug, Default)]
pub struct SchedulerOutput {
    scheduled: Vec<ScheduledSeq>,
    preempted: Vec<SeqId>,
    adapter_loads: Vec<(u16, SeqId)>,
    num_tokens: usize,
    num_samples: usize,
}

impl SchedulerOutput {
    /// In batch order: the running sequences first, oldest first, then newly admitted ones.
    pub fn scheduled(&self) -> &[ScheduledSeq] {
        &self.scheduled
    }

    /// The scheduled sequences that get a token this step, in order; each has
    /// [`ScheduledSeq::num_rows`] sampling rows.
    pub fn sampling(&self) -> impl Iterator<Item = &ScheduledSeq> {
        self.scheduled.iter().filter(|s| s.sample)
    }

    /// Sequences preempted (sent back to the waiting queue) while planning this step.
    pub fn preempted(&self) -> &[SeqId] {
        &self.preempted
    }

    /// Adapters this step puts in a model slot, each named by a sequence admitted with it:
    /// the engine loads that sequence's adapter into the slot before the forward.
    pub fn adapter_loads(&self) -> &[(u16, SeqId)] {
        &self.adapter_loads
    }

    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    pub fn num_samples(&self) -> usize {
        self.num_samples
    }

    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }

    fn clear(&mut self) {
        self.scheduled.clear();
        self.preempted.clear();
        self.adapter_loads.clear();
        self.num_tokens = 0;
        self.num_samples = 0;
    }

    fn push<S>(&mut self, seq: &Sequence<S>, slot: usize, len: usize) {
        let sample = !seq.is_prefill_only() && seq.num_computed + len == seq.tokens.len();
        let entry = ScheduledSeq {
            seq_id: seq.id(),
            start: seq.num_computed,
            len,
            sample,
            draft: seq.num_draft,
            accepted: 0,
            reached_length: false,
            slot,
            serial: seq.serial,
        };
        self.num_tokens += len;
        self.num_samples += entry.num_rows();
        self.scheduled.push(entry);
    }
}

#[derive(Debug)]
struct RequestEntry<R> {
    n: u32,
    live: u32,
    state: R,
}

/// A sequence [`Scheduler::finish`] removed: its record, and its request's when it was the
/// request's last sequence.
#[derive(Debug)]
pub struct Removed<R, S> {
    pub state: S,
    pub request: Option<R>,
}

/// A request [`Scheduler::abort`] removed: its record, and its sequences that were still
/// there (index and record).
#[derive(Debug)]
pub struct Aborted<R, S> {
    pub state: R,
    pub sequences: Vec<(u32, S)>,
}

/// One of the model's adapter slots, as the scheduler fills it.
#[derive(Debug, Clone, Copy, Default)]
struct AdapterSlot {
    /// The adapter in it ([`AdapterKey::id`]); 0: none yet.
    lora: u64,
    /// Running sequences that use it: it may take another adapter only at 0.
    running: usize,
    /// The step it last admitted a sequence: the free slot unused longest is refilled first.
    last_used: u64,
}

#[derive(Debug)]
pub struct Scheduler<R = (), S = ()> {
    config: SchedulerConfig,
    blocks: BlockPools,
    /// Sequence storage; indices ("slots") are stable while a sequence lives.
    slots: Vec<Option<Sequence<S>>>,
    free_slots: Vec<usize>,
    ids: HashMap<SeqId, usize>,
    requests: HashMap<RequestId, RequestEntry<R>>,
    /// Oldest admission first; the last one is the next to be preempted.
    running: Vec<usize>,
    waiting: VecDeque<usize>,
    output: SchedulerOutput,
    awaiting_commit: bool,
    num_preemptions: u64,
    next_serial: u64,
    /// The drafts being proposed for one sequence; reused.
    draft: Vec<u32>,
    /// The model's adapter slots, `config.max_loras` of them (slot `i + 1` at index `i`).
    adapter_slots: Vec<AdapterSlot>,
    /// Steps planned, to order the adapter slots' use.
    steps: u64,
}

/// The scheduler alone, with nothing kept beside its own records (tests, benches).
impl Scheduler {
    /// [`Scheduler::queue_request`] without records.
    pub fn add_request(
        &mut self,
        request: RequestId,
        prompt: Vec<u32>,
        max_tokens: usize,
        n: usize,
    ) {
        self.queue_request(request, prompt, max_tokens, (), vec![(); n]);
    }

    /// [`Scheduler::queue_prefill_only`] without records.
    pub fn add_prefill_only(&mut self, request: RequestId, prompt: Vec<u32>) {
        self.queue_prefill_only(request, prompt, (), ());
    }
}

impl<R, S> Scheduler<R, S> {
    pub fn new(config: SchedulerConfig) -> Result<Self, SchedulerError> {
        let invalid = |what: &str| Err(SchedulerError::InvalidConfig(what.to_string()));
        if config.max_num_seqs == 0 {
            return invalid("max_num_seqs must be at least 1");
        }
        if config.max_num_batched_tokens == 0 {
            return invalid("max_num_batched_tokens must be at least 1");
        }
        if config.block_size == 0 {
            return invalid("block_size must be at least 1");
        }
        if config.num_blocks == 0 || config.num_blocks >= u32::MAX as usize {
            return invalid("num_blocks must be between 1 and u32::MAX - 1");
        }
        if config.max_loras > usize::from(u16::MAX) - 1 {
            return invalid("max_loras must fit the model's u16 adapter slots");
        }
        if config.max_model_len < 2 {
            return invalid("max_model_len must be at least 2 (one prompt token, one generated)");
        }
        if config.kv_groups.len() > crate::block_pools::MAX_GROUPS {
            return invalid("too many layer groups");
        }
        for group in &config.kv_groups {
            let w = match *group {
                KvGroupSpec::SlidingWindow(w) => w,
                KvGroupSpec::Recurrent(r) => {
                    if r.num_states == 0 || r.num_states >= u32::MAX as usize {
                        return invalid("a recurrent pool needs between 1 and u32::MAX - 1 states");
                    }
                    if config.speculation.is_some() && r.num_states < 2 {
                        return invalid(
                            "speculation on a model with recurrent layers needs at least 2 \
                             states: each running sequence holds a second to roll drafts back",
                        );
                    }
                    continue;
                }
            };
            // A sequence alone must always fit, or admission could promise what never runs.
            let one = WindowPool::blocks_for_one(
                w.window.max(1),
                config.max_num_batched_tokens,
                config.block_size,
            )
            .min(config.num_blocks);
            if w.window == 0 || w.num_blocks < one || w.num_blocks >= u32::MAX as usize {
                return invalid(&format!(
                    "a sliding-window pool needs a window of at least 1 token and at least {one} blocks (got {} blocks, window {})",
                    w.num_blocks, w.window
                ));
            }
        }
        // A recurrent pool's states beyond the running sequences' keep prefix checkpoints;
        // with speculation each running sequence holds two (one to roll rejected drafts back).
        let pools: Vec<KvGroupSpec> = config
            .kv_groups
            .iter()
            .map(|g| match *g {
                KvGroupSpec::Recurrent(r) => KvGroupSpec::Recurrent(RecurrentPool::split(
                    r.num_states,
                    config.max_num_seqs,
                    config.speculation.is_some(),
                )),
                other => other,
            })
            .collect();
        Ok(Self {
            blocks: BlockPools::new(config.num_blocks, config.block_size, &pools),
            slots: Vec::new(),
            free_slots: Vec::new(),
            ids: HashMap::new(),
            requests: HashMap::new(),
            running: Vec::with_capacity(config.max_num_seqs),
            waiting: VecDeque::new(),
            output: SchedulerOutput {
                scheduled: Vec::with_capacity(config.max_num_seqs),
                ..SchedulerOutput::default()
            },
            awaiting_commit: false,
            num_preemptions: 0,
            next_serial: 0,
            draft: Vec::new(),
            adapter_slots: vec![AdapterSlot::default(); config.max_loras],
            steps: 0,
            config,
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Queues a request of `n = seqs.len()` sequences `SeqId { request, index: 0..n }`, each
    /// generating up to `max_tokens` tokens after `prompt`; `state` and `seqs` are kept with
    /// the request and its sequences.
    ///
    /// Precondition (what [`crate::ValidRequest`] guarantees, checked there once): a non-empty
    /// prompt, `1 <= n <= u32::MAX`, `max_tokens >= 1`, and `prompt + max_tokens` within both
    /// `max_model_len` and the whole cache, so the request can always run; and a request id
    /// not already queued. The queue's bound is the caller's (the engine handle answers 429
    /// before anything reaches the engine thread): preempted sequences re-enter the queue
    /// whatever its length, so a bound here could refuse what the handle already accepted.
    pub fn queue_request(
        &mut self,
        request: RequestId,
        prompt: Vec<u32>,
        max_tokens: usize,
        state: R,
        seqs: Vec<S>,
    ) {
        self.add_sequences(request, prompt, max_tokens, state, seqs, false);
    }

    /// Queues a request whose one sequence only computes `prompt` (an embedding): it is
    /// scheduled in chunks like any prefill, never samples (no sampling row), and is done once
    /// its prompt is computed; the engine then finishes it, which frees its blocks.
    ///
    /// It does not look its prompt up in the prefix cache: an embedding pools the hidden
    /// states of its tokens (all of them, for mean pooling), which only computing them gives,
    /// and so its vector never depends on what other requests left cached. Its full blocks
    /// are registered like any other, so a generation with the same prefix may reuse them.
    ///
    /// Precondition (what [`crate::ValidRequest::embedding`] guarantees): a non-empty prompt
    /// within `max_model_len` and the whole cache.
    pub fn queue_prefill_only(&mut self, request: RequestId, prompt: Vec<u32>, state: R, seq: S) {
        debug_assert!(
            prompt.len() <= self.config.max_model_len
                && self.blocks.blocks_for(prompt.len()) <= self.blocks.num_blocks(),
            "a prompt that can never be computed"
        );
        self.add_sequences(request, prompt, 0, state, vec![seq], true);
    }

    /// Runs every sequence of a request just queued with `adapter` (a LoRA adapter): they are
    /// admitted only while it is in one of the model's slots (or one is free for it), their
    /// rows name that slot, and their blocks are keyed under it in the prefix cache.
    ///
    /// Precondition (the engine's limits guarantee it): `max_loras > 0`.
    ///
    /// # Panics
    /// If the request is not waiting, untouched, in the queue.
    /// Marks where the images of a queued request's prompt are (sorted, disjoint), so that no
    /// prefill chunk of its sequences ends inside one ([`crate::images`]).
    pub fn set_images(&mut self, request: RequestId, spans: &[ImageSpan]) {
        let spans: Arc<[ImageSpan]> = spans.into();
        let n = self.requests.get(&request).map_or(0, |r| r.n);
        for index in 0..n {
            if let Some(&slot) = self.ids.get(&SeqId::new(request, index)) {
                self.slots[slot].as_mut().expect("live slot").images = spans.clone();
            }
        }
    }

    pub fn assign_adapter(&mut self, request: RequestId, adapter: AdapterKey) {
        debug_assert!(
            self.config.max_loras > 0,
            "an adapter without adapter slots"
        );
        let n = self.requests.get(&request).map_or(0, |r| r.n);
        for index in 0..n {
            let Some(&slot) = self.ids.get(&SeqId::new(request, index)) else {
                continue;
            };
            let seq = self.slots[slot].as_mut().expect("live slot");
            assert_eq!(
                seq.status,
                SequenceStatus::Waiting,
                "an adapter set on a running sequence"
            );
            seq.lora = adapter.id;
            seq.blocks.set_adapter(Some(adapter.clone()));
        }
    }

    /// The model's adapter slots: for each (1 and up), the adapter in it ([`AdapterKey::id`],
    /// 0 for none) and how many running sequences use it.
    pub fn adapter_slots(&self) -> impl Iterator<Item = (u16, u64, usize)> + '_ {
        self.adapter_slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i as u16 + 1, s.lora, s.running))
    }

    /// The names of the adapters running sequences use, and of those waiting sequences ask
    /// for, each sorted without repeats (both vectors are cleared first).
    pub fn adapters_in_use(
        &self,
        running: &mut Vec<std::sync::Arc<str>>,
        waiting: &mut Vec<std::sync::Arc<str>>,
    ) {
        running.clear();
        waiting.clear();
        if self.config.max_loras == 0 {
            return;
        }
        for &slot in &self.running {
            if let Some(a) = self.slots[slot].as_ref().and_then(|s| s.adapter()) {
                running.push(a.name.clone());
            }
        }
        for &slot in &self.waiting {
            if let Some(a) = self.slots[slot].as_ref().and_then(|s| s.adapter()) {
                waiting.push(a.name.clone());
            }
        }
        for names in [running, waiting] {
            names.sort_unstable();
            names.dedup();
        }
    }

    /// The adapter slot a waiting sequence with adapter `lora` would run in: the one holding
    /// it, else the free slot (no running sequence) unused longest; `None` when every slot
    /// holds another adapter that running sequences use. 0 for the base model.
    fn adapter_slot_for(&self, lora: u64) -> Option<u16> {
        if lora == 0 {
            return Some(0);
        }
        if let Some(i) = self.adapter_slots.iter().position(|s| s.lora == lora) {
            return Some(i as u16 + 1);
        }
        self.adapter_slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.running == 0)
            .min_by_key(|(_, s)| (s.lora != 0, s.last_used))
            .map(|(i, _)| i as u16 + 1)
    }

    /// A running sequence leaves its adapter slot (preempted, finished or aborted).
    fn leave_adapter_slot(&mut self, slot: usize) {
        let seq = self.slots[slot].as_mut().expect("live slot");
        if seq.lora_slot > 0 {
            self.adapter_slots[usize::from(seq.lora_slot) - 1].running -= 1;
            seq.lora_slot = 0;
        }
    }

    fn add_sequences(
        &mut self,
        request: RequestId,
        prompt: Vec<u32>,
        max_tokens: usize,
        state: R,
        seqs: Vec<S>,
        prefill_only: bool,
    ) {
        debug_assert!(!prompt.is_empty(), "empty prompt");
        debug_assert!(prefill_only || max_tokens >= 1, "max_tokens = 0");
        debug_assert!(
            prompt.len() + max_tokens <= self.config.max_model_len
                && self.blocks.blocks_for(prompt.len() + max_tokens) <= self.blocks.num_blocks(),
            "a request that can never run"
        );
        debug_assert!(
            !self.requests.contains_key(&request),
            "request {request} queued twice"
        );
        let n32 = u32::try_from(seqs.len()).expect("n fits u32 (ValidRequest bounds it)");
        debug_assert!(n32 >= 1, "n = 0");
        self.requests.insert(
            request,
            RequestEntry {
                n: n32,
                live: n32,
                state,
            },
        );
        let mut prompt = prompt;
        for (index, seq_state) in (0..n32).zip(seqs) {
            let tokens = if index + 1 == n32 {
                std::mem::take(&mut prompt)
            } else {
                prompt.clone()
            };
            let id = SeqId::new(request, index);
            let seq = Sequence::new(
                id,
                self.next_serial,
                tokens,
                max_tokens,
                prefill_only,
                seq_state,
            );
            self.next_serial += 1;
            let slot = match self.free_slots.pop() {
                Some(s) => {
                    self.slots[s] = Some(seq);
                    s
                }
                None => {
                    self.slots.push(Some(seq));
                    self.slots.len() - 1
                }
            };
            self.ids.insert(id, slot);
            self.waiting.push_back(slot);
        }
    }

    /// Plans the next step. See the module docs for the policy.
    pub fn schedule(&mut self) -> &SchedulerOutput {
        self.output.clear();
        let mut budget = self.config.max_num_batched_tokens;
        let drafting = self
            .config
            .speculation
            .filter(|c| self.running.len() <= c.max_running);

        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            let seq = self.slots[slot].as_ref().expect("running slot is live");
            // The engine finishes a sequence at max_tokens; until it does, computing more would
            // run past what admission reserved room for.
            if seq.reached_max_tokens() || seq.num_computed == seq.tokens.len() {
                i += 1;
                continue;
            }
            if let Some(config) = drafting {
                self.draft(slot, &config, budget);
            }
            let seq = self.slots[slot].as_ref().expect("running slot is live");
            let len = seq.chunk_len(seq.num_computed, budget);
            if len == 0 {
                // Its next chunk is an image that does not fit what is left of the budget: a
                // later step, with a fuller budget, takes it whole.
                i += 1;
                continue;
            }
            let needed = seq.num_computed + len;
            let scheduled = loop {
                let seq = self.slots[slot].as_mut().expect("running slot is live");
                if self.blocks.allocate(&mut seq.blocks, needed) {
                    break true;
                }
                // Victims come from the back, which this loop has not reached yet, so nothing
                // already in this step's output is ever preempted.
                let victim = self.preempt_newest();
                if victim == slot {
                    break false;
                }
            };
            if !scheduled {
                break;
            }
            let seq = self.slots[slot].as_ref().expect("running slot is live");
            self.output.push(seq, slot, len);
            budget -= len;
            i += 1;
        }

        // Admitting right after preempting would just thrash the pool.
        if self.output.preempted.is_empty() {
            self.steps += 1;
            // Index into the queue: a sequence whose adapter has no slot is passed over.
            let mut w = 0;
            while budget > 0 && self.running.len() < self.config.max_num_seqs {
                let Some(&slot) = self.waiting.get(w) else {
                    break;
                };
                if self.waits_for_leader(slot) {
                    break;
                }
                let lora = self.slots[slot]
                    .as_ref()
                    .expect("waiting slot is live")
                    .lora;
                let Some(lora_slot) = self.adapter_slot_for(lora) else {
                    w += 1;
                    continue;
                };
                let seq = self.slots[slot].as_mut().expect("waiting slot is live");
                let (start, len) = if seq.is_prefill_only() {
                    // See `add_prefill_only`: every token is computed.
                    let len = seq.tokens.len().min(budget);
                    if !self.blocks.allocate(&mut seq.blocks, len) {
                        break;
                    }
                    (0, len)
                } else {
                    let prefix = self.blocks.find_cached_prefix(&mut seq.blocks, &seq.tokens);
                    let start = prefix.num_tokens(self.config.block_size);
                    let len = seq.chunk_len(start, budget);
                    // An image that does not fit what is left waits for a fuller step; so does
                    // everything behind it (arrival order).
                    if len == 0
                        || !self
                            .blocks
                            .allocate_with_prefix(&mut seq.blocks, &prefix, start + len)
                    {
                        break;
                    }
                    self.blocks
                        .plan_checkpoint(&mut seq.blocks, &seq.tokens, start);
                    (start, len)
                };
                seq.num_computed = start;
                seq.status = SequenceStatus::Running;
                seq.lora_slot = lora_slot;
                if lora_slot > 0 {
                    let entry = &mut self.adapter_slots[usize::from(lora_slot) - 1];
                    if entry.lora != lora {
                        entry.lora = lora;
                        self.output.adapter_loads.push((lora_slot, seq.id()));
                    }
                    entry.running += 1;
                    entry.last_used = self.steps;
                }
                self.waiting.remove(w);
                self.running.push(slot);
                self.output.push(seq, slot, len);
                budget -= len;
            }
        }

        self.awaiting_commit = true;
        &self.output
    }

    /// The plan of the last [`Scheduler::schedule`].
    pub fn output(&self) -> &SchedulerOutput {
        &self.output
    }

    /// Lays the last plan out as the model's flat step input (cleared first). Call it right
    /// after `schedule`, before any `finish` or `abort`.
    ///
    /// # Panics
    /// If `batch` has another block size, or a scheduled sequence was removed since `schedule`.
    pub fn fill_step_batch(&self, batch: &mut StepBatch) {
        assert_eq!(
            batch.block_size, self.config.block_size,
            "StepBatch block size mismatch"
        );
        batch.clear();
        if batch.groups.len() != self.config.kv_groups.len() {
            // Once per engine: the groups stay, their buffers are reused.
            batch.groups = self
                .config
                .kv_groups
                .iter()
                .map(|g| match g {
                    KvGroupSpec::SlidingWindow(_) => GroupTables::paged(),
                    KvGroupSpec::Recurrent(_) => GroupTables::recurrent(),
                })
                .collect();
        }
        for s in &self.output.scheduled {
            let seq = self
                .live_scheduled(s)
                .expect("sequence removed between schedule and fill_step_batch");
            if self.config.max_loras > 0 {
                batch
                    .lora_slots
                    .extend(std::iter::repeat_n(seq.lora_slot, s.len));
            }
            batch.push_sequence_rows(
                &seq.tokens[s.start..s.start + s.len],
                s.start,
                seq.blocks.full().blocks(),
                s.num_rows(),
            );
            for (group, holding) in seq.blocks.holdings().enumerate() {
                match holding {
                    Holding::Table(table) => batch.push_group_table(group, table),
                    Holding::State(state) => {
                        let step =
                            self.blocks
                                .checkpoint_step(&seq.blocks, s.start, s.len, s.draft);
                        let save = step.save.map(|(c, n)| (c, n as u32));
                        batch.push_group_state_with(group, state, step.restore, save);
                    }
                }
            }
        }
    }

    /// Applies the step: the scheduled tokens are now in the cache (newly full blocks join the
    /// prefix cache) and each sampling row's token is appended to its sequence. `sampled` has
    /// one token per sampling row, in [`SchedulerOutput::sampling`] order.
    pub fn commit(&mut self, sampled: &[u32]) -> Result<(), SchedulerError> {
        if !self.awaiting_commit {
            return Err(SchedulerError::NothingScheduled);
        }
        if sampled.len() != self.output.num_samples {
            return Err(SchedulerError::SampleCountMismatch {
                got: sampled.len(),
                expected: self.output.num_samples,
            });
        }
        let most_drafts = self.config.speculation.map_or(1, |c| c.num_tokens);
        let mut row = 0;
        for s in &mut self.output.scheduled {
            let rows = &sampled[row..row + s.num_rows()];
            row += rows.len();
            let Some(seq) = self.slots[s.slot].as_mut() else {
                continue;
            };
            if seq.serial != s.serial || seq.status != SequenceStatus::Running {
                continue;
            }
            debug_assert_eq!(seq.num_computed, s.start);
            debug_assert_eq!(seq.num_draft, s.draft);
            // Drafts are kept while each is the token its predecessor's row sampled.
            let first_draft = seq.tokens.len() - seq.num_draft;
            let kept = seq.tokens[first_draft..]
                .iter()
                .zip(rows)
                .take_while(|(draft, sampled)| draft == sampled)
                .count();
            let rejected = seq.num_draft - kept;
            seq.tokens.truncate(first_draft + kept);
            // A recurrent state went past every draft: with one rejected it goes back to its
            // value before them, and the kept drafts are computed again (their K/V rewritten
            // with the same bits). Elsewhere the rejected drafts' K/V is just overwritten.
            let roll_back = rejected > 0 && seq.blocks.rolls_back();
            seq.num_computed = s.start + s.len - if roll_back { seq.num_draft } else { rejected };
            self.blocks
                .register_computed(&mut seq.blocks, &seq.tokens, seq.num_computed);
            if roll_back {
                self.blocks.roll_back(&mut seq.blocks);
            }
            if let Some(&token) = rows.get(kept) {
                seq.tokens.push(token);
                s.accepted = kept + 1;
            }
            if seq.num_draft > 0 {
                seq.draft_len = next_draft_len(seq.draft_len, seq.num_draft, kept, most_drafts);
                seq.num_draft = 0;
            }
            // Counted once the drafts are settled: until then they are not generated tokens.
            s.reached_length = s.accepted > 0 && seq.reached_max_tokens();
        }
        self.awaiting_commit = false;
        Ok(())
    }

    pub(super) fn live_scheduled(&self, s: &ScheduledSeq) -> Option<&Sequence<S>> {
        self.slots[s.slot]
            .as_ref()
            .filter(|seq| seq.serial == s.serial)
    }

    /// Sequences after the first of an `n > 1` request hold back while sequence 0 is running
    /// and has not yet computed the prompt's full blocks, so they can share them. Once sequence
    /// 0 is gone or waiting, they go ahead on their own (waiting on it then could deadlock).
    fn waits_for_leader(&self, slot: usize) -> bool {
        let seq = self.slots[slot].as_ref().expect("waiting slot is live");
        let id = seq.id();
        if id.index == 0 {
            return false;
        }
        let shareable = (seq.prompt_len() - 1) / self.config.block_size * self.config.block_size;
        self.get(SeqId::new(id.request, 0)).is_some_and(|leader| {
            leader.status == SequenceStatus::Running && leader.num_computed < shareable
        })
    }

    /// Preempts the newest running sequence; returns its slot.
    fn preempt_newest(&mut self) -> usize {
        let slot = self
            .running
            .pop()
            .expect("a sequence that needs blocks is running");
        self.leave_adapter_slot(slot);
        let seq = self.slots[slot].as_mut().expect("running slot is live");
        self.blocks.free(&mut seq.blocks);
        seq.num_computed = 0;
        seq.status = SequenceStatus::Waiting;
        seq.num_preemptions += 1;
        self.waiting.push_front(slot);
        self.num_preemptions += 1;
        self.output.preempted.push(seq.id());
        slot
    }
}
