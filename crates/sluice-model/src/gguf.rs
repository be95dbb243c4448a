//! Reading a GGUF file: its metadata (hyper-parameters, tokenizer) and its tensors, handed to
//! the layer builder as a [`WeightSource`].

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;
use memmap2::Mmap;

use candle_core::Tensor;
use sluice_tokenizer::{GgufMetadata, Tokenizer};

use crate::arch::SharedParams;
use crate::config::{Architecture, ModelConfig, Pooling, RopeScaling, Yarn};
use crate::embedding::Embedding;
use crate::error::{ModelError, Result};
use crate::gguf_keys::{int_value, GgufKeys};
use crate::load::{check_shape, ExpertMatrices, LoadOptions, Weight, WeightSource};
use crate::model::LlamaModel;
use crate::weights::{GgufMatrix, Linear, LinearOptions, RowOrder, WeightsKind};
use sluice_kernels::QuantFormat;

/// An opened GGUF file: the parsed header, and the file mapped into memory. Tensors are read
/// straight from the map (regrouped into panels, or copied); the map is dropped with the
/// file, so after loading the page cache holds the file, not the process.
pub struct GgufFile {
    pub path: PathBuf,
    pub content: Content,
    /// Tensors held in MXFP4 (gpt-oss's experts): `content` lists them as F32 (candle 0.11
    /// has no MXFP4 type), so they are read only through [`GgufFile::mxfp4_bytes`].
    mxfp4: HashSet<String>,
    map: Mmap,
    /// Kept to map the file afresh ([`GgufFile::release_pages`]).
    file: File,
}

/// A shard of a split GGUF (llama.cpp's `split.count` > 1) holds only some tensors; sluice
/// loads one file, so it says how to make one rather than failing on the first missing tensor.
fn refuse_split(path: &Path, content: &Content) -> Result<()> {
    let count = match content.metadata.get("split.count") {
        Some(Value::U16(n)) => u64::from(*n),
        Some(Value::U32(n)) => u64::from(*n),
        Some(Value::U64(n)) => *n,
        Some(Value::I32(n)) => u64::try_from(*n).unwrap_or(0),
        _ => return Ok(()),
    };
    if count <= 1 {
        return Ok(());
    }
    Err(ModelError::Unsupported {
        path: path.to_path_buf(),
        what: format!(
            "split GGUF ({count} shards): sluice loads one file; merge the shards with \
             llama.cpp's `llama-gguf-split --merge FIRST-SHARD.gguf MERGED.gguf` and serve \
             MERGED.gguf"
        ),
    })
}

