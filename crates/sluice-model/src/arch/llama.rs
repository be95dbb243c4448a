//! llama (SmolLM2, Llama 2/3), Mistral, and Mixtral (llama with a mixture of experts): no
//! biases, SwiGLU, RMSNorm; llama.cpp's NORM rotary, so its GGUF files hold Q and K permuted.

use super::{
    Architecture, ExpertActivation, ExpertGating, ExpertTraits, Family, FamilyParams,
    HfExpertLayout, SharedParams, Traits,
};
use crate::error::Result;
use crate::hf_keys::HfKeys;
use sluice_kernels::cpu::swiglu::GatedActivation;

pub(crate) struct Llama;

pub(super) const LLAMA_TRAITS: Traits = Traits {
    qkv_bias: false,
    output_bias: false,
    attention_sinks: false,
    qk_norm: false,
    attention_output_gate: false,
    scales_embeddings: false,
    post_norms: false,
    activation: GatedActivation::Silu,
    gguf_qk_permuted: true,
    local_layers_share_rope: false,
    hf_norms_minus_one: false,
    hf_tied_by_default: false,
    // Mixtral's, in a file that has experts: a softmax over all, the top k renormalised.
    experts: Some(ExpertTraits {
        required: false,
        gating: ExpertGating::SoftmaxTopK,
        activation: ExpertActivation::Swiglu,
        biases: false,
        default_norm_topk: Some(true),
        hf_norm_topk_from_config: None,
        shared_expert: false,
        gguf_ff_divided_by_k: false,
        hf_experts_of_intermediate_size: true,
        hf_layout: HfExpertLayout::Separate,
    }),
};

impl Family for Llama {
    fn architecture(&self) -> Architecture {
        Architecture::Llama
    }

    // Mixtral is llama with experts: GGUF files say `llama`, HF configs `mixtral`.
    fn names(&self) -> &'static [&'static str] {
        &["llama", "mistral", "mixtral"]
    }

    fn traits(&self) -> &'static Traits {
        &LLAMA_TRAITS
    }

    fn hf_params(&self, keys: &HfKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        let c = keys.shared();
        // A config that names Mixtral must describe its experts.
        let mixtral = c.model_type.as_deref() == Some("mixtral")
            || c.architectures
                .as_ref()
                .and_then(|a| a.first())
                .is_some_and(|class| class == "MixtralForCausalLM");
        Ok(FamilyParams {
            moe: super::hf_moe(self.architecture(), keys, shared, mixtral)?,
            // Mistral says that its attention is windowed with `sliding_window` alone.
            context_limit: keys.shared().sliding_window,
            ..FamilyParams::default()
        })
    }
    #[cfg(any(test, feature = "testing"))]
    fn hf_checkpoint(
        &self,
        config: &crate::config::ModelConfig,
    ) -> Option<super::export::HfCheckpoint> {
        use super::export::HfCheckpoint;
        Some(match &config.moe {
            None => HfCheckpoint::plain("LlamaForCausalLM", "llama"),
            // Mixtral's experts are its `intermediate_size`; it always renormalises.
            Some(moe) => HfCheckpoint {
                mixtral_expert_names: true,
                fields: serde_json::json!({
                    "num_local_experts": moe.num_experts,
                    "num_experts_per_tok": moe.num_experts_used,
                    "intermediate_size": moe.expert_intermediate_size,
                }),
                ..HfCheckpoint::plain("MixtralForCausalLM", "mixtral")
            },
        })
    }
}
