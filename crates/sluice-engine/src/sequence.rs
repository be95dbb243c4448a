//! One generation stream: its tokens (prompt then generated), how many of them have K/V in the
//! cache, and the blocks holding that K/V. A request with `n > 1` owns `n` sequences.

use std::fmt;
use std::sync::Arc;

use crate::block_pools::SeqBlocks;
use crate::images::ImageSpan;

/// The engine's id for a request (the server maps its own ids onto these).
pub type RequestId = u64;

/// One sequence of a request: `index` runs over `0..n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId {
    pub request: RequestId,
    pub index: u32,
}

impl SeqId {
    pub fn new(request: RequestId, index: u32) -> Self {
        Self { request, index }
    }
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.request, self.index)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceStatus {
    /// In the waiting queue, holding no blocks (new, or preempted).
    Waiting,
    /// Admitted: holds blocks for its computed tokens and is scheduled every step it can be.
    Running,
}

/// One sequence as the scheduler keeps it, with `S`, what its user keeps per sequence (the
/// engine loop's sampling and streaming state; `()` for the scheduler alone), so that a
/// sequence has one record and leaves with it.
#[derive(Debug)]
pub struct Sequence<S = ()> {
    id: SeqId,
    /// Distinguishes this sequence from any earlier one that used the same scheduler slot.
    pub(crate) serial: u64,
    pub(crate) tokens: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    pub(crate) num_computed: usize,
    pub(crate) blocks: SeqBlocks,
    pub(crate) status: SequenceStatus,
    pub(crate) num_preemptions: u32,
    /// Computes its prompt and nothing more (an embedding): never samples, never looks its
    /// prompt up in the prefix cache.
    prefill_only: bool,
    /// May draft tokens by n-gram lookup ([`crate::speculation`]); the engine allows it for
    /// sequences whose rows all sample by one fixed rule.
    pub(crate) speculative: bool,
    /// Draft tokens at the end of `tokens` for the step in flight: computed with the step and
    /// kept, or taken back, at its commit. Zero between steps.
    pub(crate) num_draft: usize,
    /// How many tokens it drafts next, adapted to how its drafts fared.
    pub(crate) draft_len: usize,
    /// The draft model's guesses for the next step ([`crate::speculation::Proposer`]),
    /// handed over before it is planned; the plan takes them (or drops them) either way.
    pub(crate) proposal: Vec<u32>,
    /// The LoRA adapter it runs with (its [`crate::AdapterKey::id`]); 0: the base model.
    pub(crate) lora: u64,
    /// While it runs with an adapter: the model's adapter slot it uses (1 and up); 0 otherwise.
    pub(crate) lora_slot: u16,
    /// Where its prompt's images are (sorted, disjoint): no prefill chunk ends inside one.
    pub(crate) images: Arc<[ImageSpan]>,
    pub(crate) state: S,
}

impl<S> Sequence<S> {
    pub(crate) fn new(
        id: SeqId,
        serial: u64,
        prompt: Vec<u32>,
        max_tokens: usize,
        prefill_only: bool,
        state: S,
    ) -> Self {
        let prompt_len = prompt.len();
        let mut tokens = prompt;
        tokens.reserve(max_tokens);
        Self {
            id,
            serial,
            tokens,
            prompt_len,
            max_tokens,
            num_computed: 0,
            blocks: SeqBlocks::default(),
            status: SequenceStatus::Waiting,
            num_preemptions: 0,
            prefill_only,
            speculative: false,
            num_draft: 0,
            draft_len: 1,
            proposal: Vec::new(),
            lora: 0,
            lora_slot: 0,
            images: Arc::from([]),
            state,
        }
    }

    /// How many of its tokens from `start` (at most `budget`) a prefill chunk computes: up to
    /// the known tokens' end, cut so that it does not end inside an image
    /// ([`crate::images::chunk_len`]); 0 when the image it starts in does not fit `budget`.
    pub(crate) fn chunk_len(&self, start: usize, budget: usize) -> usize {
        let wanted = (self.tokens.len() - start).min(budget);
        crate::images::chunk_len(&self.images, start, wanted, budget)
    }

    /// What the scheduler's user keeps for this sequence.
    pub fn state(&self) -> &S {
        &self.state
    }

    pub fn id(&self) -> SeqId {
        self.id
    }

    /// Prompt followed by every generated token (a preempted sequence keeps them all), without
    /// the drafts of a step in flight.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens[..self.num_known()]
    }

    pub fn prompt(&self) -> &[u32] {
        &self.tokens[..self.prompt_len]
    }

    pub fn generated(&self) -> &[u32] {
        &self.tokens()[self.prompt_len..]
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    pub fn num_generated(&self) -> usize {
        self.num_known() - self.prompt_len
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Leading tokens whose K/V is in the cache.
    pub fn num_computed(&self) -> usize {
        self.num_computed
    }

    pub fn status(&self) -> SequenceStatus {
        self.status
    }

    pub fn num_preemptions(&self) -> u32 {
        self.num_preemptions
    }

    /// Its full-attention block table.
    pub fn block_table(&self) -> &[u32] {
        self.blocks.full().blocks()
    }

    /// Its tables in both pools.
    pub fn blocks(&self) -> &SeqBlocks {
        &self.blocks
    }

    pub fn is_prefill_only(&self) -> bool {
        self.prefill_only
    }

    /// The LoRA adapter it runs with, if any.
    pub fn adapter(&self) -> Option<&crate::AdapterKey> {
        self.blocks.full().adapter()
    }

    /// Its tokens without the drafts of the step in flight.
    pub(crate) fn num_known(&self) -> usize {
        self.tokens.len() - self.num_draft
    }

    /// Generated all it may: a prefill-only sequence generates nothing and is done when its
    /// prompt is computed, which the scheduler tells by `num_computed` instead.
    pub(crate) fn reached_max_tokens(&self) -> bool {
        !self.prefill_only && self.num_generated() >= self.max_tokens
    }
}