impl GgufFile {
    /// Opens and maps the file, and checks every tensor's type, shape and extent against the
    /// file before anything is read: a truncated or inconsistent file is an error naming the
    /// file, the tensor and its type, never a fault from the mapping.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io = |source| ModelError::Io {
            path: path.clone(),
            source,
        };
        let mut file = File::open(&path).map_err(io)?;
        let mut mxfp4 = HashSet::new();
        let content = Content::read(&mut std::io::BufReader::new(&mut file)).or_else(|e| {
            // A header with MXFP4 tensors: candle reads a copy with their type patched.
            if let Some((header, names)) = crate::gguf_header::with_mxfp4_patched(&path) {
                if let Ok(content) = Content::read(&mut std::io::Cursor::new(header)) {
                    mxfp4.extend(names);
                    return Ok(content);
                }
            }
            let reason = match crate::gguf_header::unknown_tensor_type(&path) {
                Some((name, id)) => format!(
                    "tensor `{name}` has GGML type {id}, which sluice does not support (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)"
                ),
                None => e.to_string(),
            };
            Err(ModelError::Gguf {
                path: path.clone(),
                reason,
            })
        })?;
        refuse_split(&path, &content)?;
        let len = file.metadata().map_err(io)?.len();
        check_extents(&path, &content, &mxfp4, len)?;
        // SAFETY: the map is only read, within the extents checked above against the file's
        // length. Like every reader of model files (llama.cpp, candle's safetensors), we rely
        // on nobody truncating or rewriting the file while it is loaded.
        #[allow(unsafe_code)]
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Ok(Self {
            path,
            content,
            mxfp4,
            map,
            file,
        })
    }

    /// Whether tensor `name` is held in MXFP4.
    pub fn is_mxfp4(&self, name: &str) -> bool {
        self.mxfp4.contains(name)
    }

    /// The blocks of MXFP4 tensor `name` and its shape (rows first), from the map; `None` when
    /// it is not an MXFP4 tensor.
    pub(crate) fn mxfp4_bytes(&self, name: &str) -> Option<(Vec<usize>, &[u8])> {
        if !self.is_mxfp4(name) {
            return None;
        }
        let info = self.content.tensor_infos.get(name)?;
        let (start, len) = extent(&self.content, info, true).expect("checked at open");
        Some((
            info.shape.dims().to_vec(),
            &self.map[start as usize..][..len as usize],
        ))
    }

    /// Maps the file afresh and drops the old map: the pages read so far leave this process's
    /// resident memory (they stay in the page cache). Called after each layer, loading holds
    /// at most one layer's weights twice (read from the map, and repacked), not the whole file
    /// (a 9 GB mixture of experts peaked at 19 GB of RSS without).
    pub(crate) fn release_pages(&mut self) -> Result<()> {
        // SAFETY: as for the first map (`open`): read only, within the extents checked there,
        // the file not truncated or rewritten while it loads.
        #[allow(unsafe_code)]
        let map = unsafe { Mmap::map(&self.file) }.map_err(|source| ModelError::Io {
            path: self.path.clone(),
            source,
        })?;
        self.map = map;
        Ok(())
    }

    /// The bytes of tensor `name`, its type and its shape (rows first), from the map.
    fn tensor_bytes(&self, name: &str) -> Result<(GgmlDType, Vec<usize>, &[u8])> {
        if self.is_mxfp4(name) {
            return Err(self.mxfp4_elsewhere(name));
        }
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| ModelError::Gguf {
                path: self.path.clone(),
                reason: format!("tensor `{name}` is missing"),
            })?;
        let (start, len) = extent(&self.content, info, false).expect("checked at open");
        Ok((
            info.ggml_dtype,
            info.shape.dims().to_vec(),
            &self.map[start as usize..][..len as usize],
        ))
    }

    /// The error for an MXFP4 tensor where sluice reads only the experts' in that format.
    fn mxfp4_elsewhere(&self, name: &str) -> ModelError {
        ModelError::Unsupported {
            path: self.path.clone(),
            what: format!(
                "MXFP4 in tensor `{name}`: sluice reads MXFP4 for the experts' matrices \
                 (`ffn_*_exps`), as gpt-oss files hold it"
            ),
        }
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// One tensor, copied out of the map.
    pub fn tensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        let (dtype, dims, bytes) = self.tensor_bytes(name)?;
        let storage = QStorage::from_data(Cow::Borrowed(bytes), device, dtype)?;
        Ok(QTensor::new(storage, dims)?)
    }

    /// The file's metadata by key ([`GgufKeys`], its `{arch}.*` prefix unset).
    fn keys(&self) -> GgufKeys<'_> {
        GgufKeys::new(&self.path, self.metadata(), "")
    }

    fn meta_err(&self, key: &str, reason: impl Into<String>) -> ModelError {
        self.keys().err(key, reason)
    }

    pub fn get_string(&self, key: &str) -> Result<&str> {
        self.keys().get_string(key)
    }

    /// Integer metadata of any width, as GGUF writers disagree on u32 vs u64 vs i32.
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.keys().get_usize(key)
    }

    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.keys().get_f32(key)
    }

    fn opt<T>(&self, key: &str, f: impl Fn(&Self, &str) -> Result<T>) -> Result<Option<T>> {
        if self.metadata().contains_key(key) {
            f(self, key).map(Some)
        } else {
            Ok(None)
        }
    }

    pub fn architecture(&self) -> Result<Architecture> {
        let name = self.get_string("general.architecture")?;
        Architecture::from_name(name).ok_or_else(|| ModelError::Unsupported {
            path: self.path.clone(),
            what: format!(
                "architecture `{name}` (supported: {})",
                Architecture::supported_names().join(", ")
            ),
        })
    }

    /// Hyper-parameters from `{arch}.*` metadata: the keys every family shares here, then the
    /// family's own ([`crate::arch::Family::gguf_params`]). `rope_freqs` is the optional
    /// per-frequency scaling tensor some llama3 GGUFs carry.
    pub fn model_config(&mut self) -> Result<ModelConfig> {
        let architecture = self.architecture()?;
        let arch = self.get_string("general.architecture")?.to_string();
        let key = |k: &str| format!("{arch}.{k}");
        let hidden_size = self.get_usize(&key("embedding_length"))?;
        let num_heads = self.get_usize(&key("attention.head_count"))?;
        let num_kv_heads = self
            .opt(&key("attention.head_count_kv"), Self::get_usize)?
            .unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(self.meta_err(
                &key("attention.head_count_kv"),
                format!("{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads"),
            ));
        }
        let head_dim = match self.opt(&key("attention.key_length"), Self::get_usize)? {
            Some(d) => d,
            None => hidden_size / num_heads,
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(self.meta_err(
                &key("attention.key_length"),
                format!("head_dim {head_dim} must be even"),
            ));
        }
        let vocab_size = match self.opt(&key("vocab_size"), Self::get_usize)? {
            Some(v) => v,
            None => match self.metadata().get("tokenizer.ggml.tokens") {
                Some(Value::Array(tokens)) => tokens.len(),
                _ => self.content.tensor_infos["token_embd.weight"].shape.dims()[0],
            },
        };
        let rope_scaling = self.rope_scaling(&arch, head_dim)?;
        let context_length = self
            .opt(&key("context_length"), Self::get_usize)?
            .unwrap_or(4096);
        let rope_scaling = match rope_scaling {
            Some(RopeScaling::Yarn(y)) if y.original_context == 0 => {
                // llama.cpp's default: the training context.
                Some(RopeScaling::Yarn(Yarn {
                    original_context: context_length,
                    ..y
                }))
            }
            other => other,
        };
        let rope_theta = self
            .opt(&key("rope.freq_base"), Self::get_f32)?
            .unwrap_or(10_000.0);
        let tie_word_embeddings = !self.has_tensor("output.weight");
        let shared = SharedParams {
            hidden_size,
            num_heads,
            head_dim,
            num_layers: self.get_usize(&key("block_count"))?,
            intermediate_size: self.get_usize(&key("feed_forward_length"))?,
            rope_theta,
        };
        let family = architecture
            .family()
            .gguf_params(&GgufKeys::new(&self.path, self.metadata(), &arch), &shared)?;
        let attention_scale = match self.opt(&key("attention.scale"), Self::get_f32)? {
            Some(scale) if !(scale.is_finite() && scale > 0.0) => {
                return Err(
                    self.meta_err(&key("attention.scale"), format!("{scale} must be positive"))
                )
            }
            Some(scale) => Some(scale),
            None => family.attention_scale,
        };
        let final_logit_softcap = match self.opt(&key("final_logit_softcapping"), Self::get_f32)? {
            // llama.cpp's rule: 0 (or no key) is no capping.
            Some(cap) if cap > 0.0 && cap.is_finite() => Some(cap),
            Some(0.0) => None,
            Some(cap) => {
                return Err(self.meta_err(
                    &key("final_logit_softcapping"),
                    format!("{cap} must be positive (or 0 for none)"),
                ))
            }
            None => family.final_logit_softcap,
        };
        Ok(ModelConfig {
            architecture,
            hidden_size,
            intermediate_size: shared.intermediate_size,
            num_layers: family.trunk_layers.unwrap_or(shared.num_layers),
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            rms_norm_eps: self
                .opt(&key("attention.layer_norm_rms_epsilon"), Self::get_f32)?
                .unwrap_or(1e-5) as f64,
            rope_theta,
            rope_scaling,
            max_position_embeddings: context_length,
            tie_word_embeddings,
            // llama.cpp's numbering: 0 none, 1 mean, 2 cls, 3 last, 4 rank (a reranker's
            // head, which sluice does not run).
            pooling: match self.opt(&key("pooling_type"), Self::get_usize)? {
                Some(1) => Some(Pooling::Mean),
                Some(2) => Some(Pooling::Cls),
                Some(3) => Some(Pooling::Last),
                _ => None,
            },
            moe: family.moe,
            sliding_window: family.sliding_window,
            attention_scale,
            final_logit_softcap,
            layers_without_rope: family.layers_without_rope,
            rotary_dim: family.rotary_dim,
            delta_net: family.delta_net,
        })
    }

    fn rope_scaling(&mut self, arch: &str, head_dim: usize) -> Result<Option<RopeScaling>> {
        if self.has_tensor("rope_freqs.weight") {
            let factors = self
                .tensor("rope_freqs.weight", &Device::Cpu)?
                .dequantize(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            if factors.len() != head_dim / 2 {
                return Err(self.meta_err(
                    "rope_freqs.weight",
                    format!("expected {} factors, found {}", head_dim / 2, factors.len()),
                ));
            }
            return Ok(Some(RopeScaling::FreqFactors(factors)));
        }
        let type_key = format!("{arch}.rope.scaling.type");
        let Some(kind) = self.opt(&type_key, |s, k| s.get_string(k).map(str::to_string))? else {
            return Ok(None);
        };
        match kind.as_str() {
            "none" => Ok(None),
            "linear" => {
                let factor = self.get_f32(&format!("{arch}.rope.scaling.factor"))?;
                if factor.is_nan() || factor <= 0.0 {
                    return Err(
                        self.meta_err(&format!("{arch}.rope.scaling.factor"), "must be positive")
                    );
                }
                Ok(Some(RopeScaling::Linear { factor }))
            }
            "yarn" => {
                let positive = |s: &Self, k: &str, default: Option<f32>| -> Result<f32> {
                    let full = format!("{arch}.rope.scaling.{k}");
                    let v = match (s.opt(&full, Self::get_f32)?, default) {
                        (Some(v), _) => v,
                        (None, Some(d)) => d,
                        (None, None) => s.get_f32(&full)?,
                    };
                    if v.is_finite() && v > 0.0 {
                        Ok(v)
                    } else {
                        Err(s.meta_err(&full, format!("{v} must be positive")))
                    }
                };
                let factor = positive(self, "factor", None)?;
                let original_context = self
                    .opt(
                        &format!("{arch}.rope.scaling.original_context_length"),
                        Self::get_usize,
                    )?
                    .unwrap_or(0);
                Ok(Some(RopeScaling::Yarn(Yarn {
                    factor,
                    original_context,
                    // llama.cpp's defaults (it reads no key for them).
                    beta_fast: positive(self, "yarn_beta_fast", Some(32.0))?,
                    beta_slow: positive(self, "yarn_beta_slow", Some(1.0))?,
                    attn_factor: positive(self, "attn_factor", Some(1.0))?,
                    truncate: true,
                })))
            }
            other => Err(ModelError::Unsupported {
                path: self.path.clone(),
                what: format!(
                    "rope scaling type `{other}` (supported: none, linear, yarn, llama3 rope_freqs)"
                ),
            }),
        }
    }
}

