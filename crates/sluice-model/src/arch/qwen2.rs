//! qwen2 (Qwen2, Qwen2.5, Qwen2.5-Coder): llama's layers with biases on Q, K and V; NEOX
//! rotary (GGUF files hold Q and K as trained).

use super::{Architecture, Family, FamilyParams, SharedParams, Traits};
use crate::error::Result;
use crate::hf_keys::HfKeys;
use sluice_kernels::cpu::swiglu::GatedActivation;

pub(crate) struct Qwen2;

pub(super) const QWEN2_TRAITS: Traits = Traits {
    qkv_bias: true,
    output_bias: false,
    attention_sinks: false,
    qk_norm: false,
    attention_output_gate: false,
    scales_embeddings: false,
    post_norms: false,
    activation: GatedActivation::Silu,
    gguf_qk_permuted: false,
    local_layers_share_rope: false,
    hf_norms_minus_one: false,
    hf_tied_by_default: false,
    experts: None,
};

impl Family for Qwen2 {
    fn architecture(&self) -> Architecture {
        Architecture::Qwen2
    }

    fn names(&self) -> &'static [&'static str] {
        &["qwen2"]
    }

    fn traits(&self) -> &'static Traits {
        &QWEN2_TRAITS
    }

    fn hf_params(&self, keys: &HfKeys<'_>, _: &SharedParams) -> Result<FamilyParams> {
        Ok(FamilyParams {
            context_limit: keys.qwen_window(),
            ..FamilyParams::default()
        })
    }

    #[cfg(any(test, feature = "testing"))]
    fn hf_checkpoint(&self, _: &crate::config::ModelConfig) -> Option<super::export::HfCheckpoint> {
        Some(super::export::HfCheckpoint::plain(
            "Qwen2ForCausalLM",
            "qwen2",
        ))
    }
}
