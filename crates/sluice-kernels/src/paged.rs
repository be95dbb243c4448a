//! The memory layout of the paged KV cache and the varlen description of a step's sequences:
//! what every paged-attention kernel (CPU or CUDA) reads.
//!
//! Layout, per layer, chosen for the attention kernel's inner loops:
//! - K: `[num_blocks, num_kv_heads, head_dim, block_size]`. Within a block a head's keys are
//!   stored dimension-major, so the scores of a whole block are `head_dim` broadcast-FMAs over
//!   `block_size` lanes, with no horizontal sums.
//! - V: `[num_blocks, num_kv_heads, block_size, head_dim]`: a head's values in a block are one
//!   contiguous run that the weighted sum streams through.

/// Where slot/head/dim live in a cache's flat storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvLayout {
    /// Offset of the start of `(block, head)`'s run in either K or V (both runs hold
    /// `head_dim * block_size` values).
    #[inline]
    pub fn block_head_offset(&self, block: usize, head: usize) -> usize {
        (block * self.num_kv_heads + head) * self.head_dim * self.block_size
    }

    #[inline]
    pub fn k_offset(&self, slot: usize, head: usize, dim: usize) -> usize {
        let (block, off) = (slot / self.block_size, slot % self.block_size);
        self.block_head_offset(block, head) + dim * self.block_size + off
    }

    #[inline]
    pub fn v_offset(&self, slot: usize, head: usize, dim: usize) -> usize {
        let (block, off) = (slot / self.block_size, slot % self.block_size);
        self.block_head_offset(block, head) + off * self.head_dim + dim
    }

    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    pub fn values_per_layer(&self) -> usize {
        self.num_slots() * self.num_kv_heads * self.head_dim
    }
}

/// One sequence's share of a step: its query tokens in the flat token arrays and its block
/// table in the concatenated tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceSlice {
    /// Index of this sequence's first token in the flat token arrays.
    pub query_start: usize,
    /// Tokens computed for this sequence in this step (a prefill chunk, or 1 when decoding).
    pub query_len: usize,
    /// Tokens in the KV cache for this sequence once this step has written its own: the
    /// already-computed ones plus `query_len`. Queries attend to keys `0..context_len`, causally.
    pub context_len: usize,
    /// Where this sequence's block table starts in the concatenated block tables.
    pub block_table_start: usize,
    /// Number of blocks in this sequence's table (enough to hold `context_len` tokens).
    pub block_table_len: usize,
}

impl SequenceSlice {
    /// This sequence's blocks within `block_tables`, the concatenation of every table.
    pub fn block_table<'a>(&self, block_tables: &'a [u32]) -> &'a [u32] {
        &block_tables[self.block_table_start..self.block_table_start + self.block_table_len]
    }
}

/// Shapes an attention call needs beyond its buffers.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// A sliding window (Gemma's and gpt-oss's local layers, Mistral's): the query at position
    /// `p` attends to keys `p + 1 - window..=p` only. `None`: every earlier key. The CPU kernels
    /// honour it; the CUDA ones refuse a shape that has one.
    pub window: Option<usize>,
}
