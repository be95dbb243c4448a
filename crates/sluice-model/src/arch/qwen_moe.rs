//! The qwen mixtures: qwen2moe (qwen2's attention, experts beside one shared expert whose
//! output a sigmoid gate scales; weights not renormalised) and qwen3moe (Qwen3-30B-A3B,
//! Qwen3-Coder-30B-A3B: qwen3's attention, experts renormalised).

use super::{
    Architecture, ExpertActivation, ExpertGating, ExpertTraits, Family, FamilyParams,
    HfExpertLayout, SharedParams, Traits,
};
use crate::error::Result;
use crate::hf_keys::HfKeys;

pub(crate) struct Qwen2Moe;
pub(crate) struct Qwen3Moe;

pub(super) const QWEN_EXPERTS: ExpertTraits = ExpertTraits {
    required: true,
    gating: ExpertGating::SoftmaxTopK,
    activation: ExpertActivation::Swiglu,
    biases: false,
    default_norm_topk: Some(true),
    hf_norm_topk_from_config: Some(false),
    shared_expert: false,
    gguf_ff_divided_by_k: true,
    hf_experts_of_intermediate_size: false,
    hf_layout: HfExpertLayout::Separate,
};

const QWEN2MOE_TRAITS: Traits = Traits {
    experts: Some(ExpertTraits {
        // llama.cpp's rule for qwen2moe: the chosen weights are not divided by their sum.
        default_norm_topk: Some(false),
        shared_expert: true,
        ..QWEN_EXPERTS
    }),
    ..super::qwen2::QWEN2_TRAITS
};

const QWEN3MOE_TRAITS: Traits = Traits {
    experts: Some(QWEN_EXPERTS),
    ..super::qwen3::QWEN3_TRAITS
};

impl Family for Qwen2Moe {
    fn architecture(&self) -> Architecture {
        Architecture::Qwen2Moe
    }

    fn names(&self) -> &'static [&'static str] {
        &["qwen2moe", "qwen2_moe"]
    }

    fn traits(&self) -> &'static Traits {
        &QWEN2MOE_TRAITS
    }

    fn hf_params(&self, keys: &HfKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        Ok(FamilyParams {
            moe: super::hf_moe(self.architecture(), keys, shared, false)?,
            context_limit: keys.qwen_window(),
            ..FamilyParams::default()
        })
    }
    #[cfg(any(test, feature = "testing"))]
    fn hf_checkpoint(
        &self,
        config: &crate::config::ModelConfig,
    ) -> Option<super::export::HfCheckpoint> {
        use super::export::{qwen_moe_fields, HfCheckpoint};
        Some(HfCheckpoint {
            fields: config.moe.as_ref().map(qwen_moe_fields)?,
            ..HfCheckpoint::plain("Qwen2MoeForCausalLM", "qwen2_moe")
        })
    }
}

impl Family for Qwen3Moe {
    fn architecture(&self) -> Architecture {
        Architecture::Qwen3Moe
    }

    fn names(&self) -> &'static [&'static str] {
        &["qwen3moe", "qwen3_moe"]
    }

    fn traits(&self) -> &'static Traits {
        &QWEN3MOE_TRAITS
    }

    fn hf_params(&self, keys: &HfKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        Ok(FamilyParams {
            moe: super::hf_moe(self.architecture(), keys, shared, false)?,
            context_limit: keys.qwen_window(),
            ..FamilyParams::default()
        })
    }
    #[cfg(any(test, feature = "testing"))]
    fn hf_checkpoint(
        &self,
        config: &crate::config::ModelConfig,
    ) -> Option<super::export::HfCheckpoint> {
        use super::export::{qwen_moe_fields, HfCheckpoint};
        Some(HfCheckpoint {
            fields: config.moe.as_ref().map(qwen_moe_fields)?,
            ..HfCheckpoint::plain("Qwen3MoeForCausalLM", "qwen3_moe")
        })
    }
}
