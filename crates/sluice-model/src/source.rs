//! Where a model's tensors come from. [`ModelSource`] opens either format sluice serves: a GGUF
//! file, or a Hugging Face directory (`config.json`, `tokenizer.json`, `*.safetensors`). Inside,
//! each format implements [`WeightSource`], which hands the one layer-building routine
//! ([`LlamaModel`]'s) the tensors it asks for by role ([`Weight`]), shape-checked and in the
//! layout the forward expects.

use std::path::Path;

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};

use crate::config::{Architecture, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::hf::HfModelDir;
use crate::model::{LlamaModel, LoadOptions};
use crate::tokenizer::Tokenizer;
use crate::weights::{concat_rows, unpermute_qk, Linear};

/// A tensor of a llama-family model, by its role; each format names it its own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weight {
    Embed,
    Output,
    OutputNorm,
    AttnNorm(usize),
    Q(usize),
    K(usize),
    V(usize),
    QBias(usize),
    KBias(usize),
    VBias(usize),
    /// qwen3's per-head RMSNorm weights.
    QNorm(usize),
    KNorm(usize),
    O(usize),
    FfnNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
}

impl Weight {
    /// The tensor's name in a GGUF file (llama.cpp's names).
    pub fn gguf_name(self) -> String {
        let blk = |i: usize, t: &str| format!("blk.{i}.{t}");
        match self {
            Self::Embed => "token_embd.weight".into(),
            Self::Output => "output.weight".into(),
            Self::OutputNorm => "output_norm.weight".into(),
            Self::AttnNorm(i) => blk(i, "attn_norm.weight"),
            Self::Q(i) => blk(i, "attn_q.weight"),
            Self::K(i) => blk(i, "attn_k.weight"),
            Self::V(i) => blk(i, "attn_v.weight"),
            Self::QBias(i) => blk(i, "attn_q.bias"),
            Self::KBias(i) => blk(i, "attn_k.bias"),
            Self::VBias(i) => blk(i, "attn_v.bias"),
            Self::QNorm(i) => blk(i, "attn_q_norm.weight"),
            Self::KNorm(i) => blk(i, "attn_k_norm.weight"),
            Self::O(i) => blk(i, "attn_output.weight"),
            Self::FfnNorm(i) => blk(i, "ffn_norm.weight"),
            Self::Gate(i) => blk(i, "ffn_gate.weight"),
            Self::Up(i) => blk(i, "ffn_up.weight"),
            Self::Down(i) => blk(i, "ffn_down.weight"),
        }
    }

    /// The tensor's name in a Hugging Face checkpoint (transformers' llama/qwen2/qwen3).
    pub fn hf_name(self) -> String {
        let layer = |i: usize, t: &str| format!("model.layers.{i}.{t}");
        match self {
            Self::Embed => "model.embed_tokens.weight".into(),
            Self::Output => "lm_head.weight".into(),
            Self::OutputNorm => "model.norm.weight".into(),
            Self::AttnNorm(i) => layer(i, "input_layernorm.weight"),
            Self::Q(i) => layer(i, "self_attn.q_proj.weight"),
            Self::K(i) => layer(i, "self_attn.k_proj.weight"),
            Self::V(i) => layer(i, "self_attn.v_proj.weight"),
            Self::QBias(i) => layer(i, "self_attn.q_proj.bias"),
            Self::KBias(i) => layer(i, "self_attn.k_proj.bias"),
            Self::VBias(i) => layer(i, "self_attn.v_proj.bias"),
            Self::QNorm(i) => layer(i, "self_attn.q_norm.weight"),
            Self::KNorm(i) => layer(i, "self_attn.k_norm.weight"),
            Self::O(i) => layer(i, "self_attn.o_proj.weight"),
            Self::FfnNorm(i) => layer(i, "post_attention_layernorm.weight"),
            Self::Gate(i) => layer(i, "mlp.gate_proj.weight"),
            Self::Up(i) => layer(i, "mlp.up_proj.weight"),
            Self::Down(i) => layer(i, "mlp.down_proj.weight"),
        }
    }
}

/// What the layer builder needs from a file format.
pub(crate) trait WeightSource {
    /// The file or directory, for logs and errors.
    fn path(&self) -> &Path;
    fn has(&self, w: Weight) -> bool;
    /// `w` (a vector, or the embedding) as f32 on `device`, checked to have `shape`.
    fn dense(&mut self, w: Weight, shape: &[usize], device: &Device) -> Result<Tensor>;
    /// The matrices `parts` (`(weight, rows)`, each `[rows, cols]`) stacked along their rows
    /// into one layer, so one matmul computes them all.
    fn linear(
        &mut self,
        parts: &[(Weight, usize)],
        cols: usize,
        bias: Option<Tensor>,
        options: &LoadOptions,
    ) -> Result<Linear>;
    /// The output projection `[vocab, hidden]`: the embedding itself when `tied`.
    fn lm_head(&mut self, tied: bool, shape: [usize; 2], options: &LoadOptions) -> Result<Linear>;
}