/// GGUF tensors: quantized blocks kept as they are (rows moved, never re-quantized), llama Q/K
/// un-permuted.
pub(crate) struct GgufWeights<'a> {
    file: &'a mut GgufFile,
    /// `Some(head_dim)` for llama files, whose Q/K rows llama.cpp permuted.
    unpermute_head_dim: Option<usize>,
    config: ModelConfig,
}

impl<'a> GgufWeights<'a> {
    pub(crate) fn new(file: &'a mut GgufFile, config: &ModelConfig) -> Self {
        Self {
            file,
            // llama.cpp permutes Q/K of its NORM-rotary families for its interleaved rotary;
            // undo it (NEOX families are stored unpermuted) so one rotary convention serves
            // every family.
            unpermute_head_dim: config
                .architecture
                .traits()
                .gguf_qk_permuted
                .then_some(config.head_dim),
            config: config.clone(),
        }
    }

    fn name(&self, w: Weight) -> String {
        self.config.architecture.family().gguf_tensor_name(w)
    }

    fn read(&mut self, w: Weight, shape: &[usize]) -> Result<QTensor> {
        let name = self.name(w);
        check_supported_dtype(self.file, &name)?;
        let t = self.file.tensor(&name, &Device::Cpu)?;
        check_shape(&self.file.path, &name, t.shape().dims(), shape)?;
        Ok(t)
    }
}

