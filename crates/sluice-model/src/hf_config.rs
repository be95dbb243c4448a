//! `config.json` of a Hugging Face checkpoint: the fields every family shares, read into a
//! serde struct (type errors name the field through serde_path_to_error), then the family's
//! own ([`crate::arch::Family::hf_params`], each family with its own struct of fields),
//! checked into a [`ModelConfig`].

use std::path::Path;

use serde_json::Value as Json;
use sluice_kernels::cpu::swiglu::GatedActivation;

use crate::arch::SharedParams;
use crate::config::{Architecture, ModelConfig, RopeScaling, Yarn};
use crate::error::{ModelError, Result};
use crate::hf_keys::{Fields, HfKeys, RopeScalingJson, SharedJson};

/// The architecture a config.json names: `model_type`, else its `architectures` class.
fn architecture(f: &Fields<'_>, c: &SharedJson) -> Result<Architecture> {
    let name = match &c.model_type {
        Some(t) => t.clone(),
        None => {
            let class = c
                .architectures
                .as_ref()
                .and_then(|a| a.first())
                .ok_or_else(|| f.err("model_type", "not present (nor `architectures`)"))?;
            class
                .strip_suffix("ForCausalLM")
                .unwrap_or(class)
                .to_ascii_lowercase()
        }
    };
    match Architecture::from_name(&name) {
        Some(a) => Ok(a),
        None => Err(f.unsupported(format!(
            "architecture `{name}` (model_type; supported: {})",
            Architecture::supported_names().join(", ")
        ))),
    }
}