pub(crate) fn check_shape(
    path: &Path,
    name: &str,
    found: &[usize],
    expected: &[usize],
) -> Result<()> {
    if found == expected {
        Ok(())
    } else {
        Err(ModelError::TensorShape {
            path: path.to_path_buf(),
            name: name.to_string(),
            expected: expected.to_vec(),
            found: found.to_vec(),
        })
    }
}

/// GGUF tensors: quantized blocks kept as they are (rows moved, never re-quantized), llama Q/K
/// un-permuted.
pub(crate) struct GgufWeights<'a> {
    file: &'a mut GgufFile,
    /// `Some(head_dim)` for llama files, whose Q/K rows llama.cpp permuted.
    unpermute_head_dim: Option<usize>,
    /// The embedding as read, reused by a tied output projection.
    embed: Option<QTensor>,
}

impl<'a> GgufWeights<'a> {
    pub(crate) fn new(file: &'a mut GgufFile, config: &ModelConfig) -> Self {
        Self {
            file,
            // llama.cpp permutes llama Q/K for its interleaved rotary; undo it (qwen2/qwen3 are
            // stored unpermuted) so one rotary convention serves every architecture.
            unpermute_head_dim: (config.architecture == Architecture::Llama)
                .then_some(config.head_dim),
            embed: None,
        }
    }

    fn read(&mut self, w: Weight, shape: &[usize]) -> Result<QTensor> {
        let name = w.gguf_name();
        check_supported_dtype(self.file, &name)?;
        let t = self.file.tensor(&name, &Device::Cpu)?;
        check_shape(&self.file.path, &name, t.shape().dims(), shape)?;
        Ok(t)
    }
}

impl WeightSource for GgufWeights<'_> {
    fn path(&self) -> &Path {
        &self.file.path
    }

    fn has(&self, w: Weight) -> bool {
        self.file.has_tensor(&w.gguf_name())
    }

    fn dense(&mut self, w: Weight, shape: &[usize], device: &Device) -> Result<Tensor> {
        let t = self.read(w, shape)?;
        let dense = t.dequantize(device)?;
        if w == Weight::Embed {
            self.embed = Some(t);
        }
        Ok(dense)
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
            let mut t = self.read(w, &[rows, cols])?;
            if let (Some(head_dim), Weight::Q(_) | Weight::K(_)) = (self.unpermute_head_dim, w) {
                t = unpermute_qk(&t, rows / head_dim, head_dim)?;
            }
            ws.push(t);
        }
        let w = match ws.len() {
            1 => ws.pop().expect("one part"),
            _ => concat_rows(&ws.iter().collect::<Vec<_>>())?,
        };
        Linear::from_qtensor(w, bias, options)
    }

    fn lm_head(&mut self, tied: bool, shape: [usize; 2], options: &LoadOptions) -> Result<Linear> {
        let w = match (tied, self.embed.take()) {
            (true, Some(embed)) => embed,
            (true, None) => self.read(Weight::Embed, &shape)?,
            (false, _) => self.read(Weight::Output, &shape)?,
        };
        Linear::from_qtensor(w, None, options)
    }
}

/// Quantization formats candle can dequantize and multiply; anything else is refused by name.
fn check_supported_dtype(file: &GgufFile, name: &str) -> Result<()> {
    use candle_core::quantized::GgmlDType as G;
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

/// A model on disk, in either format sluice serves.
pub enum ModelSource {
    /// A GGUF file: weights, hyper-parameters and tokenizer in one file.
    Gguf(GgufFile),
    /// A Hugging Face directory: `config.json`, `tokenizer.json` (+ `tokenizer_config.json`,
    /// `generation_config.json`), `model.safetensors` or shards with an index.
    Hf(HfModelDir),
}

impl ModelSource {
    /// A directory opens as a Hugging Face checkpoint, anything else as a GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            Ok(Self::Hf(HfModelDir::open(path)?))
        } else {
            Ok(Self::Gguf(GgufFile::open(path)?))
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Self::Gguf(f) => &f.path,
            Self::Hf(d) => d.dir(),
        }
    }

    /// `"gguf"` or `"hf"`, for logs.
    pub fn format(&self) -> &'static str {
        match self {
            Self::Gguf(_) => "gguf",
            Self::Hf(_) => "hf",
        }
    }

    pub fn model_config(&mut self) -> Result<ModelConfig> {
        match self {
            Self::Gguf(f) => f.model_config(),
            Self::Hf(d) => Ok(d.config().clone()),
        }
    }

    /// The model's tokenizer, special ids and chat template.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match self {
            Self::Gguf(f) => Tokenizer::from_gguf(&f.content, &f.path),
            Self::Hf(d) => d.tokenizer(),
        }
    }

    pub fn load_model(&mut self, options: &LoadOptions) -> Result<LlamaModel> {
        match self {
            Self::Gguf(f) => LlamaModel::from_gguf(f, options),
            Self::Hf(d) => LlamaModel::from_hf(d, options),
        }
    }
}