/// A layer's experts held in MXFP4 (gpt-oss): `[gate, up, down]`, each `[experts, rows,
/// cols]` and all three MXFP4 (as llama.cpp writes them); each expert's gate and up stacked
/// into one layer, its rows read where they lie in the map.
fn mxfp4_experts(
    file: &GgufFile,
    [gate, up, down]: [&str; 3],
    shape: ExpertMatrices,
    options: &LinearOptions,
) -> Result<Vec<crate::moe::Expert>> {
    let ExpertMatrices {
        experts,
        inter,
        hidden,
    } = shape;
    let blocks = |name: &str, rows: usize, cols: usize| -> Result<Vec<&[u8]>> {
        let (dims, data) = match file.mxfp4_bytes(name) {
            Some(found) => found,
            None if file.has_tensor(name) => {
                return Err(ModelError::Unsupported {
                    path: file.path.clone(),
                    what: format!(
                        "tensor `{name}` beside MXFP4 experts in another type: a layer's \
                         experts are read all MXFP4 or none"
                    ),
                })
            }
            None => {
                return Err(ModelError::Gguf {
                    path: file.path.clone(),
                    reason: format!("tensor `{name}` is missing"),
                })
            }
        };
        check_shape(&file.path, name, &dims, &[experts, rows, cols])?;
        Ok(data.chunks_exact(data.len() / experts).collect())
    };
    let (gates, ups, downs) = (
        blocks(gate, inter, hidden)?,
        blocks(up, inter, hidden)?,
        blocks(down, hidden, inter)?,
    );
    (0..experts)
        .map(|e| {
            let (g, u, d) = (gates[e], ups[e], downs[e]);
            let (gb, db) = (g.len() / inter, d.len() / hidden);
            let gate_up = Linear::from_block_rows(
                QuantFormat::Mxfp4,
                2 * inter,
                hidden,
                |r| {
                    if r < inter {
                        &g[r * gb..][..gb]
                    } else {
                        &u[(r - inter) * gb..][..gb]
                    }
                },
                options,
            )?;
            let down = Linear::from_block_rows(
                QuantFormat::Mxfp4,
                hidden,
                inter,
                |r| &d[r * db..][..db],
                options,
            )?;
            Ok(crate::moe::Expert {
                gate_up,
                down,
                gate_up_bias: None,
                down_bias: None,
            })
        })
        .collect()
}