/// Hyper-parameters from a parsed config.json. `has_lm_head`: whether the checkpoint holds
/// `lm_head.weight`, which decides tied embeddings when the config does not say.
pub fn parse_config(path: &Path, json: &Json, has_lm_head: bool) -> Result<ModelConfig> {
    if !json.is_object() {
        return Err(ModelError::InvalidFile {
            path: path.to_path_buf(),
            reason: "expected a JSON object".into(),
        });
    }
    let text = text_config(json);
    let json = text.as_ref();
    let f = Fields { path };
    let c: SharedJson = f.parse(json)?;
    let architecture = architecture(&f, &c)?;
    let family = architecture.family();
    let traits = family.traits();
    let hidden_size = f.required("hidden_size", c.hidden_size)?;
    let num_heads = f.required("num_attention_heads", c.num_attention_heads)?;
    let num_kv_heads = c.num_key_value_heads.unwrap_or(num_heads);
    if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
        return Err(f.err(
            "num_key_value_heads",
            format!("{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads"),
        ));
    }
    let head_dim = c.head_dim.unwrap_or(hidden_size / num_heads);
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(f.err("head_dim", format!("head_dim {head_dim} must be even")));
    }
    let rope_theta = c
        .rope_theta
        .or(c.rope_parameters.as_ref().and_then(|p| p.rope_theta))
        .unwrap_or(10_000.0);
    // `rope_parameters` without a type holds the theta alone.
    let typed_parameters = c
        .rope_parameters
        .as_ref()
        .filter(|p| p.rope_type.is_some() || p.legacy_type.is_some());
    let rope_scaling = match c.rope_scaling.as_ref().or(typed_parameters) {
        Some(scaling) => rope_scaling(&f, scaling, head_dim, rope_theta)?,
        None => None,
    };
    let mut max_position_embeddings = c.max_position_embeddings.unwrap_or(2048);
    let shared = SharedParams {
        hidden_size,
        num_heads,
        head_dim,
        num_layers: f.required("num_hidden_layers", c.num_hidden_layers)?,
        // A mixture whose every layer is experts sized by `moe_intermediate_size` may leave
        // it out (Qwen3.5's MoE configs do); checked once the family has said which layers
        // are dense.
        intermediate_size: match (c.intermediate_size, &traits.experts) {
            (Some(n), _) => n,
            (None, Some(e)) if !e.hf_experts_of_intermediate_size => 0,
            (None, _) => return Err(f.err("intermediate_size", "not present")),
        },
        rope_theta: rope_theta as f32,
    };
    let params = family.hf_params(
        &HfKeys {
            fields: Fields { path },
            json,
            shared: &c,
        },
        &shared,
    )?;
    let dense_mlp = params
        .moe
        .as_ref()
        .is_none_or(|m| !m.dense_layers.is_empty());
    if c.intermediate_size.is_none() && dense_mlp {
        return Err(f.err("intermediate_size", "not present"));
    }
    // After the family's own checks (which refuse a whole kind of checkpoint first).
    if let Some(q) = &c.quantization_config {
        let method = q.quant_method.as_deref().unwrap_or("unnamed");
        if !family.hf_accepts_quantization(method) {
            return Err(f.unsupported(format!(
                "quantized checkpoint (`quantization_config.quant_method` {method}): use f32, \
                 f16 or bf16 weights (or gpt-oss's MXFP4 experts), or a GGUF file"
            )));
        }
    }
    match traits.activation {
        GatedActivation::GeluTanh => {
            let act = c.hidden_activation.as_deref().or(c.hidden_act.as_deref());
            if let Some(act) = act.filter(|a| !matches!(*a, "gelu_pytorch_tanh" | "gelu_tanh")) {
                return Err(f.unsupported(format!(
                    "hidden_activation `{act}` for {} (supported: gelu_pytorch_tanh)",
                    architecture.name()
                )));
            }
        }
        GatedActivation::Silu => {
            if let Some(act) = &c.hidden_act {
                if !matches!(act.as_str(), "silu" | "swish") {
                    return Err(f.unsupported(format!("hidden_act `{act}` (supported: silu)")));
                }
            }
        }
    }
    // Attention limited to a window only differs from full attention past the window; serve
    // contexts up to it.
    if let Some(window) = params.context_limit {
        if window < max_position_embeddings {
            tracing::warn!(
                path = %path.display(),
                sliding_window = window,
                max_position_embeddings,
                "sliding-window attention is not implemented; limiting the context to the window"
            );
            max_position_embeddings = window;
        }
    }
    Ok(ModelConfig {
        architecture,
        hidden_size,
        intermediate_size: shared.intermediate_size,
        num_layers: shared.num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        vocab_size: f.required("vocab_size", c.vocab_size)?,
        rms_norm_eps: c.rms_norm_eps.unwrap_or(1e-6),
        rope_theta: rope_theta as f32,
        rope_scaling,
        max_position_embeddings,
        tie_word_embeddings: c
            .tie_word_embeddings
            .unwrap_or(traits.hf_tied_by_default || !has_lm_head),
        // config.json declares none; a sentence-transformers directory's pooling lives in
        // `1_Pooling/config.json`, which sluice does not read (`--pooling` sets it).
        pooling: None,
        moe: params.moe,
        sliding_window: params.sliding_window,
        attention_scale: params.attention_scale,
        final_logit_softcap: params.final_logit_softcap,
        layers_without_rope: params.layers_without_rope,
        rotary_dim: params.rotary_dim,
        delta_net: params.delta_net,
    })
}

/// The config a multimodal checkpoint's text model reads (`...ForConditionalGeneration`): its
/// `text_config`'s fields over the outer ones, as transformers' and llama.cpp's converter read
/// them (the outer `architectures` and `quantization_config` stay); a text model's config as it
/// is. The vision tower's fields are not read: such a checkpoint serves text.
pub(crate) fn text_config(json: &Json) -> std::borrow::Cow<'_, Json> {
    match (
        json.as_object(),
        json.get("text_config").and_then(Json::as_object),
    ) {
        (Some(outer), Some(text)) => {
            let mut merged = outer.clone();
            merged.remove("text_config");
            for (k, v) in text {
                merged.insert(k.clone(), v.clone());
            }
            std::borrow::Cow::Owned(Json::Object(merged))
        }
        _ => std::borrow::Cow::Borrowed(json),
    }
}

