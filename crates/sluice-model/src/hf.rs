//! Hugging Face model directories: `config.json` (hyper-parameters), `tokenizer.json` with
//! `tokenizer_config.json` (chat template, BOS/EOS), `generation_config.json` (further EOS ids),
//! and the weights in `model.safetensors` or in shards listed by `model.safetensors.index.json`.
//!
//! Hugging Face checkpoints store Q/K rows in their original order, which is the order the
//! forward uses (GGUF llama files are permuted by llama.cpp and un-permuted at load), so they
//! load as they are. Weights may be f32, f16 or bf16; they are converted on the CPU to what
//! [`LoadOptions::weights`] asks for (candle has no bf16 gemm on CPU).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde_json::{Map, Value as Json};

use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::error::{ModelError, Result};
use crate::model::LoadOptions;
use crate::source::{check_shape, Weight, WeightSource};
use crate::tokenizer::Tokenizer;
use crate::weights::Linear;

pub const CONFIG_FILE: &str = "config.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

/// An opened Hugging Face model directory: its parsed `config.json` and its safetensors files,
/// memory-mapped (tensors are read when the model is built).
pub struct HfModelDir {
    dir: PathBuf,
    config: ModelConfig,
    /// `eos_token_id` of config.json, which some checkpoints set there only.
    config_eos: Vec<u32>,
    shards: Shards,
}

impl std::fmt::Debug for HfModelDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfModelDir")
            .field("dir", &self.dir)
            .field("config", &self.config)
            .field("shards", &self.shards.files.len())
            .finish_non_exhaustive()
    }
}

impl HfModelDir {
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let not_a_dir = |reason: String| ModelError::HfDirectory {
            path: dir.clone(),
            reason,
        };
        if !dir.is_dir() {
            return Err(not_a_dir("not a directory".into()));
        }
        let config_path = dir.join(CONFIG_FILE);
        if !config_path.is_file() {
            return Err(not_a_dir(format!("no {CONFIG_FILE}")));
        }
        let json = read_json(&config_path)?;
        let shards = Shards::open(&dir)?;
        let config = parse_config(
            &config_path,
            &json,
            shards.contains(&Weight::Output.hf_name()),
        )?;
        let config_eos = token_ids(json.get("eos_token_id"));
        Ok(Self {
            dir,
            config,
            config_eos,
            shards,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Names of every tensor in the checkpoint.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.shards.routing.keys().map(String::as_str)
    }

    /// `tokenizer.json`, with `tokenizer_config.json` beside it (chat template, BOS/EOS,
    /// `add_bos_token`); every `eos_token_id` of `generation_config.json` and `config.json` (an
    /// id or a list) ends generation too.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        let path = self.dir.join(TOKENIZER_FILE);
        if !path.is_file() {
            return Err(ModelError::HfDirectory {
                path: self.dir.clone(),
                reason: format!("no {TOKENIZER_FILE}"),
            });
        }
        let mut tokenizer = Tokenizer::from_file(&path)?;
        let generation = self.dir.join(GENERATION_CONFIG_FILE);
        if generation.is_file() {
            let json = read_json(&generation)?;
            tokenizer.add_eos_token_ids(token_ids(json.get("eos_token_id")));
        }
        tokenizer.add_eos_token_ids(self.config_eos.iter().copied());
        Ok(tokenizer)
    }

    pub(crate) fn weights(&self) -> HfWeights<'_> {
        HfWeights { dir: self }
    }
}

/// The safetensors files of a checkpoint and which one holds each tensor.
struct Shards {
    files: Vec<(PathBuf, MmapedSafetensors)>,
    routing: HashMap<String, usize>,
}