/// A matrix of the file, straight from the map, checked to be `[rows, cols]`.
fn matrix<'a>(
    file: &'a GgufFile,
    name: &'a str,
    rows: usize,
    cols: usize,
) -> Result<GgufMatrix<'a>> {
    check_supported_dtype(file, name)?;
    let (dtype, dims, data) = file.tensor_bytes(name)?;
    // A vector of `cols` is a matrix of one row (llama.cpp writes qwen2moe's shared-expert
    // gate `ffn_gate_inp_shexp` so).
    if !(rows == 1 && dims == [cols]) {
        check_shape(&file.path, name, &dims, &[rows, cols])?;
    }
    Ok(GgufMatrix::new(name, dtype, rows, cols, data))
}

/// The `experts` matrices `[rows, cols]` of a 3-D expert tensor `[experts, rows, cols]`, each
/// straight from the map.
fn expert_matrices<'a>(
    file: &'a GgufFile,
    name: &'a str,
    experts: usize,
    rows: usize,
    cols: usize,
) -> Result<Vec<GgufMatrix<'a>>> {
    check_supported_dtype(file, name)?;
    let (dtype, dims, data) = file.tensor_bytes(name)?;
    check_shape(&file.path, name, &dims, &[experts, rows, cols])?;
    let bytes = data.len() / experts;
    Ok(data
        .chunks_exact(bytes)
        .map(|data| GgufMatrix::new(name, dtype, rows, cols, data))
        .collect())
}

