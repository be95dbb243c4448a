//! One transformer layer's weights, and the whole model's, as the forwards (CPU and CUDA) read
//! them.

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::embedding::Embedding;
use crate::rope::RotaryTables;
use crate::weights::Linear;

/// What a forward reads of a model.
pub(crate) struct ModelWeights<'a> {
    pub config: &'a ModelConfig,
    pub embed: &'a Embedding,
    pub layers: &'a [Layer],
    pub norm: &'a Tensor,
    pub lm_head: &'a Linear,
    pub rope: &'a RotaryTables,
}

pub(crate) struct Layer {
    pub attn_norm: Tensor,
    /// Q, K and V stacked: one matmul for all three.
    pub qkv: Linear,
    /// qwen3: RMSNorm weights `[head_dim]` applied to each head of Q and of K before RoPE.
    pub qk_norm: Option<(Tensor, Tensor)>,
    pub o: Linear,
    pub ffn_norm: Tensor,
    /// Gate and up stacked.
    pub gate_up: Linear,
    pub down: Linear,
}
