//! What the engine needs from a model: one batched forward over a [`StepBatch`] into its
//! output buffers (logits or the tokens of rows it sampled itself, and the hidden states
//! embeddings pool), and its limits. [`PagedLlama`] (sluice-model: a `LlamaModel` with the KV
//! cache it owns) is the real thing; `testing::MockModel` (feature `testing`) implements the
//! same trait without weights.

use std::sync::Arc;

use sluice_model::{CacheKind, LoraAdapter, ModelError, PagedLlama, StepBatch, StepOutput};

use crate::block_pools::{KvGroupSpec, RecurrentPool, WindowPool};
use crate::images::ImageLimits;

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
    /// Blocks in the KV cache (its full pool).
    fn num_blocks(&self) -> usize;
    /// The model's layer groups beside its full-attention layers, each with a pool of its
    /// own (`crate::block_pools`), in the order the step carries their tables
    /// (`StepBatch::groups`). None by default.
    fn kv_groups(&self) -> Vec<KvGroupSpec> {
        Vec::new()
    }
    /// Entries per hidden state (what an embedding's vector holds).
    fn hidden_size(&self) -> usize;
    /// Whether the engine should let the model sample the rows that need nothing but
    /// temperature, `top_k`, `top_p`, `min_p` and logprobs ([`StepBatch::model_sampling`]):
    /// true where that keeps full logits from crossing to the host (a GPU).
    fn samples_rows(&self) -> bool {
        false
    }
    /// Computes every token of `batch`, writing their K/V into the cache, and replaces
    /// `out.logits` with the `[rows, vocab_size]` logits of the sampling rows it does not
    /// sample itself (`None` in [`StepBatch::model_sampling`]), `out.sampled` with the tokens
    /// of those it does, and `out.hidden` with the
    /// `[batch.hidden_indices.len(), hidden_size]` final hidden states of the pooled rows,
    /// row-major, in index order.
    fn forward(&mut self, batch: &StepBatch, out: &mut StepOutput) -> Result<(), ModelFailure>;
    /// A mixture of experts: the share of its experts' weights the last forward read (experts
    /// that at least one row chose, over every layer's experts). `None` for a dense model.
    fn expert_share(&self) -> Option<f64> {
        None
    }
    /// What images the model takes (its vision tower's input); `None`, the default: text only.
    fn image_input(&self) -> Option<ImageLimits> {
        None
    }
    /// Runs the vision tower on `images` (each [`ImageLimits::pixels_per_image`] values, the
    /// model's preprocessing of one image) in one batched call, replacing `out` with their
    /// rows: `[images.len(), tokens_per_image, hidden_size]`, row-major. Each image's rows are
    /// the same bits whatever else is in the call. A text model refuses.
    fn encode_images(&mut self, images: &[&[f32]], out: &mut Vec<f32>) -> Result<(), ModelFailure> {
        let _ = out;
        Err(ModelFailure::new(format!(
            "this model takes no images ({} given)",
            images.len()
        )))
    }
    /// Puts `adapter` in LoRA slot `slot` (1 and up) for the rows of later steps that name it
    /// ([`StepBatch::lora_slots`]). A model without adapters refuses.
    fn set_adapter(
        &mut self,
        slot: u16,
        adapter: Option<Arc<LoraAdapter>>,
    ) -> Result<(), ModelFailure> {
        let _ = adapter;
        Err(ModelFailure::new(format!(
            "this model takes no LoRA adapters (slot {slot})"
        )))
    }
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

    fn kv_groups(&self) -> Vec<KvGroupSpec> {
        PagedLlama::kv_groups(self)
            .into_iter()
            .map(|(kind, num_blocks)| match kind {
                CacheKind::SlidingWindow(window) => {
                    KvGroupSpec::SlidingWindow(WindowPool { num_blocks, window })
                }
                // The scheduler sets aside the states beyond its running sequences for
                // checkpoints.
                CacheKind::Recurrent => KvGroupSpec::Recurrent(RecurrentPool {
                    num_states: num_blocks,
                    num_checkpoints: 0,
                    rollback: false,
                }),
            })
            .collect()
    }

    fn hidden_size(&self) -> usize {
        PagedLlama::hidden_size(self)
    }

    fn samples_rows(&self) -> bool {
        PagedLlama::samples_rows(self)
    }

    fn forward(&mut self, batch: &StepBatch, out: &mut StepOutput) -> Result<(), ModelFailure> {
        Ok(PagedLlama::forward(self, batch, out)?)
    }

    fn expert_share(&self) -> Option<f64> {
        PagedLlama::expert_share(self)
    }

    fn set_adapter(
        &mut self,
        slot: u16,
        adapter: Option<Arc<LoraAdapter>>,
    ) -> Result<(), ModelFailure> {
        Ok(PagedLlama::set_adapter(self, slot, adapter)?)
    }

    fn image_input(&self) -> Option<ImageLimits> {
        self.vision().map(|spec| ImageLimits {
            tokens_per_image: spec.tokens_per_image,
            pixels_per_image: spec.pixels_per_image(),
        })
    }

    fn encode_images(&mut self, images: &[&[f32]], out: &mut Vec<f32>) -> Result<(), ModelFailure> {
        PagedLlama::encode_images(self, images, out).map_err(|e| ModelFailure::new(e.to_string()))
    }
}