impl Shards {
    /// The files `model.safetensors.index.json` lists; else `model.safetensors`; else every
    /// `*.safetensors` of the directory.
    fn open(dir: &Path) -> Result<Self> {
        let index = dir.join(WEIGHTS_INDEX_FILE);
        let paths: Vec<PathBuf> = if index.is_file() {
            let json = read_json(&index)?;
            let Some(map) = json.get("weight_map").and_then(Json::as_object) else {
                return Err(ModelError::InvalidFile {
                    path: index,
                    reason: "no `weight_map` object".into(),
                });
            };
            let mut names: Vec<&str> = Vec::new();
            for (tensor, file) in map {
                let Some(file) = file.as_str() else {
                    return Err(ModelError::InvalidFile {
                        path: index,
                        reason: format!("`weight_map.{tensor}` is not a file name"),
                    });
                };
                if !names.contains(&file) {
                    names.push(file);
                }
            }
            names.sort_unstable();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else if dir.join(WEIGHTS_FILE).is_file() {
            vec![dir.join(WEIGHTS_FILE)]
        } else {
            let entries = std::fs::read_dir(dir).map_err(|source| ModelError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
            let mut paths: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
                .collect();
            paths.sort();
            paths
        };
        if paths.is_empty() {
            return Err(ModelError::HfDirectory {
                path: dir.to_path_buf(),
                reason: format!(
                    "no weights ({WEIGHTS_FILE}, {WEIGHTS_INDEX_FILE} or *.safetensors)"
                ),
            });
        }
        let mut files = Vec::with_capacity(paths.len());
        let mut routing = HashMap::new();
        for (i, path) in paths.into_iter().enumerate() {
            if !path.is_file() {
                return Err(ModelError::HfDirectory {
                    path: dir.to_path_buf(),
                    reason: format!(
                        "{WEIGHTS_INDEX_FILE} names {}, which is missing",
                        path.file_name().unwrap_or_default().to_string_lossy()
                    ),
                });
            }
            // SAFETY: the mapping is read-only and lives as long as the model loads; as with
            // any memory-mapped model file, it must not be truncated while being read.
            let st =
                unsafe { MmapedSafetensors::new(&path) }.map_err(|e| ModelError::InvalidFile {
                    path: path.clone(),
                    reason: format!("not a valid safetensors file: {e}"),
                })?;
            for (name, _) in st.tensors() {
                routing.insert(name, i);
            }
            files.push((path, st));
        }
        Ok(Self { files, routing })
    }

    fn contains(&self, name: &str) -> bool {
        self.routing.contains_key(name)
    }
}

/// The checkpoint's tensors for [`crate::LlamaModel`]'s builder.
pub(crate) struct HfWeights<'a> {
    dir: &'a HfModelDir,
}

impl HfWeights<'_> {
    /// `w` on the CPU in the file's element type, checked to have `shape`.
    fn read(&self, w: Weight, shape: &[usize]) -> Result<Tensor> {
        let name = w.hf_name();
        let shards = &self.dir.shards;
        let Some(&i) = shards.routing.get(&name) else {
            return Err(ModelError::MissingTensor {
                path: self.dir.dir.clone(),
                name,
            });
        };
        let (path, st) = &shards.files[i];
        let err = |e: candle_core::Error| ModelError::Tensor {
            path: path.clone(),
            name: name.clone(),
            reason: e.to_string(),
        };
        let view = st.get(&name).map_err(err)?;
        check_shape(path, &name, view.shape(), shape)?;
        let t = st.load(&name, &Device::Cpu).map_err(err)?;
        match t.dtype() {
            DType::F32 | DType::F16 | DType::BF16 => Ok(t),
            other => Err(ModelError::Unsupported {
                path: path.clone(),
                what: format!(
                    "element type {other:?} of tensor `{name}` (supported: f32, f16, bf16)"
                ),
            }),
        }
    }
}

impl WeightSource for HfWeights<'_> {
    fn path(&self) -> &Path {
        &self.dir.dir
    }

    fn has(&self, w: Weight) -> bool {
        self.dir.shards.contains(&w.hf_name())
    }

    fn dense(&mut self, w: Weight, shape: &[usize], device: &Device) -> Result<Tensor> {
        Ok(self
            .read(w, shape)?
            .to_dtype(DType::F32)?
            .to_device(device)?)
    }

    fn linear(
        &mut self,
        parts: &[(Weight, usize)],
        cols: usize,
        bias: Option<Tensor>,
        options: &LoadOptions,
    ) -> Result<Linear> {
        let mut ws = Vec::with_capacity(parts.len());
        for &(w, rows) in parts {
            ws.push(self.read(w, &[rows, cols])?.to_dtype(DType::F32)?);
        }
        let w = match ws.len() {
            1 => ws.pop().expect("one part"),
            _ => Tensor::cat(&ws, 0)?,
        };
        Linear::from_tensor(w, bias, options)
    }

    fn lm_head(&mut self, tied: bool, shape: [usize; 2], options: &LoadOptions) -> Result<Linear> {
        let w = self.read(if tied { Weight::Embed } else { Weight::Output }, &shape)?;
        Linear::from_tensor(w, None, options)
    }
}

