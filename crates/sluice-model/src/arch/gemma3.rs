//! gemma3 (Gemma 3 text models): embeddings scaled by sqrt(hidden), qwen3's QK-norm, a norm
//! after the attention and after the MLP besides the two before them, GeGLU, and local
//! (sliding-window) layers between global ones, rotating with a base of their own and no
//! scaling.

use serde::Deserialize;
use sluice_kernels::cpu::swiglu::GatedActivation;

use super::{Architecture, Family, FamilyParams, LocalTheta, SharedParams, Traits, WindowRule};
use crate::config::SlidingWindow;
use crate::error::Result;
use crate::gguf_keys::GgufKeys;
use crate::hf_keys::HfKeys;
use crate::load::Weight;

pub(crate) struct Gemma3;

const GEMMA3_TRAITS: Traits = Traits {
    qkv_bias: false,
    output_bias: false,
    attention_sinks: false,
    qk_norm: true,
    attention_output_gate: false,
    scales_embeddings: true,
    post_norms: true,
    activation: GatedActivation::GeluTanh,
    gguf_qk_permuted: false,
    local_layers_share_rope: false,
    hf_norms_minus_one: true,
    hf_tied_by_default: true,
    experts: None,
};

/// llama.cpp's reading of Gemma 3's local layers: no window (or 0) is every layer global; 5 of
/// every 6 layers local where the file gives no pattern; their base 10000 where it gives none.
const GGUF_WINDOW: WindowRule = WindowRule {
    default_period: 6,
    required: false,
    local_theta: LocalTheta::Own(10_000.0),
};

/// Gemma 3's own config.json fields.
#[derive(Debug, Deserialize)]
struct Gemma3Json {
    /// The query scale is its inverse square root.
    query_pre_attn_scalar: Option<f64>,
    /// `sliding_attention` or `full_attention` for each layer (newer configs).
    layer_types: Option<Vec<String>>,
    /// Every N-th layer global (older configs; 6).
    sliding_window_pattern: Option<usize>,
    /// The local layers' rotary base.
    rope_local_base_freq: Option<f64>,
    final_logit_softcapping: Option<f64>,
}

impl Family for Gemma3 {
    fn architecture(&self) -> Architecture {
        Architecture::Gemma3
    }

