//! gpt-oss (gpt-oss-20b, -120b): biases on Q, K, V and O; one learned sink logit a head in the
//! softmax's denominator; sliding-window layers between global ones (both with the file's YaRN
//! rotary); a mixture of experts with biases, routed by a softmax over the top k's raw
//! logits, through a clamped SwiGLU; its experts in MXFP4 in the released checkpoints.

use serde::Deserialize;
use sluice_kernels::cpu::swiglu::GatedActivation;

use super::{
    Architecture, ExpertActivation, ExpertGating, ExpertTraits, Family, FamilyParams,
    HfExpertLayout, LocalTheta, SharedParams, Traits, WindowRule,
};
use crate::config::SlidingWindow;
use crate::error::Result;
use crate::gguf_keys::GgufKeys;
use crate::hf_keys::HfKeys;
use crate::load::Weight;

pub(crate) struct GptOss;

const GPT_OSS_TRAITS: Traits = Traits {
    qkv_bias: true,
    output_bias: true,
    attention_sinks: true,
    qk_norm: false,
    attention_output_gate: false,
    scales_embeddings: false,
    post_norms: false,
    activation: GatedActivation::Silu,
    gguf_qk_permuted: false,
    local_layers_share_rope: true,
    hf_norms_minus_one: false,
    hf_tied_by_default: false,
    experts: Some(ExpertTraits {
        required: true,
        gating: ExpertGating::TopKSoftmax,
        activation: ExpertActivation::ClampedSwiglu,
        biases: true,
        // The softmax is over the chosen k already: never divided again (llama.cpp's rule,
        // whatever a file says).
        default_norm_topk: None,
        hf_norm_topk_from_config: None,
        shared_expert: false,
        gguf_ff_divided_by_k: false,
        hf_experts_of_intermediate_size: true,
        hf_layout: HfExpertLayout::GptOss,
    }),
};

/// llama.cpp's reading: a window is required; local and global layers in turn where the file
/// gives no pattern; the local layers rotate as the global ones unless the file gives them a
/// base.
const GGUF_WINDOW: WindowRule = WindowRule {
    default_period: 2,
    required: true,
    local_theta: LocalTheta::Global,
};

/// gpt-oss's own config.json fields.
#[derive(Debug, Deserialize)]
struct GptOssJson {
    swiglu_limit: Option<f64>,
    attention_bias: Option<bool>,
    layer_types: Option<Vec<String>>,
}

impl Family for GptOss {
    fn architecture(&self) -> Architecture {
        Architecture::GptOss
    }

    fn names(&self) -> &'static [&'static str] {
        &["gpt-oss", "gpt_oss"]
    }

    fn traits(&self) -> &'static Traits {
        &GPT_OSS_TRAITS
    }

    fn gguf_params(&self, keys: &GgufKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        Ok(FamilyParams {
            moe: super::gguf_moe(self.traits(), keys, shared)?,
            sliding_window: super::windows::gguf_sliding_window(keys, &GGUF_WINDOW, shared)?,
            ..FamilyParams::default()
        })
    }

    /// Its experts' clamp and biases as sluice runs them; its local layers: `sliding_window`
    /// (required, positive), which layers by `layer_types` (else every even one, as the real
    /// models alternate), rotating as the global ones do.
    fn hf_params(&self, keys: &HfKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        let c: GptOssJson = keys.family_fields()?;
        // The experts' clamped SwiGLU clamps at 7 (`ops::clamped_swiglu_rows_into`).
        if let Some(limit) = c.swiglu_limit.filter(|&l| l != 7.0) {
            return Err(keys.unsupported(format!("swiglu_limit {limit} (supported: 7.0)")));
        }
        if c.attention_bias == Some(false) {
            return Err(keys
                .unsupported("gpt-oss without attention biases (`attention_bias` false)".into()));
        }
        let window = match keys.shared().sliding_window {
            Some(w) if w > 0 => w,
            _ => {
                return Err(keys.err(
                    "sliding_window",
                    "gpt-oss's sliding-window layers need a window of at least one token",
                ))
            }
        };
        let n = shared.num_layers;
        let local = match &c.layer_types {
            Some(types) => keys.layer_types(types, n)?,
            None => (0..n).map(|i| i % 2 == 0).collect(),
        };
        Ok(FamilyParams {
            moe: super::hf_moe(self.architecture(), keys, shared, false)?,
            sliding_window: Some(SlidingWindow {
                window,
                local,
                local_rope_theta: shared.rope_theta,
            }),
            ..FamilyParams::default()
        })
    }

    /// Its experts in MXFP4 (their `*_blocks` and `*_scales` tensors), read as such.
    fn hf_accepts_quantization(&self, method: &str) -> bool {
        method == "mxfp4"
    }

    /// llama.cpp names its MLP pre-norm `post_attention_norm`.
    fn gguf_tensor_name(&self, w: Weight) -> String {
        match w {
            Weight::FfnNorm(i) => format!("blk.{i}.post_attention_norm.weight"),
            _ => w.gguf_name(),
        }
    }

    fn hf_tensor_name(&self, w: Weight) -> String {
        match w {
            Weight::Router(i) => format!("model.layers.{i}.mlp.router.weight"),
            _ => w.hf_name(),
        }
    }
    #[cfg(any(test, feature = "testing"))]
    fn tiny_gguf_keys(&self) -> super::export::TinyKeys {
        use candle_core::quantized::gguf_file::Value;
        // Layers local (a window of TINY_GEMMA_WINDOW keys) and global in turn, the default
        // pattern; YaRN over a short original context.
        vec![
            (
                "attention.sliding_window",
                Value::U32(super::export::TINY_GEMMA_WINDOW as u32),
            ),
            ("rope.scaling.type", Value::String("yarn".into())),
            ("rope.scaling.factor", Value::F32(8.0)),
            ("rope.scaling.original_context_length", Value::U32(64)),
        ]
    }

    /// Not written: its checkpoints' MXFP4 experts are not what the test writer produces.
    #[cfg(any(test, feature = "testing"))]
    fn hf_checkpoint(&self, _: &crate::config::ModelConfig) -> Option<super::export::HfCheckpoint> {
        None
    }
}