fn read_json(path: &Path) -> Result<Json> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::InvalidFile {
        path: path.to_path_buf(),
        reason: format!("invalid JSON: {e}"),
    })
}

/// `eos_token_id` and friends: an id, a list of ids, or null.
fn token_ids(value: Option<&Json>) -> Vec<u32> {
    let id = |v: &Json| v.as_u64().and_then(|id| u32::try_from(id).ok());
    match value {
        Some(Json::Array(items)) => items.iter().filter_map(id).collect(),
        Some(v) => id(v).into_iter().collect(),
        None => Vec::new(),
    }
}

/// Typed access to `config.json` fields, with errors naming the file and the field.
struct Fields<'a> {
    path: &'a Path,
    map: &'a Map<String, Json>,
}

impl Fields<'_> {
    fn err(&self, key: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Metadata {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    /// The value of `key`, `None` when absent or null.
    fn get(&self, key: &str) -> Option<&Json> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(key, format!("expected a non-negative integer, found {v}"))
                }),
        }
    }

    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.err(key, "not present"))
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a number, found {v}"))),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected true or false, found {v}"))),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a string, found {v}"))),
        }
    }
}

/// The architecture a config.json names: `model_type`, else its `architectures` class.
fn architecture(f: &Fields<'_>) -> Result<Architecture> {
    let name = match f.opt_str("model_type")? {
        Some(t) => t.to_string(),
        None => {
            let class = f
                .get("architectures")
                .and_then(|a| a.get(0))
                .and_then(Json::as_str)
                .ok_or_else(|| f.err("model_type", "not present (nor `architectures`)"))?;
            class
                .strip_suffix("ForCausalLM")
                .unwrap_or(class)
                .to_ascii_lowercase()
        }
    };
    Architecture::from_name(&name).ok_or_else(|| ModelError::Unsupported {
        path: f.path.to_path_buf(),
        what: format!(
            "architecture `{name}` (model_type; supported: {})",
            Architecture::NAMES.join(", ")
        ),
    })
}

/// Hyper-parameters from a parsed config.json. `has_lm_head`: whether the checkpoint holds
/// `lm_head.weight`, which decides tied embeddings when the config does not say.
pub fn parse_config(path: &Path, json: &Json, has_lm_head: bool) -> Result<ModelConfig> {
    let Some(map) = json.as_object() else {
        return Err(ModelError::InvalidFile {
            path: path.to_path_buf(),
            reason: "expected a JSON object".into(),
        });
    };
    let f = Fields { path, map };
    let architecture = architecture(&f)?;
    if f.get("quantization_config").is_some() {
        return Err(ModelError::Unsupported {
            path: path.to_path_buf(),
            what: "quantized checkpoint (`quantization_config`): use f32, f16 or bf16 weights, or a GGUF file".into(),
        });
    }
    if let Some(act) = f.opt_str("hidden_act")? {
        if !matches!(act, "silu" | "swish") {
            return Err(ModelError::Unsupported {
                path: path.to_path_buf(),
                what: format!("hidden_act `{act}` (supported: silu)"),
            });
        }
    }
    let hidden_size = f.usize("hidden_size")?;
    let num_heads = f.usize("num_attention_heads")?;
    let num_kv_heads = f.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
    if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
        return Err(f.err(
            "num_key_value_heads",
            format!("{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads"),
        ));
    }
    let head_dim = match f.opt_usize("head_dim")? {
        Some(d) => d,
        None => hidden_size / num_heads,
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(f.err("head_dim", format!("head_dim {head_dim} must be even")));
    }
    let rope_theta = f.opt_f64("rope_theta")?.unwrap_or(10_000.0);
    let rope_scaling = rope_scaling(&f, head_dim, rope_theta)?;
    let mut max_position_embeddings = f.opt_usize("max_position_embeddings")?.unwrap_or(2048);
    // Attention limited to a window only differs from full attention past the window; serve
    // contexts up to it. Mistral says so with `sliding_window` alone, qwen2/qwen3 with
    // `use_sliding_window`.
    let windowed = match architecture {
        Architecture::Llama => true,
        Architecture::Qwen2 | Architecture::Qwen3 => {
            f.opt_bool("use_sliding_window")?.unwrap_or(false)
        }
    };
    if let Some(window) = f.opt_usize("sliding_window")?.filter(|_| windowed) {
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
    let tie_word_embeddings = f.opt_bool("tie_word_embeddings")?.unwrap_or(!has_lm_head);
    Ok(ModelConfig {
        architecture,
        hidden_size,
        intermediate_size: f.usize("intermediate_size")?,
        num_layers: f.usize("num_hidden_layers")?,
        num_heads,
        num_kv_heads,
        head_dim,
        vocab_size: f.usize("vocab_size")?,
        rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: rope_theta as f32,
        rope_scaling,
        max_position_embeddings,
        tie_word_embeddings,
    })
}

