//! What the test writers need of a family (`crate::testing`): the GGUF keys a tiny model of it
//! sets beyond the shared ones, and how it writes a config as a Hugging Face checkpoint (the
//! inverse of its config.json reader), so the tests load a family's directory as its
//! converters wrote it.

use candle_core::quantized::gguf_file::Value;

use crate::config::MoeConfig;

/// The sliding window of a tiny gemma3 (or gpt-oss) model's local layers.
pub const TINY_GEMMA_WINDOW: usize = 8;

/// A family's Hugging Face checkpoint, as the test writer lays it out.
#[derive(Debug)]
pub(crate) struct HfCheckpoint {
    /// config.json's `architectures[0]`.
    pub class: &'static str,
    pub model_type: &'static str,
    /// A multimodal checkpoint's text part (`...ForConditionalGeneration`): config.json's
    /// text fields nested under `text_config` with this `model_type`, the tensors under
    /// `model.language_model.`.
    pub text_model_type: Option<&'static str>,
    /// The per-expert tensors named as Mixtral was published (`block_sparse_moe.experts.E.
    /// {w1,w3,w2}`, its router `block_sparse_moe.gate`), not `mlp.experts.E.{gate,up,down}_proj`.
    pub mixtral_expert_names: bool,
    /// config.json's fields beyond the shared ones, replacing any of the same name.
    pub fields: serde_json::Value,
}

impl HfCheckpoint {
    /// A dense model's: no fields of its own.
    pub fn plain(class: &'static str, model_type: &'static str) -> Self {
        Self {
            class,
            model_type,
            text_model_type: None,
            mixtral_expert_names: false,
            fields: serde_json::json!({}),
        }
    }
}

/// The qwen mixtures' config.json fields for `moe`.
pub(crate) fn qwen_moe_fields(moe: &MoeConfig) -> serde_json::Value {
    serde_json::json!({
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.num_experts_used,
        "moe_intermediate_size": moe.expert_intermediate_size,
        "shared_expert_intermediate_size": moe.shared_expert_intermediate_size,
        "norm_topk_prob": moe.norm_topk_prob,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    })
}

/// Keys (without the `ARCH.` prefix) that a tiny model's file sets, each replacing a shared one
/// of its name.
pub(crate) type TinyKeys = Vec<(&'static str, Value)>;
