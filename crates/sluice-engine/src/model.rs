//! What the engine needs from a model: one batched forward over a [`StepBatch`] into a logits
//! buffer, and its limits. [`PagedLlama`] (sluice-model: a `LlamaModel` with the KV cache it
//! owns) is the real thing; `testing::MockModel` (feature `testing`) implements the same trait without
//! weights.

use sluice_model::{ModelError, PagedLlama, StepBatch};

/// A forward that did not produce logits. The engine fails the requests of that step and
/// keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum ModelFailure {
    #[error("model forward failed: {0}")]
    Model(#[from] ModelError),
    /// A failure of a model that has no [`ModelError`] to give (the mock's).
    #[error("model forward failed: {0}")]
    Other(String),
}

impl ModelFailure {
    pub fn new(message: impl Into<String>) -> Self {
        Self::Other(message.into())
    }
}

/// A model with its own paged KV cache, driven by the engine thread.
pub trait Model: Send {
    /// Entries per logits row.
    fn vocab_size(&self) -> usize;
    /// Longest sequence (prompt + generated) the model accepts.
    fn max_model_len(&self) -> usize;
    /// Tokens per KV-cache block.
    fn block_size(&self) -> usize;
    /// Blocks in the KV cache.
    fn num_blocks(&self) -> usize;
    /// Computes every token of `batch`, writing their K/V into the cache, and replaces `logits`
    /// with the `[batch.logits_indices.len(), vocab_size]` logits of the sampling rows,
    /// row-major, in `logits_indices` order.
    fn forward(&mut self, batch: &StepBatch, logits: &mut Vec<f32>) -> Result<(), ModelFailure>;
}

impl Model for PagedLlama {
    fn vocab_size(&self) -> usize {
        PagedLlama::vocab_size(self)
    }

    fn max_model_len(&self) -> usize {
        PagedLlama::max_model_len(self)
    }

    fn block_size(&self) -> usize {
        PagedLlama::block_size(self)
    }

    fn num_blocks(&self) -> usize {
        PagedLlama::num_blocks(self)
    }

    fn forward(&mut self, batch: &StepBatch, logits: &mut Vec<f32>) -> Result<(), ModelFailure> {
        Ok(PagedLlama::forward(self, batch, logits)?)
    }
}