/// `rope_scaling`: absent, null or `default` for none; `linear` (`factor`); `llama3`
/// (`factor`, `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`),
/// turned into per-frequency divisors exactly as llama.cpp's converter writes `rope_freqs`.
fn rope_scaling(f: &Fields<'_>, head_dim: usize, theta: f64) -> Result<Option<RopeScaling>> {
    const KEY: &str = "rope_scaling";
    let Some(value) = f.get(KEY) else {
        return Ok(None);
    };
    let Some(map) = value.as_object() else {
        return Err(f.err(KEY, format!("expected an object, found {value}")));
    };
    let sub = Fields { path: f.path, map };
    let field = |k: &str| format!("{KEY}.{k}");
    // Newer configs say `rope_type`, older ones `type`.
    let kind = match sub.opt_str("rope_type")? {
        Some(k) => k,
        None => sub
            .opt_str("type")?
            .ok_or_else(|| f.err(&field("rope_type"), "not present"))?,
    };
    let factor = || -> Result<f64> {
        match sub.opt_f64("factor")? {
            Some(x) if x > 0.0 => Ok(x),
            Some(x) => Err(f.err(&field("factor"), format!("must be positive, found {x}"))),
            None => Err(f.err(&field("factor"), "not present")),
        }
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: factor()? as f32,
        })),
        "llama3" => {
            let factor = factor()?;
            let low = sub.opt_f64("low_freq_factor")?.unwrap_or(1.0);
            let high = sub.opt_f64("high_freq_factor")?.unwrap_or(4.0);
            let original = sub
                .opt_usize("original_max_position_embeddings")?
                .unwrap_or(8192) as f64;
            if high <= low {
                return Err(f.err(
                    &field("high_freq_factor"),
                    format!("must exceed low_freq_factor ({high} <= {low})"),
                ));
            }
            Ok(Some(RopeScaling::FreqFactors(llama3_factors(
                head_dim, theta, factor, low, high, original,
            ))))
        }
        other => Err(ModelError::Unsupported {
            path: f.path.to_path_buf(),
            what: format!("rope_scaling type `{other}` (supported: default, linear, llama3)"),
        }),
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
    fn bad_configs_name_the_field() {
        let msg = |json: String| config(&json).unwrap_err().to_string();
        let m = msg(format!(r#"{{"model_type": "gemma3", {BASE}}}"#));
        assert!(
            m.contains("/m/config.json") && m.contains("`gemma3`") && m.contains("qwen3"),
            "{m}"
        );
        let m = msg(r#"{"model_type": "llama", "hidden_size": 64}"#.into());
        assert!(
            m.contains("intermediate_size") || m.contains("num_attention_heads"),
            "{m}"
        );
        let m = msg(format!(
            r#"{{"model_type": "llama", {BASE}, "rope_scaling": {{"type": "yarn", "factor": 2.0}}}}"#
        ));
        assert!(m.contains("`yarn`"), "{m}");
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

    #[test]
    fn eos_ids_are_an_id_or_a_list() {
        assert_eq!(token_ids(Some(&serde_json::json!(7))), vec![7]);
        assert_eq!(token_ids(Some(&serde_json::json!([1, 2]))), vec![1, 2]);
        assert_eq!(token_ids(Some(&Json::Null)), Vec::<u32>::new());
        assert_eq!(token_ids(None), Vec::<u32>::new());
    }
}
