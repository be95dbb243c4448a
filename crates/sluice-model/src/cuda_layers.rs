//! The CUDA layer loop, written once ([`run_layers`]). Two executors run it: the eager
//! forward (`cuda_forward.rs`: candle tensors, one allocation an op, any weight format) and
//! the decode steps on static buffers (`cuda_graph.rs`: the same kernels writing buffers the
//! model owns, which a CUDA graph captures and replays). Each implements [`LayerOps`], the
//! stages of one layer; the loop decides their order and which weights each stage takes, so
//! the two cannot compute different layers. A layer kind the loop lacks (sliding windows,
//! sinks, experts, post-norms) is refused before a model reaches it (`arch::supports`).

use candle_core::Tensor;

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::layer::ModelWeights;
use crate::weights::Linear;

/// The stages of one layer on the GPU. The residual stream and the pending delta (the last
/// projection's output, which the next norm adds in) are the executor's state.
pub(crate) trait LayerOps {
    /// Adds the pending delta (none before layer 0) into the residual stream and norms it
    /// for the attention.
    fn attention_norm(&mut self, layer: usize, weight: &Tensor) -> Result<()>;
    /// The fused Q, K and V projection of the normed rows.
    fn qkv(&mut self, linear: &Linear) -> Result<()>;
    /// Q and K rotated by position, each head RMS-normed first where the layer has QK-norm.
    fn rope(&mut self, qk_norm: Option<&(Tensor, Tensor)>) -> Result<()>;
    /// K and V written into the layer's cache, then the paged attention of every query.
    fn attention(&mut self, layer_kv: &Tensor) -> Result<()>;
    /// The output projection, which becomes the pending delta.
    fn output(&mut self, linear: &Linear) -> Result<()>;
    /// Adds the pending delta into the residual stream and norms it for the MLP.
    fn mlp_norm(&mut self, weight: &Tensor) -> Result<()>;
    /// Gate and up, SwiGLU, down; the down projection becomes the pending delta.
    fn mlp(&mut self, gate_up: &Linear, down: &Linear) -> Result<()>;
}

/// Every layer of `w`, in order. The last MLP's output is left pending: the executor's head
/// adds it before the final norm.
pub(crate) fn run_layers(
    ops: &mut impl LayerOps,
    w: &ModelWeights<'_>,
    kv: &KvCache,
) -> Result<()> {
    for (i, layer) in w.layers.iter().enumerate() {
        ops.attention_norm(i, &layer.attn_norm)?;
        ops.qkv(&layer.qkv)?;
        ops.rope(layer.qk_norm.as_ref())?;
        ops.attention(kv.layer_kv(i)?)?;
        ops.output(&layer.o)?;
        ops.mlp_norm(&layer.ffn_norm)?;
        let (gate_up, down) = layer.dense_mlp()?;
        ops.mlp(gate_up, down)?;
    }
    Ok(())
}
