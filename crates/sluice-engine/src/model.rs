//! What the engine needs from a model: one batched forward over a [`StepBatch`] into a logits
//! buffer, and its limits. [`PagedLlama`] is the real thing (a [`LlamaModel`] with the KV
//! cache it owns); `testing::MockModel` (feature `testing`) implements the same trait without
//! weights.

use candle_core::{Device, Storage, Tensor};
use sluice_model::{KvCache, LlamaModel, ModelError, StepBatch};

/// A forward that did not produce logits. The engine fails the requests of that step and
/// keeps serving.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("model forward failed: {message}")]
pub struct ModelFailure {
    pub message: String,
}

impl ModelFailure {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl From<ModelError> for ModelFailure {
    fn from(e: ModelError) -> Self {
        Self::new(e.to_string())
    }
}

impl From<candle_core::Error> for ModelFailure {
    fn from(e: candle_core::Error) -> Self {
        Self::new(e.to_string())
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

/// The real model and its KV cache.
pub struct PagedLlama {
    model: LlamaModel,
    kv: KvCache,
}

impl PagedLlama {
    /// A cache of `num_blocks` blocks of `block_size` tokens.
    pub fn new(
        model: LlamaModel,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, ModelError> {
        let kv = model.new_kv_cache(num_blocks, block_size)?;
        Ok(Self { model, kv })
    }

    /// As many blocks as fit in `kv_cache_bytes` (K and V of every layer, in the model's KV
    /// element type).
    pub fn with_memory_budget(
        model: LlamaModel,
        kv_cache_bytes: usize,
        block_size: usize,
    ) -> Result<Self, ModelError> {
        let num_blocks = model.kv_blocks_for_budget(kv_cache_bytes, block_size);
        if num_blocks == 0 {
            let per_block = model
                .config()
                .kv_bytes_per_token(model.kv_dtype().size_in_bytes())
                * block_size;
            return Err(ModelError::InvalidBatch(format!(
                "a KV cache budget of {kv_cache_bytes} bytes holds no block: one block of \
                 {block_size} tokens takes {per_block} bytes"
            )));
        }
        Self::new(model, num_blocks, block_size)
    }

    pub fn model(&self) -> &LlamaModel {
        &self.model
    }
}

impl Model for PagedLlama {
    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn max_model_len(&self) -> usize {
        self.model.config().max_position_embeddings
    }

    fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    fn num_blocks(&self) -> usize {
        self.kv.num_blocks()
    }

    fn forward(&mut self, batch: &StepBatch, logits: &mut Vec<f32>) -> Result<(), ModelFailure> {
        let out = self.model.forward(batch, &mut self.kv)?;
        copy_logits(&out, logits)
    }
}

/// Copies an f32 tensor into `out` (cleared first), straight from CPU storage when it can:
/// `to_vec` would allocate a fresh vector of rows x vocab floats every step.
fn copy_logits(t: &Tensor, out: &mut Vec<f32>) -> Result<(), ModelFailure> {
    out.clear();
    if !t.device().is_cpu() {
        let cpu = t.to_device(&Device::Cpu)?;
        return copy_logits(&cpu, out);
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(ModelFailure::new("logits are not in CPU memory"));
    };
    let data = cpu.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => out.extend_from_slice(&data[start..end]),
        None => {
            drop(storage);
            out.extend(t.flatten_all()?.to_vec1::<f32>()?);
        }
    }
    Ok(())
}