/// `rope_scaling`: `default` for none; `linear` (`factor`); `llama3` (`factor`,
/// `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`), turned into
/// per-frequency divisors exactly as llama.cpp's converter writes `rope_freqs`.
fn rope_scaling(
    f: &Fields<'_>,
    s: &RopeScalingJson,
    head_dim: usize,
    theta: f64,
) -> Result<Option<RopeScaling>> {
    let kind = s
        .rope_type
        .as_deref()
        .or(s.legacy_type.as_deref())
        .ok_or_else(|| f.err("rope_scaling.rope_type", "not present"))?;
    let factor = || -> Result<f64> {
        match s.factor {
            Some(x) if x > 0.0 => Ok(x),
            Some(x) => Err(f.err(
                "rope_scaling.factor",
                format!("must be positive, found {x}"),
            )),
            None => Err(f.err("rope_scaling.factor", "not present")),
        }
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: factor()? as f32,
        })),
        "llama3" => {
            let factor = factor()?;
            let low = s.low_freq_factor.unwrap_or(1.0);
            let high = s.high_freq_factor.unwrap_or(4.0);
            let original = s.original_max_position_embeddings.unwrap_or(8192) as f64;
            if high <= low {
                return Err(f.err(
                    "rope_scaling.high_freq_factor",
                    format!("must exceed low_freq_factor ({high} <= {low})"),
                ));
            }
            Ok(Some(RopeScaling::FreqFactors(llama3_factors(
                head_dim, theta, factor, low, high, original,
            ))))
        }
        "yarn" => {
            let factor = factor()?;
            if s.mscale.is_some() || s.mscale_all_dim.is_some() {
                return Err(
                    f.unsupported("rope_scaling.mscale (DeepSeek's variant of YaRN)".to_string())
                );
            }
            let original = f.required(
                "rope_scaling.original_max_position_embeddings",
                s.original_max_position_embeddings,
            )?;
            let positive = |key: &str, v: Option<f64>, default: f64| -> Result<f32> {
                match v.unwrap_or(default) {
                    v if v.is_finite() && v > 0.0 => Ok(v as f32),
                    v => Err(f.err(key, format!("{v} must be positive"))),
                }
            };
            // transformers scales cos and sin by `attention_factor`, by default
            // `0.1 ln(factor) + 1`: the magnitude the rotary applies itself (llama.cpp's
            // rope_yarn), so a factor the config gives is taken relative to it.
            let magnitude = 0.1 * factor.ln() + 1.0;
            let attn_factor = positive(
                "rope_scaling.attention_factor",
                s.attention_factor.map(|a| a / magnitude),
                1.0,
            )?;
            Ok(Some(RopeScaling::Yarn(Yarn {
                factor: factor as f32,
                original_context: original,
                beta_fast: positive("rope_scaling.beta_fast", s.beta_fast, 32.0)?,
                beta_slow: positive("rope_scaling.beta_slow", s.beta_slow, 1.0)?,
                attn_factor,
                truncate: s.truncate.unwrap_or(true),
            })))
        }
        other => Err(f.unsupported(format!(
            "rope_scaling type `{other}` (supported: default, linear, llama3, yarn)"
        ))),
    }
}

