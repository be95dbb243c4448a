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
use serde_json::Value as Json;

use sluice_tokenizer::Tokenizer;

use crate::arch::HfExpertLayout;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::hf_config::parse_config;
use crate::load::{check_shape, ExpertMatrices, LoadOptions, Weight, WeightSource};
use crate::model::LlamaModel;
use crate::moe::Expert;
use crate::weights::{Linear, LinearOptions};
use sluice_kernels::QuantFormat;

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
        let config_eos = token_ids(crate::hf_config::text_config(&json).get("eos_token_id"));
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

    fn weights(&self) -> HfWeights<'_> {
        HfWeights { dir: self }
    }
}

impl LlamaModel {
    /// A Hugging Face checkpoint: safetensors in f32, f16 or bf16 (converted on the CPU).
    pub fn from_hf(dir: &HfModelDir, options: &LoadOptions) -> Result<Self> {
        let config = dir.config().clone();
        let mut source = dir.weights();
        Self::build(config, &mut source, options)
    }
}

/// The safetensors files of a checkpoint and which one holds each tensor.
struct Shards {
    files: Vec<(PathBuf, MmapedSafetensors)>,
    routing: HashMap<String, usize>,
    /// The text model's tensors are under `model.language_model.` (a multimodal checkpoint's
    /// text part, as transformers 5 and the Qwen3.5 releases write it; the vision tower's
    /// `model.visual.` is not read).
    language_model: bool,
}

impl Shards {
    /// The files `model.safetensors.index.json` lists; else `model.safetensors`; else every
    /// `*.safetensors` of the directory.
    // Memory-mapping a file is unsafe in candle's API (another process could change it); this
    // is the one place sluice maps safetensors.
    #[allow(unsafe_code)]
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
        let language_model = !routing.contains_key("model.embed_tokens.weight")
            && routing.contains_key("model.language_model.embed_tokens.weight");
        Ok(Self {
            files,
            routing,
            language_model,
        })
    }

    /// Where tensor `name` (a text model's name) is stored in this checkpoint.
    fn stored_name(&self, name: &str) -> String {
        match name.strip_prefix("model.") {
            Some(rest) if self.language_model => format!("model.language_model.{rest}"),
            _ => name.to_string(),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.routing.contains_key(&self.stored_name(name))
    }
}

/// The checkpoint's tensors for [`LlamaModel`]'s builder.
struct HfWeights<'a> {
    dir: &'a HfModelDir,
}

