//! [`PagedLlama`]: a model with the paged KV cache it owns, sized from a memory budget, whose
//! forward writes the sampling rows' logits into a reused buffer. This is what the engine's
//! step loop drives (through its `Model` trait).

use candle_core::{Device, Storage, Tensor};

use crate::batch::{StepBatch, StepOutput};
use crate::cpu_forward::StepScratch;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::model::LlamaModel;

/// The real model and its KV cache.
pub struct PagedLlama {
    model: LlamaModel,
    kv: KvCache,
    /// The CPU step's buffers, reused from step to step.
    scratch: StepScratch,
}

impl PagedLlama {
    /// A cache of `num_blocks` blocks of `block_size` tokens.
    pub fn new(model: LlamaModel, num_blocks: usize, block_size: usize) -> Result<Self> {
        let kv = model.new_kv_cache(num_blocks, block_size)?;
        Ok(Self {
            model,
            kv,
            scratch: StepScratch::default(),
        })
    }

    /// As many blocks as fit in `kv_cache_bytes` (K and V of every layer, in the model's KV
    /// element type).
    pub fn with_memory_budget(
        model: LlamaModel,
        kv_cache_bytes: usize,
        block_size: usize,
    ) -> Result<Self> {
        let num_blocks = model.kv_blocks_for_budget(kv_cache_bytes, block_size);
        if num_blocks == 0 {
            let block_bytes = model.kv_dtype().bytes_per_token(model.config()) * block_size;
            return Err(ModelError::KvCacheBudget {
                budget_bytes: kv_cache_bytes,
                block_size,
                block_bytes,
            });
        }
        Self::new(model, num_blocks, block_size)
    }

    pub fn model(&self) -> &LlamaModel {
        &self.model
    }

    pub fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    pub fn max_model_len(&self) -> usize {
        self.model.config().max_position_embeddings
    }

    pub fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    pub fn num_blocks(&self) -> usize {
        self.kv.num_blocks()
    }

    pub fn hidden_size(&self) -> usize {
        self.model.config().hidden_size
    }

    /// Computes every token of `batch`, writing their K/V into the cache, and replaces
    /// `out.logits` with the `[batch.logits_indices.len(), vocab_size]` logits of the sampling
    /// rows and `out.hidden` with the `[batch.hidden_indices.len(), hidden_size]` final hidden
    /// states of the pooled rows, row-major.
    pub fn forward(&mut self, batch: &StepBatch, out: &mut StepOutput) -> Result<()> {
        let (logits, hidden) =
            self.model
                .forward_step_in(batch, &mut self.kv, &mut self.scratch)?;
        copy_rows(&logits, &mut out.logits)?;
        match hidden {
            Some(hidden) => copy_rows(&hidden, &mut out.hidden),
            None => {
                out.hidden.clear();
                Ok(())
            }
        }
    }
}

/// Copies an f32 tensor into `out` (cleared first), straight from CPU storage when it can:
/// `to_vec` would allocate a fresh vector of rows x vocab floats every step.
fn copy_rows(t: &Tensor, out: &mut Vec<f32>) -> Result<()> {
    out.clear();
    if !t.device().is_cpu() {
        let cpu = t.to_device(&Device::Cpu)?;
        return copy_rows(&cpu, out);
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(ModelError::NotOnCpu("a step's output"));
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
