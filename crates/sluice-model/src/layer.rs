//! One transformer layer's weights, as the forward (CPU or CUDA) reads them.

use candle_core::Tensor;

use crate::weights::Linear;

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