impl HfWeights<'_> {
    /// The name `w` has in this checkpoint: transformers' current one, or for a router the
    /// `block_sparse_moe.gate` of Mixtral checkpoints written before transformers 5.
    fn name(&self, w: Weight) -> String {
        let name = self.dir.config.architecture.family().hf_tensor_name(w);
        if let Weight::Router(i) = w {
            let legacy = format!("model.layers.{i}.block_sparse_moe.gate.weight");
            if !self.dir.shards.contains(&name) && self.dir.shards.contains(&legacy) {
                return legacy;
            }
        }
        name
    }

    /// `w` on the CPU in the file's element type, checked to have `shape`.
    /// `w` on the CPU, made what the family's GGUF files hold (`Family::hf_to_gguf`), checked
    /// to have `shape` as the checkpoint stores it.
    fn read(&self, w: Weight, shape: &[usize]) -> Result<Tensor> {
        let config = &self.dir.config;
        let family = config.architecture.family();
        let t = self.read_named(self.name(w), &family.hf_stored_shape(w, shape, config))?;
        family.hf_to_gguf(w, t, config)
    }

    /// Tensor `name` on the CPU in the file's element type, checked to have `shape`.
    fn read_named(&self, name: String, shape: &[usize]) -> Result<Tensor> {
        let shards = &self.dir.shards;
        let name = shards.stored_name(&name);
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

impl HfWeights<'_> {
    /// Tensor `name`'s bytes as stored, checked to be `u8` of `shape` (gpt-oss's MXFP4 blocks
    /// and scales).
    fn bytes_named(&self, name: &str, shape: &[usize]) -> Result<&[u8]> {
        let shards = &self.dir.shards;
        let name = &shards.stored_name(name);
        let Some(&i) = shards.routing.get(name) else {
            return Err(ModelError::MissingTensor {
                path: self.dir.dir.clone(),
                name: name.to_string(),
            });
        };
        let (path, st) = &shards.files[i];
        let view = st.get(name).map_err(|e| ModelError::Tensor {
            path: path.clone(),
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        check_shape(path, name, view.shape(), shape)?;
        if view.dtype() != safetensors::Dtype::U8 {
            return Err(ModelError::Unsupported {
                path: path.clone(),
                what: format!(
                    "element type {:?} of tensor `{name}` (MXFP4 blocks and scales are u8)",
                    view.dtype()
                ),
            });
        }
        Ok(view.data())
    }

    /// gpt-oss's experts: MXFP4 (`mlp.experts.{gate_up,down}_proj_{blocks,scales}`, as the
    /// released checkpoints hold them) or dequantized (`mlp.experts.gate_up_proj` `[experts,
    /// hidden, 2 * inter]` and `mlp.experts.down_proj` `[experts, inter, hidden]`, transposed
    /// against the usual layout). Either way a gate_up's rows (columns, dequantized) alternate
    /// gate and up; sluice stacks the gates over the ups.
    fn gpt_oss_experts(
        &self,
        layer: usize,
        shape: ExpertMatrices,
        options: &LinearOptions,
    ) -> Result<Vec<Expert>> {
        let ExpertMatrices {
            experts,
            inter,
            hidden,
        } = shape;
        let at = |t: &str| format!("model.layers.{layer}.mlp.experts.{t}");
        if self.dir.shards.contains(&at("gate_up_proj_blocks")) {
            let (gate_up, down) = (
                Mxfp4Experts::read(self, &at("gate_up_proj"), experts, 2 * inter, hidden)?,
                Mxfp4Experts::read(self, &at("down_proj"), experts, hidden, inter)?,
            );
            return (0..experts)
                .map(|e| {
                    // Row r of the stack: gate r (the file's row 2r), then up r (2r + 1).
                    let interleaved = |r: usize| {
                        if r < inter {
                            2 * r
                        } else {
                            2 * (r - inter) + 1
                        }
                    };
                    Ok(Expert {
                        gate_up: gate_up.linear(e, interleaved, options)?,
                        down: down.linear(e, |r| r, options)?,
                        gate_up_bias: None,
                        down_bias: None,
                    })
                })
                .collect();
        }
        let gate_up = self
            .read_named(at("gate_up_proj"), &[experts, hidden, 2 * inter])?
            .to_dtype(DType::F32)?;
        let down = self
            .read_named(at("down_proj"), &[experts, inter, hidden])?
            .to_dtype(DType::F32)?;
        (0..experts)
            .map(|e| {
                // [hidden, 2 * inter] -> [inter, 2, hidden]: gate rows at 0, up rows at 1.
                let pairs = gate_up.get(e)?.t()?.reshape((inter, 2, hidden))?;
                let stacked = Tensor::cat(&[pairs.get_on_dim(1, 0)?, pairs.get_on_dim(1, 1)?], 0)?;
                Ok(Expert {
                    gate_up: Linear::from_tensor(stacked.contiguous()?, None, options)?,
                    down: Linear::from_tensor(down.get(e)?.t()?.contiguous()?, None, options)?,
                    gate_up_bias: None,
                    down_bias: None,
                })
            })
            .collect()
    }
}

/// One MXFP4 expert tensor of a gpt-oss checkpoint: `{name}_blocks` `[experts, rows, cols /
/// 32, 16]` (two E2M1 codes a byte, element 2i in the low nibble, 2i + 1 in the high) and
/// `{name}_scales` `[experts, rows, cols / 32]` (E8M0).
struct Mxfp4Experts<'a> {
    blocks: &'a [u8],
    scales: &'a [u8],
    rows: usize,
    cols: usize,
}

impl<'a> Mxfp4Experts<'a> {
    fn read(
        weights: &'a HfWeights<'_>,
        name: &str,
        experts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        if !cols.is_multiple_of(32) {
            return Err(ModelError::Tensor {
                path: weights.dir.dir.clone(),
                name: format!("{name}_blocks"),
                reason: format!("{cols} columns are not whole MXFP4 blocks of 32"),
            });
        }
        let per_row = cols / 32;
        Ok(Self {
            blocks: weights
                .bytes_named(&format!("{name}_blocks"), &[experts, rows, per_row, 16])?,
            scales: weights.bytes_named(&format!("{name}_scales"), &[experts, rows, per_row])?,
            rows,
            cols,
        })
    }

    /// Expert `e` as a layer whose row r is the file's row `source(r)`, each row repacked
    /// into GGML's MXFP4 blocks (a scale byte, then 16 bytes whose low nibbles are elements
    /// 0..16 and high nibbles 16..32), the layout sluice's MXFP4 kernels read. The codes and
    /// scales are the same numbers: nothing is re-quantized.
    fn linear(
        &self,
        e: usize,
        source: impl Fn(usize) -> usize,
        options: &LinearOptions,
    ) -> Result<Linear> {
        let per_row = self.cols / 32;
        let row_bytes = per_row * 17;
        let mut packed = vec![0u8; self.rows * row_bytes];
        for (r, out) in packed.chunks_exact_mut(row_bytes).enumerate() {
            let row = e * self.rows + source(r);
            let blocks = &self.blocks[row * per_row * 16..][..per_row * 16];
            let scales = &self.scales[row * per_row..][..per_row];
            for ((out, block), &scale) in out
                .chunks_exact_mut(17)
                .zip(blocks.chunks_exact(16))
                .zip(scales)
            {
                out[0] = scale;
                let code = |i: usize| (block[i / 2] >> (4 * (i % 2))) & 0x0f;
                for j in 0..16 {
                    out[1 + j] = code(j) | (code(j + 16) << 4);
                }
            }
        }
        Linear::from_block_rows(
            QuantFormat::Mxfp4,
            self.rows,
            self.cols,
            |r| &packed[r * row_bytes..][..row_bytes],
            options,
        )
    }
}

impl WeightSource for HfWeights<'_> {
    fn path(&self) -> &Path {
        &self.dir.dir
    }

    fn has(&self, w: Weight) -> bool {
        self.dir.shards.contains(&self.name(w))
    }

    /// The three layouts transformers has written: every expert's own matrices
    /// (`mlp.experts.E.{gate,up,down}_proj.weight`; Mixtral's `block_sparse_moe.experts.E.
    /// {w1,w3,w2}.weight`), or since transformers 5 one 3-D tensor for all gate and up
    /// matrices and one for the downs (`mlp.experts.gate_up_proj` `[experts, 2 * inter,
    /// hidden]`, gate rows first, and `mlp.experts.down_proj` `[experts, hidden, inter]`).
    fn experts(
        &mut self,
        layer: usize,
        shape: ExpertMatrices,
        options: &LinearOptions,
    ) -> Result<Vec<Expert>> {
        let ExpertMatrices {
            experts,
            inter,
            hidden,
        } = shape;
        let layout = self
            .dir
            .config
            .architecture
            .traits()
            .experts
            .as_ref()
            .map(|e| e.hf_layout);
        if layout == Some(HfExpertLayout::GptOss) {
            return self.gpt_oss_experts(layer, shape, options);
        }
        let at = |t: &str| format!("model.layers.{layer}.{t}");
        let fused = at("mlp.experts.gate_up_proj");
        let shards = &self.dir.shards;
        if shards.contains(&fused) {
            let gate_up = self
                .read_named(fused, &[experts, 2 * inter, hidden])?
                .to_dtype(DType::F32)?;
            let down = self
                .read_named(at("mlp.experts.down_proj"), &[experts, hidden, inter])?
                .to_dtype(DType::F32)?;
            return (0..experts)
                .map(|e| {
                    Ok(Expert {
                        gate_up: Linear::from_tensor(gate_up.get(e)?, None, options)?,
                        down: Linear::from_tensor(down.get(e)?, None, options)?,
                        gate_up_bias: None,
                        down_bias: None,
                    })
                })
                .collect();
        }
        let mixtral = shards.contains(&at("block_sparse_moe.experts.0.w1.weight"));
        let names = |e: usize| {
            if mixtral {
                let p = |w: &str| at(&format!("block_sparse_moe.experts.{e}.{w}.weight"));
                (p("w1"), p("w3"), p("w2"))
            } else {
                let p = |w: &str| at(&format!("mlp.experts.{e}.{w}_proj.weight"));
                (p("gate"), p("up"), p("down"))
            }
        };
        (0..experts)
            .map(|e| {
                let (gate, up, down) = names(e);
                let gate = self
                    .read_named(gate, &[inter, hidden])?
                    .to_dtype(DType::F32)?;
                let up = self
                    .read_named(up, &[inter, hidden])?
                    .to_dtype(DType::F32)?;
                let down = self.read_named(down, &[hidden, inter])?;
                Ok(Expert {
                    gate_up: Linear::from_tensor(Tensor::cat(&[gate, up], 0)?, None, options)?,
                    down: Linear::from_tensor(down, None, options)?,
                    gate_up_bias: None,
                    down_bias: None,
                })
            })
            .collect()
    }

    fn dense(&mut self, w: Weight, shape: &[usize], device: &Device) -> Result<Tensor> {
        if let (Weight::ExpertGateBias(_) | Weight::ExpertUpBias(_), &[experts, inter]) = (w, shape)
        {
            // gpt-oss's `gate_up_proj_bias` `[experts, 2 * inter]` alternates gate and up.
            let pairs = self
                .read(w, &[experts, 2 * inter])?
                .to_dtype(DType::F32)?
                .reshape((experts, inter, 2))?;
            let half = usize::from(matches!(w, Weight::ExpertUpBias(_)));
            return Ok(pairs.get_on_dim(2, half)?.contiguous()?.to_device(device)?);
        }
        let mut t = self.read(w, shape)?.to_dtype(DType::F32)?;
        if self.dir.config.architecture.traits().hf_norms_minus_one && w.is_norm() {
            // Gemma's RMSNorm multiplies by `1 + w` (transformers' Gemma3RMSNorm): the one
            // added once here, as llama.cpp's converter adds it into GGUF files.
            t = (t + 1.0)?;
        }
        Ok(t.to_device(device)?)
    }

    fn linear(
        &mut self,
        parts: &[(Weight, usize)],
        cols: usize,
        bias: Option<Tensor>,
        options: &LinearOptions,
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

    fn lm_head(
        &mut self,
        tied: bool,
        shape: [usize; 2],
        options: &LinearOptions,
    ) -> Result<Linear> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eos_ids_are_an_id_or_a_list() {
        assert_eq!(token_ids(Some(&serde_json::json!(7))), vec![7]);
        assert_eq!(token_ids(Some(&serde_json::json!([1, 2]))), vec![1, 2]);
        assert_eq!(token_ids(Some(&Json::Null)), Vec::<u32>::new());
        assert_eq!(token_ids(None), Vec::<u32>::new());
    }
}
