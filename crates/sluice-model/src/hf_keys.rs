//! A config.json read by field, with errors naming the file and the field: the fields every
//! family shares ([`SharedJson`]), and what a family reads its own with ([`HfKeys`],
//! `Family::hf_params`).

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value as Json;

use crate::error::{ModelError, Result};

/// The fields of `config.json` every family reads; absent and `null` are both `None`. Unknown
/// fields are ignored, as transformers' configs carry many (a family's own are read by its
/// module).
#[derive(Debug, Deserialize)]
pub(crate) struct SharedJson {
    pub(crate) model_type: Option<String>,
    pub(crate) architectures: Option<Vec<String>>,
    pub(crate) quantization_config: Option<QuantizationJson>,
    pub(crate) hidden_act: Option<String>,
    /// Gemma's name for `hidden_act`.
    pub(crate) hidden_activation: Option<String>,
    pub(crate) hidden_size: Option<usize>,
    pub(crate) intermediate_size: Option<usize>,
    pub(crate) num_hidden_layers: Option<usize>,
    pub(crate) num_attention_heads: Option<usize>,
    pub(crate) num_key_value_heads: Option<usize>,
    pub(crate) head_dim: Option<usize>,
    pub(crate) vocab_size: Option<usize>,
    pub(crate) rms_norm_eps: Option<f64>,
    pub(crate) rope_theta: Option<f64>,
    pub(crate) rope_scaling: Option<RopeScalingJson>,
    /// transformers 5's place for the rope: its theta and its scaling in one object.
    pub(crate) rope_parameters: Option<RopeScalingJson>,
    pub(crate) max_position_embeddings: Option<usize>,
    /// What a window means is the family's: Mistral's and qwen's windowed attention, Gemma's
    /// and gpt-oss's local layers.
    pub(crate) sliding_window: Option<usize>,
    /// qwen: whether `sliding_window` applies.
    pub(crate) use_sliding_window: Option<bool>,
    pub(crate) tie_word_embeddings: Option<bool>,
}

/// `quantization_config`: a family reads it only where it says so (gpt-oss's MXFP4 experts).
#[derive(Debug, Deserialize)]
pub(crate) struct QuantizationJson {
    pub(crate) quant_method: Option<String>,
}

/// `rope_scaling`; newer configs say `rope_type`, older ones `type`.
#[derive(Debug, Deserialize)]
pub(crate) struct RopeScalingJson {
    /// `rope_parameters` only.
    pub(crate) rope_theta: Option<f64>,
    pub(crate) rope_type: Option<String>,
    #[serde(rename = "type")]
    pub(crate) legacy_type: Option<String>,
    pub(crate) factor: Option<f64>,
    pub(crate) low_freq_factor: Option<f64>,
    pub(crate) high_freq_factor: Option<f64>,
    pub(crate) original_max_position_embeddings: Option<usize>,
    // YaRN
    pub(crate) beta_fast: Option<f64>,
    pub(crate) beta_slow: Option<f64>,
    pub(crate) attention_factor: Option<f64>,
    pub(crate) truncate: Option<bool>,
    pub(crate) mscale: Option<f64>,
    pub(crate) mscale_all_dim: Option<f64>,
}

/// Errors naming the file and the field.
pub(crate) struct Fields<'a> {
    pub path: &'a Path,
}

impl Fields<'_> {
    pub(crate) fn err(&self, key: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Metadata {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn required<T>(&self, key: &str, value: Option<T>) -> Result<T> {
        value.ok_or_else(|| self.err(key, "not present"))
    }

    pub(crate) fn unsupported(&self, what: String) -> ModelError {
        ModelError::Unsupported {
            path: self.path.to_path_buf(),
            what,
        }
    }

    /// `json` read as `T`, a type error naming the field.
    pub(crate) fn parse<T: DeserializeOwned>(&self, json: &Json) -> Result<T> {
        serde_path_to_error::deserialize(json)
            .map_err(|e| self.err(&e.path().to_string(), e.inner().to_string()))
    }
}

/// A config.json as a family reads its own fields (`Family::hf_params`), with
/// the readers of what families share.
pub(crate) struct HfKeys<'a> {
    pub fields: Fields<'a>,
    pub json: &'a Json,
    pub shared: &'a SharedJson,
}

impl HfKeys<'_> {
    pub(crate) fn shared(&self) -> &SharedJson {
        self.shared
    }

    /// The family's own fields, as its struct `T` declares them.
    pub(crate) fn family_fields<T: DeserializeOwned>(&self) -> Result<T> {
        self.fields.parse(self.json)
    }

    pub(crate) fn err(&self, key: &str, reason: impl Into<String>) -> ModelError {
        self.fields.err(key, reason)
    }

    pub(crate) fn unsupported(&self, what: String) -> ModelError {
        self.fields.unsupported(what)
    }

    pub(crate) fn required<T>(&self, key: &str, value: Option<T>) -> Result<T> {
        self.fields.required(key, value)
    }

    /// qwen's windowed attention: `sliding_window` where `use_sliding_window` says so.
    pub(crate) fn qwen_window(&self) -> Option<usize> {
        self.shared
            .sliding_window
            .filter(|_| self.shared.use_sliding_window.unwrap_or(false))
    }

    /// `layer_types`: one `sliding_attention` (local, `true`) or `full_attention` a layer.
    pub(crate) fn layer_types(&self, types: &[String], num_layers: usize) -> Result<Vec<bool>> {
        if types.len() != num_layers {
            return Err(self.err(
                "layer_types",
                format!("{} types for {num_layers} layers", types.len()),
            ));
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(self.err(
                    "layer_types",
                    format!("`{other}` (expected sliding_attention or full_attention)"),
                )),
            })
            .collect()
    }
}