impl WeightSource for GgufWeights<'_> {
    fn path(&self) -> &Path {
        &self.file.path
    }

    /// llama.cpp's 3-D tensors: `blk.N.ffn_gate_exps`, `ffn_up_exps` (each `[experts, inter,
    /// hidden]`, or the two stacked as `ffn_gate_up_exps`, `[experts, 2 * inter, hidden]`) and
    /// `ffn_down_exps` (`[experts, hidden, inter]`); each expert's rows read where they lie.
    fn experts(
        &mut self,
        layer: usize,
        shape: ExpertMatrices,
        options: &LinearOptions,
    ) -> Result<Vec<crate::moe::Expert>> {
        let ExpertMatrices {
            experts,
            inter,
            hidden,
        } = shape;
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        let (gate, up, down) = (
            name("ffn_gate_exps"),
            name("ffn_up_exps"),
            name("ffn_down_exps"),
        );
        let fused = name("ffn_gate_up_exps");
        if [&gate, &up, &down].iter().any(|n| self.file.is_mxfp4(n)) {
            return mxfp4_experts(self.file, [&gate, &up, &down], shape, options);
        }
        let downs = expert_matrices(self.file, &down, experts, hidden, inter)?;
        let gate_ups: Vec<Vec<GgufMatrix<'_>>> = if self.file.has_tensor(&fused) {
            expert_matrices(self.file, &fused, experts, 2 * inter, hidden)?
                .into_iter()
                .map(|m| vec![m])
                .collect()
        } else {
            let gates = expert_matrices(self.file, &gate, experts, inter, hidden)?;
            let ups = expert_matrices(self.file, &up, experts, inter, hidden)?;
            gates
                .into_iter()
                .zip(ups)
                .map(|(g, u)| vec![g, u])
                .collect()
        };
        gate_ups
            .iter()
            .zip(downs)
            .map(|(gate_up, down)| {
                Ok(crate::moe::Expert {
                    gate_up: Linear::from_gguf(gate_up, None, options)?,
                    down: Linear::from_gguf(&[down], None, options)?,
                    gate_up_bias: None,
                    down_bias: None,
                })
            })
            .collect()
    }

    fn has(&self, w: Weight) -> bool {
        self.file.has_tensor(&self.name(w))
    }

    fn layer_done(&mut self) -> Result<()> {
        self.file.release_pages()
    }

    fn dense(&mut self, w: Weight, shape: &[usize], device: &Device) -> Result<Tensor> {
        let t = self.read(w, shape)?;
        Ok(t.dequantize(device)?)
    }

    fn embedding(&mut self, shape: [usize; 2], options: &LinearOptions) -> Result<Embedding> {
        let name = Weight::Embed.gguf_name();
        let m = matrix(self.file, &name, shape[0], shape[1])?;
        if options.kind == WeightsKind::F32 || !options.device.is_cpu() {
            return Ok(Embedding::Dense(self.dense(
                Weight::Embed,
                &shape,
                &options.device,
            )?));
        }
        Ok(Embedding::Rows {
            dtype: m.dtype,
            bytes: m.data.to_vec(),
            row_bytes: m.data.len() / m.rows,
            hidden: m.cols,
        })
    }

    fn linear(
        &mut self,
        parts: &[(Weight, usize)],
        cols: usize,
        bias: Option<Tensor>,
        options: &LinearOptions,
    ) -> Result<Linear> {
        let names: Vec<String> = parts.iter().map(|&(w, _)| self.name(w)).collect();
        let mut ms = Vec::with_capacity(parts.len());
        for (&(w, rows), name) in parts.iter().zip(&names) {
            let order = self
                .config
                .architecture
                .family()
                .gguf_row_order(w, &self.config);
            let mut m = matrix(self.file, name, order.stored_rows(rows), cols)?;
            m.rows = rows;
            m.order = order;
            if let (Some(head_dim), Weight::Q(_) | Weight::K(_)) = (self.unpermute_head_dim, w) {
                if rows % head_dim != 0 {
                    return Err(ModelError::WeightLayout(format!(
                        "{name} has {rows} rows, not a whole number of heads of {head_dim}"
                    )));
                }
                m.order = RowOrder::UnpermuteQk { head_dim };
            }
            ms.push(m);
        }
        Linear::from_gguf(&ms, bias, options)
    }

    fn lm_head(
        &mut self,
        tied: bool,
        shape: [usize; 2],
        options: &LinearOptions,
    ) -> Result<Linear> {
        let name = self.name(if tied { Weight::Embed } else { Weight::Output });
        let m = matrix(self.file, &name, shape[0], shape[1])?;
        Linear::from_gguf(&[m], None, options)
    }
}