/// Llama 3.1's frequency divisors: high frequencies kept, low ones divided by `factor`, and a
/// smooth blend between (transformers' `_compute_llama3_parameters`).
pub fn llama3_factors(
    head_dim: usize,
    theta: f64,
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_context: f64,
) -> Vec<f32> {
    let low_freq_wavelen = original_context / low_freq_factor;
    let high_freq_wavelen = original_context / high_freq_factor;
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let divisor = if wavelen < high_freq_wavelen {
                1.0
            } else if wavelen > low_freq_wavelen {
                factor
            } else {
                let smooth = (original_context / wavelen - low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            divisor as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> Result<ModelConfig> {
        parse_config(
            Path::new("/m/config.json"),
            &serde_json::from_str(json).unwrap(),
            false,
        )
    }

    const BASE: &str = r#""hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300"#;

    /// gpt-oss-20b's config.json as released (the fields sluice reads, and some it ignores).
    #[test]
    fn gpt_oss_20b_config() {
        let layer_types: Vec<&str> = (0..24)
            .map(|i| {
                if i % 2 == 0 {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        let c = config(&format!(
            r#"{{"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
                "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
                "vocab_size": 201088, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
                "rope_theta": 150000, "sliding_window": 128, "attention_bias": true,
                "swiglu_limit": 7.0, "hidden_act": "silu", "tie_word_embeddings": false,
                "initial_context_length": 4096, "router_aux_loss_coef": 0.9,
                "rope_scaling": {{"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                    "original_max_position_embeddings": 4096, "rope_type": "yarn",
                    "truncate": false}},
                "quantization_config": {{"modules_to_not_convert": ["model.layers.*.self_attn",
                    "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
                    "quant_method": "mxfp4"}},
                "layer_types": {}}}"#,
            serde_json::to_string(&layer_types).unwrap()
        ))
        .unwrap();
        assert_eq!(c.architecture, Architecture::GptOss);
        assert_eq!(
            c.rope_scaling,
            Some(RopeScaling::Yarn(Yarn {
                factor: 32.0,
                original_context: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attn_factor: 1.0,
                truncate: false,
            }))
        );
        let window = c.sliding_window.unwrap();
        assert_eq!(window.window, 128);
        assert_eq!(window.local_rope_theta, 150_000.0);
        assert!(window.local.iter().step_by(2).all(|&l| l));
        assert!(!window.local.iter().skip(1).step_by(2).any(|&l| l));
        let moe = c.moe.unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_used), (32, 4));
        assert_eq!(moe.expert_intermediate_size, 2880);
        assert!(!moe.norm_topk_prob);
        assert_eq!(c.max_position_embeddings, 131_072);
        // An attention factor given is taken relative to YaRN's own magnitude.
        let given = config(&format!(
            r#"{{"model_type": "gpt_oss", {BASE}, "num_local_experts": 4,
                "num_experts_per_tok": 2, "sliding_window": 8,
                "rope_scaling": {{"rope_type": "yarn", "factor": 4.0,
                    "original_max_position_embeddings": 64, "attention_factor": 2.0}}}}"#
        ))
        .unwrap();
        let Some(RopeScaling::Yarn(y)) = given.rope_scaling else {
            panic!("{:?}", given.rope_scaling)
        };
        assert!((y.attn_factor - 2.0 / (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
        assert!(y.truncate);
    }

    #[test]
    fn llama_config_with_defaults() {
        let c = config(&format!(r#"{{"model_type": "llama", {BASE}}}"#)).unwrap();
        assert_eq!(c.architecture, Architecture::Llama);
        assert_eq!((c.head_dim, c.num_kv_heads), (16, 2));
        assert_eq!(c.rope_theta, 10_000.0);
        assert_eq!(c.rope_scaling, None);
        assert_eq!(c.max_position_embeddings, 2048);
        assert!(
            c.tie_word_embeddings,
            "no lm_head.weight and no tie_word_embeddings: tied"
        );
    }

    #[test]
    fn smollm3_layers_without_rope() {
        // BASE has 2 layers: neither is a fourth one by default.
        let c = config(&format!(
            r#"{{"architectures": ["SmolLM3ForCausalLM"], {BASE}}}"#
        ))
        .unwrap();
        assert_eq!(c.architecture, Architecture::SmolLm3);
        assert!(c.layers_without_rope.is_empty());
        let c = config(&format!(
            r#"{{"model_type": "smollm3", {BASE}, "no_rope_layer_interval": 2}}"#
        ))
        .unwrap();
        assert_eq!(c.layers_without_rope, [1]);
        let c = config(&format!(
            r#"{{"model_type": "smollm3", {BASE}, "no_rope_layers": [0, 1]}}"#
        ))
        .unwrap();
        assert_eq!(c.layers_without_rope, [0]);
        assert_eq!(
            c.layer_plan(0).rotary,
            crate::arch::Rotary::None,
            "the plan reads it"
        );
        for (bad, key) in [
            (r#""no_rope_layers": [1, 1, 1]"#, "no_rope_layers"),
            (r#""no_rope_layers": [2, 1]"#, "no_rope_layers"),
            (r#""no_rope_layer_interval": 0"#, "no_rope_layer_interval"),
        ] {
            let err = config(&format!(r#"{{"model_type": "smollm3", {BASE}, {bad}}}"#))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{bad}: {err}");
        }
    }

    #[test]
    fn architecture_from_class_name_and_explicit_head_dim() {
        let c = config(&format!(
            r#"{{"architectures": ["Qwen3ForCausalLM"], {BASE}, "head_dim": 32,
                "tie_word_embeddings": false, "rope_scaling": null}}"#
        ))
        .unwrap();
        assert_eq!(c.architecture, Architecture::Qwen3);
        assert_eq!(c.head_dim, 32);
        assert!(!c.tie_word_embeddings);
    }

    #[test]
    fn linear_and_llama3_rope_scaling() {
        let c = config(&format!(
            r#"{{"model_type": "llama", {BASE}, "rope_scaling": {{"type": "linear", "factor": 4.0}}}}"#
        ))
        .unwrap();
        assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 4.0 }));

        let c = config(&format!(
            r#"{{"model_type": "llama", {BASE}, "head_dim": 128, "rope_theta": 500000.0,
                "rope_scaling": {{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}}"#
        ))
        .unwrap();
        let Some(RopeScaling::FreqFactors(f)) = c.rope_scaling else {
            panic!("{:?}", c.rope_scaling)
        };
        assert_eq!(f.len(), 64);
        // Wavelengths under 8192/4 keep their frequency; over 8192 are divided by 8; between,
        // the divisor rises monotonically.
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
        assert!(f.iter().any(|&x| x > 1.0 && x < 8.0), "{f:?}");
        // The same numbers by transformers' formula, on inv_freq directly.
        for (i, &divisor) in f.iter().enumerate() {
            let inv = 1.0 / 500000f64.powf((2 * i) as f64 / 128.0);
            let wavelen = 2.0 * std::f64::consts::PI / inv;
            let scaled = if wavelen < 2048.0 {
                inv
            } else if wavelen > 8192.0 {
                inv / 8.0
            } else {
                let smooth = (8192.0 / wavelen - 1.0) / 3.0;
                (1.0 - smooth) * inv / 8.0 + smooth * inv
            };
            assert!(((inv / scaled) as f32 - divisor).abs() < 1e-5, "{i}");
        }
    }

    #[test]
    fn sliding_window_limits_the_context() {
        let c = config(&format!(
            r#"{{"model_type": "mistral", {BASE}, "max_position_embeddings": 32768,
                "sliding_window": 4096}}"#
        ))
        .unwrap();
        assert_eq!(c.max_position_embeddings, 4096);
        let c = config(&format!(
            r#"{{"model_type": "qwen2", {BASE}, "max_position_embeddings": 32768,
                "sliding_window": 4096, "use_sliding_window": false}}"#
        ))
        .unwrap();
        assert_eq!(c.max_position_embeddings, 32768);
    }

    #[test]
    fn mixture_of_experts_configs() {
        let c = config(&format!(
            r#"{{"model_type": "mixtral", {BASE}, "num_local_experts": 8,
                "num_experts_per_tok": 2}}"#
        ))
        .unwrap();
        assert_eq!(c.architecture, Architecture::Llama);
        let moe = c.moe.unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_used), (8, 2));
        assert_eq!(moe.expert_intermediate_size, 128);
        assert!(moe.norm_topk_prob && moe.dense_layers.is_empty());

        let c = config(&format!(
            r#"{{"architectures": ["Qwen3MoeForCausalLM"], {BASE}, "num_experts": 16,
                "num_experts_per_tok": 4, "moe_intermediate_size": 32, "norm_topk_prob": true,
                "decoder_sparse_step": 1, "mlp_only_layers": [1]}}"#
        ))
        .unwrap();
        assert_eq!(c.architecture, Architecture::Qwen3Moe);
        let moe = c.moe.unwrap();
        assert_eq!(moe.expert_intermediate_size, 32);
        assert_eq!(moe.dense_layers, [1]);
        assert!(moe.norm_topk_prob && !moe.is_sparse(1) && moe.is_sparse(0));

        let c = config(&format!(
            r#"{{"model_type": "qwen2_moe", {BASE}, "num_experts": 4,
                "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 64, "decoder_sparse_step": 2}}"#
        ))
        .unwrap();
        let moe = c.moe.unwrap();
        assert_eq!(moe.shared_expert_intermediate_size, Some(64));
        assert!(!moe.norm_topk_prob);
        // Every second layer sparse: layer 1 of 0..2.
        assert_eq!(moe.dense_layers, [0]);
        assert!(config(&format!(r#"{{"model_type": "llama", {BASE}}}"#))
            .unwrap()
            .moe
            .is_none());
    }

    #[test]
    fn bad_expert_counts_name_the_key() {
        let msg = |json: String| config(&json).unwrap_err().to_string();
        let m = msg(format!(
            r#"{{"model_type": "qwen3_moe", {BASE}, "num_experts_per_tok": 2,
                "moe_intermediate_size": 32}}"#
        ));
        assert!(m.contains("num_experts"), "{m}");
        for k in [0, 9] {
            let m = msg(format!(
                r#"{{"model_type": "mixtral", {BASE}, "num_local_experts": 8,
                    "num_experts_per_tok": {k}}}"#
            ));
            assert!(m.contains("num_experts_per_tok"), "{m}");
        }
        let m = msg(format!(
            r#"{{"model_type": "qwen2_moe", {BASE}, "num_experts": 4,
                "num_experts_per_tok": 2, "moe_intermediate_size": 32}}"#
        ));
        assert!(m.contains("shared_expert_intermediate_size"), "{m}");
    }

    #[test]
    fn bad_configs_name_the_field() {
        let msg = |json: String| config(&json).unwrap_err().to_string();
        let m = msg(format!(r#"{{"model_type": "falcon", {BASE}}}"#));
        assert!(
            m.contains("/m/config.json") && m.contains("`falcon`") && m.contains("qwen3"),
            "{m}"
        );
        // Gemma 3's multimodal wrapper: the text model's type named instead.
        let m = msg(format!(r#"{{"model_type": "gemma3", {BASE}}}"#));
        assert!(m.contains("`gemma3`") && m.contains("gemma3_text"), "{m}");
        let m = msg(format!(
            r#"{{"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                "text_config": {{"model_type": "gemma3_text", {BASE}}}}}"#
        ));
        assert!(m.contains("`gemma3`") && m.contains("gemma3_text"), "{m}");
        let m = msg(r#"{"model_type": "llama", "hidden_size": 64}"#.into());
        assert!(
            m.contains("intermediate_size") || m.contains("num_attention_heads"),
            "{m}"
        );
        let m = msg(format!(
            r#"{{"model_type": "llama", {BASE}, "rope_scaling": {{"type": "dynamic", "factor": 2.0}}}}"#
        ));
        assert!(m.contains("`dynamic`"), "{m}");
        let m = msg(format!(
            r#"{{"model_type": "llama", {BASE}, "rope_scaling": {{"type": "yarn", "factor": 2.0}}}}"#
        ));
        assert!(
            m.contains("rope_scaling.original_max_position_embeddings"),
            "{m}"
        );
        let m = msg(format!(
            r#"{{"model_type": "llama", {BASE}, "rope_scaling": {{"type": "linear"}}}}"#
        ));
        assert!(m.contains("rope_scaling.factor"), "{m}");
        let m = msg(format!(
            r#"{{"model_type": "llama", {BASE}, "hidden_act": "gelu"}}"#
        ));
        assert!(m.contains("hidden_act"), "{m}");
        let m = msg(r#"{"model_type": "llama", "hidden_size": "big"}"#.into());
        assert!(m.contains("hidden_size"), "{m}");
    }

    fn parse(json: &serde_json::Value) -> Result<ModelConfig> {
        parse_config(Path::new("/m/config.json"), json, true)
    }

    /// Qwen3.6-35B-A3B's config.json as its checkpoints lay it out (the fields sluice reads,
    /// and some it ignores): the text model under `text_config`, no `intermediate_size`, the
    /// rope in `rope_parameters`.
    fn qwen36_moe() -> serde_json::Value {
        let layer_types: Vec<&str> = (0..40)
            .map(|i| {
                if (i + 1) % 4 == 0 {
                    "full_attention"
                } else {
                    "linear_attention"
                }
            })
            .collect();
        serde_json::json!({
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            "tie_word_embeddings": false,
            "text_config": {
                "attn_output_gate": true, "eos_token_id": 248044, "full_attention_interval": 4,
                "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
                "layer_types": layer_types, "linear_conv_kernel_dim": 4,
                "linear_key_head_dim": 128, "linear_num_key_heads": 16,
                "linear_num_value_heads": 32, "linear_value_head_dim": 128,
                "max_position_embeddings": 262144, "model_type": "qwen3_5_moe_text",
                "moe_intermediate_size": 512, "mtp_num_hidden_layers": 1,
                "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8,
                "num_hidden_layers": 40, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
                "rope_parameters": {
                    "mrope_interleaved": true, "mrope_section": [11, 11, 10],
                    "partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_type": "default"
                },
                "shared_expert_intermediate_size": 512, "vocab_size": 248320
            },
            "vision_config": {"depth": 27, "hidden_size": 1152, "model_type": "qwen3_5_moe"}
        })
    }

    #[test]
    fn a_multimodal_checkpoints_text_model_is_read() {
        let c = parse(&qwen36_moe()).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen35Moe);
        assert_eq!((c.hidden_size, c.num_layers, c.head_dim), (2048, 40, 256));
        assert_eq!((c.vocab_size, c.rope_theta), (248320, 1e7));
        assert_eq!(c.rotary_dim, Some(64));
        let dn = c.delta_net.as_ref().unwrap();
        assert_eq!(
            (dn.k_heads, dn.v_heads, dn.head_dim, dn.conv_kernel),
            (16, 32, 128, 4)
        );
        assert_eq!(dn.layers().len(), 30);
        assert!(!dn.is_recurrent(3) && dn.is_recurrent(4));
        let moe = c.moe.as_ref().unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_used), (256, 8));
        assert_eq!(moe.shared_expert_intermediate_size, Some(512));
        // Qwen3.5's router renormalises where the config does not say (as vLLM reads it).
        assert!(moe.norm_topk_prob);
        assert!(!c.tie_word_embeddings);
    }

    #[test]
    fn bad_hybrid_configs_name_the_field() {
        let cases: [(&str, serde_json::Value, &str); 8] = [
            (
                "linear_num_value_heads",
                serde_json::Value::Null,
                "linear_num_value_heads",
            ),
            (
                "linear_num_value_heads",
                24.into(),
                "linear_num_value_heads",
            ),
            ("linear_conv_kernel_dim", 0.into(), "linear_conv_kernel_dim"),
            ("linear_value_head_dim", 64.into(), "linear_value_head_dim"),
            (
                "layer_types",
                serde_json::json!(["full_attention"]),
                "layer_types",
            ),
            (
                "layer_types",
                serde_json::json!(vec!["linear_attention"; 40]),
                "layer_types",
            ),
            ("attn_output_gate", false.into(), "attn_output_gate"),
            (
                "rope_parameters",
                serde_json::json!({"partial_rotary_factor": 0.3}),
                "partial_rotary_factor",
            ),
        ];
        for (key, value, named) in cases {
            let mut json = qwen36_moe();
            json["text_config"][key] = value;
            let m = parse(&json).unwrap_err().to_string();
            assert!(m.contains(named), "{key}: {m}");
        }
        let mut json = qwen36_moe();
        json["text_config"]["rope_parameters"]["mrope_section"] = serde_json::json!([24, 24, 24]);
        let m = parse(&json).unwrap_err().to_string();
        assert!(m.contains("mrope_section"), "{m}");
        // A dense hybrid needs its MLP's size.
        let mut json = qwen36_moe();
        let text = json["text_config"].as_object_mut().unwrap();
        text.insert("model_type".into(), "qwen3_5_text".into());
        for k in [
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
        ] {
            text.remove(k);
        }
        let m = parse(&json).unwrap_err().to_string();
        assert!(m.contains("intermediate_size"), "{m}");
    }
}
