//! One transformer layer's weights, and the whole model's, as the forwards (CPU and CUDA) read
//! them.

use candle_core::Tensor;
use sluice_kernels::cpu::swiglu::GatedActivation;

use crate::arch::Rotary;

use crate::config::ModelConfig;
use crate::embedding::Embedding;
use crate::error::{ModelError, Result};
use crate::moe::MoeLayer;
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
    /// The sliding-window layers' own tables (Gemma 3's local rotary base), where they have
    /// any.
    pub local_rope: Option<&'a RotaryTables>,
    /// The LoRA adapters a step's rows may name ([`crate::batch::StepBatch::lora_slots`]).
    pub adapters: &'a [Option<std::sync::Arc<crate::lora::LoraAdapter>>],
}

pub(crate) struct Layer {
    pub attn_norm: Tensor,
    /// Q, K and V stacked: one matmul for all three (with Qwen3.5's gates, each query head's
    /// rows followed by its gate's). A DeltaNet layer's in-projections stacked the same way
    /// (q, k, v, z, beta, alpha: `DeltaNetShape::in_cols`).
    pub qkv: Linear,
    /// Each query head's attention output times the sigmoid of its gate (`qkv`'s gate rows).
    pub output_gate: bool,
    /// A Gated DeltaNet layer's own tensors; `None` for an attention layer. Its `o` is the
    /// DeltaNet's out-projection.
    pub delta_net: Option<Box<DeltaNetLayer>>,
    /// qwen3: RMSNorm weights `[head_dim]` applied to each head of Q and of K before RoPE.
    pub qk_norm: Option<(Tensor, Tensor)>,
    pub o: Linear,
    /// Gemma: the norms of the attention's and of the MLP's outputs before each joins the
    /// residual stream.
    pub post_norms: Option<PostNorms>,
    pub ffn_norm: Tensor,
    pub mlp: Mlp,
    /// The sliding window this layer attends over (a Gemma 3 local layer); `None`: every
    /// earlier key.
    pub window: Option<usize>,
    /// Which tables rotate its Q and K ([`ModelWeights::local_rope`] for a local layer), or
    /// none.
    pub rotary: Rotary,
    /// gpt-oss: one sink logit a query head, joining each softmax's denominator.
    pub sinks: Option<Vec<f32>>,
}

/// A Gated DeltaNet layer's small tensors, as the CPU kernel reads them
/// (`sluice_kernels::cpu::delta_net::DeltaNetWeights`).
pub(crate) struct DeltaNetLayer {
    /// `[conv_dim, conv_kernel]`.
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// `-exp(A_log)`.
    pub a: Vec<f32>,
    pub norm: Vec<f32>,
    /// Its index among the model's DeltaNet layers: where its states live in the cache.
    pub index: usize,
}

/// Gemma's norms after the attention and after the MLP.
pub(crate) struct PostNorms {
    pub attn: Tensor,
    pub ffn: Tensor,
}

/// What follows a layer's FFN norm.
pub(crate) enum Mlp {
    /// One gated MLP.
    Dense {
        /// Gate and up stacked.
        gate_up: Linear,
        down: Linear,
        activation: GatedActivation,
    },
    /// A mixture of experts (the CPU forward runs it; a GPU model refuses it at load).
    Experts(Box<MoeLayer>),
}

impl Mlp {
    pub fn weight_bytes(&self) -> usize {
        match self {
            Mlp::Dense { gate_up, down, .. } => gate_up.weight_bytes() + down.weight_bytes(),
            Mlp::Experts(moe) => moe.weight_bytes(),
        }
    }
}

impl Layer {
    /// The dense MLP's gate/up and down, for the forwards that run no mixture of experts (the
    /// CUDA ones: [`crate::LlamaModel`] refuses a mixture on a GPU at load, so this is never
    /// an error there).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn dense_mlp(&self) -> Result<(&Linear, &Linear)> {
        match &self.mlp {
            Mlp::Dense { gate_up, down, .. } => Ok((gate_up, down)),
            Mlp::Experts(_) => Err(ModelError::InvalidStep(
                "a mixture-of-experts layer on a forward that runs only dense MLPs".into(),
            )),
        }
    }
}
