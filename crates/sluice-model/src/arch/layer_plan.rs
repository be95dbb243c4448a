//! What one layer is: the building blocks the families compose and the forwards read.

use sluice_kernels::cpu::swiglu::GatedActivation;

use super::Traits;
use crate::config::ModelConfig;
use crate::kv_cache::CacheKind;

/// One layer's kinds, as its family decides them ([`super::Family::layer_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerPlan {
    /// What mixes the tokens: attention (of [`Self::attention`]'s kind) or a recurrence.
    pub mixer: Mixer,
    pub attention: AttentionKind,
    pub rotary: Rotary,
    pub qkv_bias: bool,
    pub output_bias: bool,
    /// One sink logit a query head in the softmax's denominator.
    pub sinks: bool,
    pub qk_norm: bool,
    /// Norms of the attention's and the MLP's outputs before each joins the residual stream.
    pub post_norms: bool,
    /// Each query head's projection followed by a gate of its own, whose sigmoid scales that
    /// head's attention output (Qwen3.5's full-attention layers).
    pub output_gate: bool,
    pub mlp: MlpKind,
}

/// What mixes a layer's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixer {
    /// Attention over the paged KV cache.
    Attention,
    /// A Gated DeltaNet: a fixed-size state a sequence ([`crate::config::DeltaNetConfig`]).
    GatedDeltaNet,
}

/// Which keys a layer's queries see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Every earlier key of the sequence.
    Full,
    /// The last `window` keys, the query's own included.
    SlidingWindow(usize),
}

impl AttentionKind {
    /// The window, `None` for full attention.
    pub fn window(self) -> Option<usize> {
        match self {
            Self::Full => None,
            Self::SlidingWindow(w) => Some(w),
        }
    }
}

/// How a layer rotates Q and K by position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotary {
    /// With the model's rotary tables.
    Global,
    /// With the sliding-window layers' own tables where the model has them (Gemma 3's local
    /// base; gpt-oss's when its file gives the local layers another base), else the global
    /// ones.
    Local,
    /// Not at all (SmolLM3's every fourth layer: "NoPE").
    None,
}

/// What follows a layer's FFN norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpKind {
    /// One gated MLP with this gate activation.
    Dense(GatedActivation),
    /// The mixture of experts of [`ModelConfig::moe`].
    Experts,
}

impl LayerPlan {
    /// The pool of its own this layer's cache needs beside the full-attention layers'
    /// (`None`: the full pool). The family decides it; the cache reads it
    /// ([`crate::kv_cache::cache_groups`]) without knowing mixers or attention kinds.
    pub fn cache_kind(&self) -> Option<CacheKind> {
        match (self.mixer, self.attention) {
            (Mixer::GatedDeltaNet, _) => Some(CacheKind::Recurrent),
            (Mixer::Attention, AttentionKind::SlidingWindow(w)) => {
                Some(CacheKind::SlidingWindow(w))
            }
            (Mixer::Attention, AttentionKind::Full) => None,
        }
    }

    /// Layer `layer` of `config` as a family with `traits` builds it: its kinds from the
    /// traits, its window from the config's sliding window (a windowed layer rotates with the
    /// local tables), experts where the mixture makes the layer sparse, no rotary where the
    /// config lists the layer among those without RoPE.
    pub(crate) fn from_traits(traits: &Traits, config: &ModelConfig, layer: usize) -> Self {
        let window = config
            .sliding_window
            .as_ref()
            .and_then(|s| s.of_layer(layer));
        let rotary = if config.layers_without_rope.contains(&layer) {
            Rotary::None
        } else if window.is_some() {
            Rotary::Local
        } else {
            Rotary::Global
        };
        Self {
            mixer: if config.is_recurrent(layer) {
                Mixer::GatedDeltaNet
            } else {
                Mixer::Attention
            },
            attention: window.map_or(AttentionKind::Full, AttentionKind::SlidingWindow),
            rotary,
            qkv_bias: traits.qkv_bias,
            output_bias: traits.output_bias,
            sinks: traits.attention_sinks,
            qk_norm: traits.qk_norm,
            post_norms: traits.post_norms,
            output_gate: traits.attention_output_gate,
            mlp: match &config.moe {
                Some(moe) if moe.is_sparse(layer) => MlpKind::Experts,
                _ => MlpKind::Dense(traits.activation),
            },
        }
    }
}