/// Where tensor `info`'s bytes lie in the file: offset and length, or why they cannot.
fn extent(
    content: &Content,
    info: &candle_core::quantized::gguf_file::TensorInfo,
    mxfp4: bool,
) -> std::result::Result<(u64, u64), String> {
    let dims = info.shape.dims();
    let (block, type_size) = if mxfp4 {
        (
            QuantFormat::Mxfp4.block_weights(),
            QuantFormat::Mxfp4.block_bytes(),
        )
    } else {
        (info.ggml_dtype.block_size(), info.ggml_dtype.type_size())
    };
    let cols = dims.last().copied().unwrap_or(1);
    if cols % block != 0 {
        return Err(format!(
            "its rows of {cols} are not a whole number of {block}-weight blocks"
        ));
    }
    let elems = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or("its shape overflows")?;
    let len = (elems / block as u64)
        .checked_mul(type_size as u64)
        .ok_or("its size overflows")?;
    let start = content
        .tensor_data_offset
        .checked_add(info.offset)
        .ok_or("its offset overflows")?;
    Ok((start, len))
}

/// Checks that every tensor's blocks fit its shape and lie inside the file without overlapping
/// another's.
fn check_extents(
    path: &Path,
    content: &Content,
    mxfp4: &HashSet<String>,
    file_len: u64,
) -> Result<()> {
    let mut spans = Vec::with_capacity(content.tensor_infos.len());
    for (name, info) in &content.tensor_infos {
        let is_mxfp4 = mxfp4.contains(name);
        let err = |reason: String| ModelError::Gguf {
            path: path.to_path_buf(),
            reason: format!(
                "tensor `{name}` ({}, shape {:?}): {reason}",
                if is_mxfp4 {
                    "MXFP4".to_string()
                } else {
                    format!("{:?}", info.ggml_dtype)
                },
                info.shape.dims()
            ),
        };
        let (start, len) = extent(content, info, is_mxfp4).map_err(err)?;
        let end = start.saturating_add(len);
        if end > file_len {
            return Err(err(format!(
                "its {len} bytes at offset {start} run past the end of the file ({file_len} bytes): the file is truncated or the tensor's shape is wrong"
            )));
        }
        spans.push((start, end, name));
    }
    spans.sort();
    for pair in spans.windows(2) {
        let ((_, end, a), (start, _, b)) = (pair[0], pair[1]);
        if start < end {
            let info = &content.tensor_infos[b.as_str()];
            return Err(ModelError::Gguf {
                path: path.to_path_buf(),
                reason: format!(
                    "tensor `{b}` ({:?}, shape {:?}) overlaps tensor `{a}`: its byte size does not match its type and shape",
                    info.ggml_dtype,
                    info.shape.dims()
                ),
            });
        }
    }
    Ok(())
}

/// Quantization formats candle can dequantize and multiply; anything else is refused by name.
fn check_supported_dtype(file: &GgufFile, name: &str) -> Result<()> {
    use candle_core::quantized::GgmlDType as G;
    if file.is_mxfp4(name) {
        return Err(file.mxfp4_elsewhere(name));
    }
    let Some(info) = file.content.tensor_infos.get(name) else {
        return Err(ModelError::Gguf {
            path: file.path.clone(),
            reason: format!("tensor `{name}` is missing"),
        });
    };
    match info.ggml_dtype {
        G::F32
        | G::F16
        | G::BF16
        | G::Q4_0
        | G::Q4_1
        | G::Q5_0
        | G::Q5_1
        | G::Q8_0
        | G::Q8_1
        | G::Q2K
        | G::Q3K
        | G::Q4K
        | G::Q5K
        | G::Q6K
        | G::Q8K => Ok(()),
        #[allow(unreachable_patterns)]
        other => Err(ModelError::Unsupported {
            path: file.path.clone(),
            what: format!("quantization type {other:?} of tensor `{name}`"),
        }),
    }
}

