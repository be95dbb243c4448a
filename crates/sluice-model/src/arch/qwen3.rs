//! qwen3 (Qwen3 dense models, Qwen3-Embedding): no biases; an RMSNorm over each head of Q and
//! K before the rotary embedding, and a head size of its own (not necessarily hidden / heads).

use super::{Architecture, Family, FamilyParams, SharedParams, Traits};
use crate::error::Result;
use crate::hf_keys::HfKeys;

pub(crate) struct Qwen3;

pub(super) const QWEN3_TRAITS: Traits = Traits {
    qkv_bias: false,
    qk_norm: true,
    ..super::qwen2::QWEN2_TRAITS
};

impl Family for Qwen3 {
    fn architecture(&self) -> Architecture {
        Architecture::Qwen3
    }

    fn names(&self) -> &'static [&'static str] {
        &["qwen3"]
    }

    fn traits(&self) -> &'static Traits {
        &QWEN3_TRAITS
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
            "Qwen3ForCausalLM",
            "qwen3",
        ))
    }
}