    // HF configs of the text-only models say `gemma3_text` (`gemma3` is the multimodal one,
    // refused in `hf_params`).
    fn names(&self) -> &'static [&'static str] {
        &["gemma3", "gemma3_text"]
    }

    fn traits(&self) -> &'static Traits {
        &GEMMA3_TRAITS
    }

    /// The local layers, and the query scale where the file has no `attention.scale`:
    /// llama.cpp's rule, `1 / sqrt(head_dim)`, but `1 / sqrt(hidden / heads)` for the 62-layer
    /// 27B, whose `query_pre_attn_scalar` is that.
    fn gguf_params(&self, keys: &GgufKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        let per_head = if shared.num_layers == 62 {
            shared.hidden_size / shared.num_heads
        } else {
            shared.head_dim
        };
        Ok(FamilyParams {
            sliding_window: super::windows::gguf_sliding_window(keys, &GGUF_WINDOW, shared)?,
            attention_scale: Some(1.0 / (per_head as f32).sqrt()),
            ..FamilyParams::default()
        })
    }

    /// Its local layers (`sliding_window`, and `layer_types` or else `sliding_window_pattern`,
    /// 6 by default: layers `i % N < N - 1` local), their rotary base (`rope_local_base_freq`,
    /// 10000), the query scale `query_pre_attn_scalar^-1/2` (256 by default, transformers'
    /// Gemma3TextConfig), and `final_logit_softcapping`.
    fn hf_params(&self, keys: &HfKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        // The multimodal checkpoint is refused whole (its `text_config` unwrapped still names
        // Gemma3ForConditionalGeneration): its older layout keeps the text model under
        // `language_model.model.`, which the loader does not read.
        let shared_json = keys.shared();
        let wrapper = shared_json.model_type.as_deref() == Some("gemma3")
            || shared_json
                .architectures
                .iter()
                .flatten()
                .any(|a| a == "Gemma3ForConditionalGeneration");
        if wrapper {
            return Err(keys.unsupported(
                "Gemma 3's multimodal checkpoint (`model_type` `gemma3`, \
                 Gemma3ForConditionalGeneration): sluice serves the text model, `model_type` \
                 gemma3_text (Gemma3ForCausalLM)"
                    .into(),
            ));
        }
        let c: Gemma3Json = keys.family_fields()?;
        let n = shared.num_layers;
        let local: Vec<bool> = match &c.layer_types {
            Some(types) => keys.layer_types(types, n)?,
            None => {
                let period = c.sliding_window_pattern.unwrap_or(6);
                (0..n)
                    .map(|i| period == 0 || i % period < period - 1)
                    .collect()
            }
        };
        let local_rope_theta = c.rope_local_base_freq.unwrap_or(10_000.0);
        if !(local_rope_theta.is_finite() && local_rope_theta > 0.0) {
            return Err(keys.err("rope_local_base_freq", "must be positive"));
        }
        let sliding_window = match keys.shared().sliding_window {
            Some(window) if window > 0 => Some(SlidingWindow {
                window,
                local,
                local_rope_theta: local_rope_theta as f32,
            }),
            _ => None,
        };
        let scalar = c.query_pre_attn_scalar.unwrap_or(256.0);
        if !(scalar.is_finite() && scalar > 0.0) {
            return Err(keys.err("query_pre_attn_scalar", "must be positive"));
        }
        let final_logit_softcap = match c.final_logit_softcapping {
            Some(cap) if cap > 0.0 && cap.is_finite() => Some(cap as f32),
            Some(0.0) | None => None,
            Some(cap) => {
                return Err(keys.err(
                    "final_logit_softcapping",
                    format!("{cap} must be positive (or null for none)"),
                ))
            }
        };
        Ok(FamilyParams {
            sliding_window,
            attention_scale: Some((1.0 / scalar.sqrt()) as f32),
            final_logit_softcap,
            ..FamilyParams::default()
        })
    }

    /// Its MLP pre-norm is `pre_feedforward_layernorm` (its `post_attention_layernorm` is the
    /// attention's post-norm).
    fn hf_tensor_name(&self, w: Weight) -> String {
        match w {
            Weight::FfnNorm(i) => format!("model.layers.{i}.pre_feedforward_layernorm.weight"),
            _ => w.hf_name(),
        }
    }
    #[cfg(any(test, feature = "testing"))]
    fn tiny_gguf_keys(&self) -> super::export::TinyKeys {
        use candle_core::quantized::gguf_file::Value;
        // Small enough that short prompts cross it: local layers (even ones, the pattern's
        // period of 2) see TINY_GEMMA_WINDOW keys; the global ones rotate with another base
        // than the local ones' default 10000; logits soft-capped, as Gemma 2 and some Gemma 3
        // files say.
        vec![
            ("rope.freq_base", Value::F32(1_000_000.0)),
            (
                "attention.sliding_window",
                Value::U32(super::export::TINY_GEMMA_WINDOW as u32),
            ),
            ("attention.sliding_window_pattern", Value::U32(2)),
            ("final_logit_softcapping", Value::F32(30.0)),
        ]
    }

    #[cfg(any(test, feature = "testing"))]
    fn hf_checkpoint(
        &self,
        config: &crate::config::ModelConfig,
    ) -> Option<super::export::HfCheckpoint> {
        let window = config.sliding_window.as_ref();
        let layer_types: Vec<&str> = (0..config.num_layers)
            .map(|i| match config.window_of_layer(i) {
                Some(_) => "sliding_attention",
                None => "full_attention",
            })
            .collect();
        Some(super::export::HfCheckpoint {
            fields: serde_json::json!({
                "hidden_activation": "gelu_pytorch_tanh",
                "hidden_act": null,
                "query_pre_attn_scalar": 1.0 / (config.query_scale() as f64).powi(2),
                "sliding_window": window.map(|w| w.window),
                "layer_types": layer_types,
                "rope_local_base_freq": window.map(|w| w.local_rope_theta),
                "final_logit_softcapping": config.final_logit_softcap,
            }),
            ..super::export::HfCheckpoint::plain("Gemma3ForCausalLM", "gemma3_text")
        })
    }
}