impl GgufFile {
    /// The tokenizer this file's `tokenizer.ggml.*` metadata describes.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Ok(Tokenizer::from_gguf(self, &self.path)?)
    }
}

/// GGUF integers of every width as `i64` (converters disagree on widths and signedness).
impl GgufFile {
    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        read: impl Fn(&'a Value) -> Option<T>,
    ) -> std::result::Result<Option<T>, String> {
        match self.metadata().get(key) {
            None => Ok(None),
            Some(value) => read(value)
                .map(Some)
                .ok_or_else(|| format!("expected {expected}, found {value:?}")),
        }
    }

    fn array<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        read: impl Fn(&'a Value) -> Option<T>,
    ) -> std::result::Result<Option<Vec<T>>, String> {
        let Some(items) = self.metadata().get(key) else {
            return Ok(None);
        };
        let Value::Array(items) = items else {
            return Err(format!(
                "expected an array, found a {:?}",
                items.value_type()
            ));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                read(item).ok_or_else(|| {
                    format!("element {i} is a {:?}, not {expected}", item.value_type())
                })
            })
            .collect::<std::result::Result<_, _>>()
            .map(Some)
    }
}

impl GgufMetadata for GgufFile {
    fn string(&self, key: &str) -> std::result::Result<Option<&str>, String> {
        self.typed(key, "a string", |v| match v {
            Value::String(s) => Some(s.as_str()),
            _ => None,
        })
    }

    fn boolean(&self, key: &str) -> std::result::Result<Option<bool>, String> {
        self.typed(key, "a bool", |v| match v {
            Value::Bool(b) => Some(*b),
            _ => None,
        })
    }

    fn integer(&self, key: &str) -> std::result::Result<Option<i64>, String> {
        self.typed(key, "an integer", int_value)
    }

    fn strings(&self, key: &str) -> std::result::Result<Option<Vec<&str>>, String> {
        self.array(key, "a string", |v| match v {
            Value::String(s) => Some(s.as_str()),
            _ => None,
        })
    }

    fn integers(&self, key: &str) -> std::result::Result<Option<Vec<i64>>, String> {
        self.array(key, "an integer", int_value)
    }

    /// SentencePiece scores: f32 in every converter we know, integers in some old ones
    /// (llama.cpp accepts both).
    fn floats(&self, key: &str) -> std::result::Result<Option<Vec<f32>>, String> {
        self.array(key, "a number", |v| match v {
            Value::F32(x) => Some(*x),
            Value::F64(x) => Some(*x as f32),
            other => int_value(other).map(|i| i as f32),
        })
    }
}

impl LlamaModel {
    pub fn from_gguf(file: &mut GgufFile, options: &LoadOptions) -> Result<Self> {
        let config = file.model_config()?;
        let mut source = GgufWeights::new(file, &config);
        Self::build(config, &mut source, options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard of a split GGUF is refused at open, naming the merge that makes one file.
    #[test]
    fn a_split_gguf_shard_is_refused_with_the_merge_command() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m-Q8_0-00001-of-00003.gguf");
        let tensor = Tensor::zeros((4, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
        let q = QTensor::quantize(&tensor, GgmlDType::F32).unwrap();
        let meta = [
            ("general.architecture", Value::String("llama".into())),
            ("split.no", Value::U16(0)),
            ("split.count", Value::U16(3)),
        ];
        let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
        let mut file = File::create(&path).unwrap();
        candle_core::quantized::gguf_file::write(&mut file, &meta, &[("token_embd.weight", &q)])
            .unwrap();
        drop(file);
        let err = GgufFile::open(&path).err().expect("refused").to_string();
        assert!(
            err.contains("split GGUF (3 shards)") && err.contains("llama-gguf-split --merge"),
            "{err}"
        );
    }
}
