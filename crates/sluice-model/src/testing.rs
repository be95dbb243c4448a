//! Tiny random-weight models written as real GGUF files, so tests of the model, the engine and
//! the server run the whole loading path without a download; and [`write_hf_from_gguf`], which
//! turns a GGUF model into the Hugging Face directory it was converted from.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::hf;
use crate::load::Weight;
use crate::lora::Projection as LoraProjection;
use crate::synthetic::{tokenizer_metadata, Rng};
use crate::weights::unpermute_qk;
use sluice_tokenizer::{ByteLevelAlphabet, Tokenizer};

/// A tiny model's mixture of experts (written as llama.cpp writes one: a router
/// `ffn_gate_inp` kept in f32, and 3-D `ffn_{gate,up,down}_exps` tensors of the model's format).
#[derive(Debug, Clone)]
pub struct TinyMoe {
    pub experts: usize,
    pub experts_used: usize,
    pub expert_intermediate_size: usize,
    /// qwen2moe's shared expert's size (`Some` for that architecture).
    pub shared_expert_intermediate_size: Option<usize>,
    /// Scale of the router's weights: large enough that a row's top k stand apart.
    pub router_scale: f32,
}

impl TinyMoe {
    /// `experts` experts of `inter`, `k` a token; a shared expert of `inter` for qwen2moe.
    pub fn new(architecture: Architecture, experts: usize, k: usize, inter: usize) -> Self {
        Self {
            experts,
            experts_used: k,
            expert_intermediate_size: inter,
            shared_expert_intermediate_size: architecture
                .traits()
                .experts
                .as_ref()
                .is_some_and(|e| e.shared_expert)
                .then_some(inter),
            router_scale: 4.0,
        }
    }
}

/// The shape of a tiny model. Defaults give GQA (4 query heads over 2 KV heads).
#[derive(Debug, Clone)]
pub struct TinyModelSpec {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    /// `None`: hidden / heads. qwen3 sets its own.
    pub head_dim: Option<usize>,
    pub context_length: usize,
    /// Q8_0 keeps the quantized path honest; F32 makes every weight kind agree exactly.
    pub dtype: GgmlDType,
    pub seed: u64,
    /// A mixture of experts in place of every layer's MLP (Mixtral with [`Architecture::Llama`],
    /// or qwen2moe/qwen3moe).
    pub moe: Option<TinyMoe>,
}

impl Default for TinyModelSpec {
    fn default() -> Self {
        Self {
            architecture: Architecture::Llama,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: None,
            context_length: 512,
            dtype: GgmlDType::F32,
            seed: 7,
            moe: None,
        }
    }
}

pub use crate::arch::export::TINY_GEMMA_WINDOW;

/// Control tokens after the 256 byte tokens.
pub const TINY_SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Vocabulary: one token per byte (the byte-level alphabet), a few merges, then the specials.
fn tiny_vocab() -> (Vec<String>, Vec<String>) {
    let alphabet = ByteLevelAlphabet::new();
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| alphabet.char_of(b).to_string())
        .collect();
    let merges: Vec<String> = ["t h", "th e", "Ġ the", "i n", "a n"]
        .iter()
        .map(|m| m.to_string())
        .collect();
    for m in &merges {
        tokens.push(m.replace(' ', ""));
    }
    tokens.extend(TINY_SPECIAL_TOKENS.iter().map(|s| s.to_string()));
    (tokens, merges)
}

struct RandomTensors {
    rng: Rng,
    tensors: Vec<(String, QTensor)>,
}

impl RandomTensors {
    fn matrix(
        &mut self,
        name: &str,
        shape: (usize, usize),
        scale: f32,
        dtype: GgmlDType,
    ) -> Result<()> {
        let data: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| self.rng.next_f32() * scale)
            .collect();
        let t = Tensor::from_vec(data, shape, &Device::Cpu)?;
        self.tensors
            .push((name.to_string(), QTensor::quantize(&t, dtype)?));
        Ok(())
    }

    /// `[n, rows, cols]`: one `[rows, cols]` matrix for each of `n` experts.
    fn experts(
        &mut self,
        name: &str,
        (n, rows, cols): (usize, usize, usize),
        scale: f32,
        dtype: GgmlDType,
    ) -> Result<()> {
        let data: Vec<f32> = (0..n * rows * cols)
            .map(|_| self.rng.next_f32() * scale)
            .collect();
        let t = Tensor::from_vec(data, (n, rows, cols), &Device::Cpu)?;
        self.tensors
            .push((name.to_string(), QTensor::quantize(&t, dtype)?));
        Ok(())
    }

    /// 1-D tensors (norms, biases) stay f32, as in real files.
    fn vector(&mut self, name: &str, n: usize, base: f32, spread: f32) -> Result<()> {
        let data: Vec<f32> = (0..n)
            .map(|_| base + spread * self.rng.next_f32())
            .collect();
        let t = Tensor::from_vec(data, n, &Device::Cpu)?;
        self.tensors
            .push((name.to_string(), QTensor::quantize(&t, GgmlDType::F32)?));
        Ok(())
    }
}

impl TinyModelSpec {
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_heads)
    }

    pub fn vocab_size(&self) -> usize {
        tiny_vocab().0.len()
    }

    /// Writes the model, with a byte-level BPE tokenizer and a ChatML template, to `path`.
    pub fn write_gguf(&self, path: &Path) -> Result<()> {
        let (tokens, merges) = tiny_vocab();
        let vocab = tokens.len();
        let (h, hd, kvh, inter) = (
            self.hidden_size,
            self.head_dim(),
            self.num_kv_heads,
            self.intermediate_size,
        );
        let mut w = RandomTensors {
            rng: Rng(self.seed),
            tensors: Vec::new(),
        };
        let scale = 1.0 / (h as f32).sqrt();
        w.matrix("token_embd.weight", (vocab, h), 1.0, self.dtype)?;
        for i in 0..self.num_layers {
            let p = |t: &str| format!("blk.{i}.{t}");
            w.matrix(
                &p("attn_q.weight"),
                (self.num_heads * hd, h),
                scale,
                self.dtype,
            )?;
            w.matrix(&p("attn_k.weight"), (kvh * hd, h), scale, self.dtype)?;
            w.matrix(&p("attn_v.weight"), (kvh * hd, h), scale, self.dtype)?;
            w.matrix(
                &p("attn_output.weight"),
                (h, self.num_heads * hd),
                scale,
                self.dtype,
            )?;
            match &self.moe {
                None => {
                    w.matrix(&p("ffn_gate.weight"), (inter, h), scale, self.dtype)?;
                    w.matrix(&p("ffn_up.weight"), (inter, h), scale, self.dtype)?;
                    w.matrix(
                        &p("ffn_down.weight"),
                        (h, inter),
                        1.0 / (inter as f32).sqrt(),
                        self.dtype,
                    )?;
                }
                Some(moe) => {
                    let (n, ei) = (moe.experts, moe.expert_intermediate_size);
                    // The router stays f32, as llama.cpp's quantizer leaves it.
                    w.matrix(
                        &p("ffn_gate_inp.weight"),
                        (n, h),
                        scale * moe.router_scale,
                        GgmlDType::F32,
                    )?;
                    w.experts(&p("ffn_gate_exps.weight"), (n, ei, h), scale, self.dtype)?;
                    w.experts(&p("ffn_up_exps.weight"), (n, ei, h), scale, self.dtype)?;
                    w.experts(
                        &p("ffn_down_exps.weight"),
                        (n, h, ei),
                        1.0 / (ei as f32).sqrt(),
                        self.dtype,
                    )?;
                    if let Some(si) = moe.shared_expert_intermediate_size {
                        w.matrix(&p("ffn_gate_shexp.weight"), (si, h), scale, self.dtype)?;
                        w.matrix(&p("ffn_up_shexp.weight"), (si, h), scale, self.dtype)?;
                        w.matrix(
                            &p("ffn_down_shexp.weight"),
                            (h, si),
                            1.0 / (si as f32).sqrt(),
                            self.dtype,
                        )?;
                        w.vector(&p("ffn_gate_inp_shexp.weight"), h, 0.0, scale * 4.0)?;
                    }
                }
            }
            w.vector(&p("attn_norm.weight"), h, 1.0, 0.1)?;
            // gpt-oss names its MLP pre-norm `post_attention_norm` (llama.cpp's name there).
            let family = self.architecture.family();
            w.vector(&family.gguf_tensor_name(Weight::FfnNorm(i)), h, 1.0, 0.1)?;
            // gpt-oss's sinks, output bias and expert biases.
            if self.architecture.traits().attention_sinks {
                let moe = self.moe.as_ref().expect("gpt-oss is a mixture of experts");
                let (n, ei) = (moe.experts, moe.expert_intermediate_size);
                w.vector(&p("attn_output.bias"), h, 0.0, 0.2)?;
                w.vector(&p("attn_sinks.weight"), self.num_heads, 0.0, 2.0)?;
                w.vector(&p("ffn_gate_inp.bias"), n, 0.0, 0.5)?;
                w.matrix(&p("ffn_gate_exps.bias"), (n, ei), 0.2, GgmlDType::F32)?;
                w.matrix(&p("ffn_up_exps.bias"), (n, ei), 0.2, GgmlDType::F32)?;
                w.matrix(&p("ffn_down_exps.bias"), (n, h), 0.2, GgmlDType::F32)?;
            }
            if self.architecture.traits().qkv_bias {
                w.vector(&p("attn_q.bias"), self.num_heads * hd, 0.0, 0.5)?;
                w.vector(&p("attn_k.bias"), kvh * hd, 0.0, 0.5)?;
                w.vector(&p("attn_v.bias"), kvh * hd, 0.0, 0.5)?;
            }
            if self.architecture.traits().qk_norm {
                w.vector(&p("attn_q_norm.weight"), hd, 1.0, 0.1)?;
                w.vector(&p("attn_k_norm.weight"), hd, 1.0, 0.1)?;
            }
            if self.architecture.traits().post_norms {
                w.vector(&p("post_attention_norm.weight"), h, 1.0, 0.1)?;
                w.vector(&p("post_ffw_norm.weight"), h, 1.0, 0.1)?;
            }
        }
        w.vector("output_norm.weight", h, 1.0, 0.1)?;
        let tensors = w.tensors;

        let arch = self.architecture.name();
        let k = |s: &str| format!("{arch}.{s}");
        let eos = (vocab - TINY_SPECIAL_TOKENS.len()) as u32; // <|endoftext|>
        let mut meta: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(arch.into())),
            (k("embedding_length"), Value::U32(h as u32)),
            (k("block_count"), Value::U32(self.num_layers as u32)),
            (k("feed_forward_length"), Value::U32(inter as u32)),
            (k("attention.head_count"), Value::U32(self.num_heads as u32)),
            (k("attention.head_count_kv"), Value::U32(kvh as u32)),
            (k("context_length"), Value::U32(self.context_length as u32)),
            (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
            (k("rope.freq_base"), Value::F32(10_000.0)),
            (k("vocab_size"), Value::U32(vocab as u32)),
        ];
        meta.extend(tokenizer_metadata(
            tokens,
            merges,
            TINY_SPECIAL_TOKENS.len(),
            (eos, eos),
        ));
        if let Some(d) = self.head_dim {
            meta.push((k("attention.key_length"), Value::U32(d as u32)));
            meta.push((k("attention.value_length"), Value::U32(d as u32)));
        }
        // The family's own keys (Gemma 3's and gpt-oss's windows, ...), replacing shared ones.
        for (key, value) in self.architecture.family().tiny_gguf_keys() {
            let key = k(key);
            meta.retain(|(other, _)| other != &key);
            meta.push((key, value));
        }
        if let Some(moe) = &self.moe {
            meta.push((k("expert_count"), Value::U32(moe.experts as u32)));
            meta.push((k("expert_used_count"), Value::U32(moe.experts_used as u32)));
            meta.push((
                k("expert_feed_forward_length"),
                Value::U32(moe.expert_intermediate_size as u32),
            ));
            if let Some(si) = moe.shared_expert_intermediate_size {
                meta.push((
                    k("expert_shared_feed_forward_length"),
                    Value::U32(si as u32),
                ));
            }
        }
        write_gguf_file(path, &meta, &tensors)
    }
}

/// How [`write_hf_from_gguf`] writes the weights.
#[derive(Debug, Clone)]
pub struct HfExport {
    /// Element type of the safetensors: F32 keeps the dequantized GGUF values exactly.
    pub dtype: DType,
    /// 1: `model.safetensors`; more: that many shards and `model.safetensors.index.json`.
    pub shards: usize,
    /// How a mixture's experts are laid out.
    pub experts: HfExperts,
}

/// The two layouts transformers writes a mixture's experts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfExperts {
    /// Each expert's own matrices: `mlp.experts.E.{gate,up,down}_proj.weight` (Mixtral:
    /// `block_sparse_moe.experts.E.{w1,w3,w2}.weight`, with its router `block_sparse_moe.gate`).
    PerExpert,
    /// transformers 5's `mlp.experts.gate_up_proj` `[experts, 2 * inter, hidden]` and
    /// `mlp.experts.down_proj` `[experts, hidden, inter]`.
    Fused,
}

impl Default for HfExport {
    fn default() -> Self {
        Self {
            dtype: DType::F32,
            shards: 1,
            experts: HfExperts::PerExpert,
        }
    }
}

/// Writes the GGUF model at `gguf` as a Hugging Face directory in `dir`: every tensor
/// dequantized and renamed to transformers' names (llama Q/K rows un-permuted, exactly as the
/// loader does), `config.json` with its hyper-parameters, `tokenizer.json` built from its
/// vocabulary, `tokenizer_config.json` (chat template, BOS/EOS) and `generation_config.json`
/// (every end-of-generation id). Loading `dir` gives the model the GGUF file gives.
pub fn write_hf_from_gguf(gguf: &Path, dir: &Path, export: &HfExport) -> Result<()> {
    let mut file = GgufFile::open(gguf)?;
    let config = file.model_config()?;
    let tokenizer = file.tokenizer()?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ModelError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;

    let (d, arch) = (config.head_dim, config.architecture);
    let mut roles = vec![Weight::Embed, Weight::OutputNorm];
    if !config.tie_word_embeddings {
        roles.push(Weight::Output);
    }
    for i in 0..config.num_layers {
        roles.extend([
            Weight::AttnNorm(i),
            Weight::Q(i),
            Weight::K(i),
            Weight::V(i),
            Weight::QBias(i),
            Weight::KBias(i),
            Weight::VBias(i),
            Weight::QNorm(i),
            Weight::KNorm(i),
            Weight::O(i),
            Weight::AttnPostNorm(i),
            Weight::FfnNorm(i),
            Weight::FfnPostNorm(i),
            Weight::Gate(i),
            Weight::Up(i),
            Weight::Down(i),
            Weight::Router(i),
            Weight::SharedGate(i),
            Weight::SharedUp(i),
            Weight::SharedDown(i),
            Weight::SharedRouter(i),
            Weight::SsmQkv(i),
            Weight::SsmGate(i),
            Weight::SsmBeta(i),
            Weight::SsmAlpha(i),
            Weight::SsmConv(i),
            Weight::SsmDtBias(i),
            Weight::SsmA(i),
            Weight::SsmNorm(i),
            Weight::SsmOut(i),
        ]);
    }
    let checkpoint =
        arch.family()
            .hf_checkpoint(&config)
            .ok_or_else(|| ModelError::Unsupported {
                path: gguf.to_path_buf(),
                what: format!("export of {} to a Hugging Face checkpoint", arch.name()),
            })?;
    // Mixtral's own names, in the per-expert layout it was published in.
    let mixtral_names = checkpoint.mixtral_expert_names && export.experts == HfExperts::PerExpert;
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let mut roles_of: Vec<Weight> = Vec::new();
    // A multimodal checkpoint's text part: its tensors under `model.language_model.`.
    let stored = |name: String| match (checkpoint.text_model_type, name.strip_prefix("model.")) {
        (Some(_), Some(rest)) => format!("model.language_model.{rest}"),
        _ => name,
    };
    for role in roles {
        // Families without post-norms may name another norm as Gemma's post-norm is named
        // (qwen35's `post_attention_norm` is its MLP's norm).
        if !arch.traits().post_norms
            && matches!(role, Weight::AttnPostNorm(_) | Weight::FfnPostNorm(_))
        {
            continue;
        }
        let name = arch.family().gguf_tensor_name(role);
        if !file.has_tensor(&name) {
            continue;
        }
        let mut t = file.tensor(&name, &Device::Cpu)?;
        if arch.traits().gguf_qk_permuted {
            if let Weight::Q(_) | Weight::K(_) = role {
                t = unpermute_qk(&t, t.shape().dims()[0] / d, d)?;
            }
        }
        let mut dense = t.dequantize(&Device::Cpu)?;
        // A role stored among another's rows (qwen3next's beta and alpha in `ssm_ba`).
        let order = arch.family().gguf_row_order(role, &config);
        if order != crate::weights::RowOrder::Stored {
            let rows = order.rows_in(dense.dim(0)?);
            let index: Vec<u32> = (0..rows).map(|r| order.stored_row(r) as u32).collect();
            dense = dense.index_select(&Tensor::from_vec(index, rows, &Device::Cpu)?, 0)?;
        }
        if arch.traits().hf_norms_minus_one && role.is_norm() {
            // transformers' Gemma norms hold `w - 1` (exact for the weights near 1 here).
            dense = (dense - 1.0)?;
        }
        let dense = arch.family().gguf_to_hf(role, dense, &config)?;
        let mut dense = dense.to_dtype(export.dtype)?;
        let hf_name = match role {
            // `[hidden]` in GGUF, a one-output linear layer in transformers.
            Weight::SharedRouter(_) => {
                dense = dense.unsqueeze(0)?;
                role.hf_name()
            }
            Weight::Router(i) if mixtral_names => {
                format!("model.layers.{i}.block_sparse_moe.gate.weight")
            }
            _ => arch.family().hf_tensor_name(role),
        };
        roles_of.push(role);
        tensors.push((stored(hf_name), dense));
    }
    // Roles that one checkpoint tensor holds (Qwen3-Next's fused in-projections) as that one.
    let mut merged: Vec<(String, Vec<(Weight, Tensor)>)> = Vec::new();
    for ((name, t), role) in tensors.drain(..).zip(roles_of) {
        match merged.iter_mut().find(|(n, _)| *n == name) {
            Some((_, parts)) => parts.push((role, t)),
            None => merged.push((name, vec![(role, t)])),
        }
    }
    for (name, mut parts) in merged {
        let t = match parts.len() {
            1 => parts.pop().expect("one part").1,
            _ => arch.family().hf_fused(&parts, &config)?,
        };
        tensors.push((name, t));
    }
    for i in 0..config.num_layers {
        let exps = |t: &str| format!("blk.{i}.ffn_{t}_exps.weight");
        if !file.has_tensor(&exps("down")) {
            continue;
        }
        let mut read = |name: String| -> Result<Tensor> {
            Ok(file
                .tensor(&name, &Device::Cpu)?
                .dequantize(&Device::Cpu)?
                .to_dtype(export.dtype)?)
        };
        let (gate, up, down) = (read(exps("gate"))?, read(exps("up"))?, read(exps("down"))?);
        let at = |t: String| stored(format!("model.layers.{i}.{t}"));
        match export.experts {
            HfExperts::Fused => {
                tensors.push((
                    at("mlp.experts.gate_up_proj".into()),
                    Tensor::cat(&[gate, up], 1)?,
                ));
                tensors.push((at("mlp.experts.down_proj".into()), down));
            }
            HfExperts::PerExpert => {
                for e in 0..gate.dim(0)? {
                    let names = if mixtral_names {
                        ["w1", "w3", "w2"]
                            .map(|w| at(format!("block_sparse_moe.experts.{e}.{w}.weight")))
                    } else {
                        ["gate", "up", "down"]
                            .map(|w| at(format!("mlp.experts.{e}.{w}_proj.weight")))
                    };
                    for (name, t) in names.into_iter().zip([&gate, &up, &down]) {
                        tensors.push((name, t.get(e)?.contiguous()?));
                    }
                }
            }
        }
    }

    // Shards of consecutive tensors, as transformers writes them.
    let shards = export.shards.clamp(1, tensors.len().max(1));
    let per_shard = tensors.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    let mut total_size = 0usize;
    for (s, chunk) in tensors.chunks(per_shard).enumerate() {
        let file_name = if shards == 1 {
            hf::WEIGHTS_FILE.to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", s + 1, shards)
        };
        let map: HashMap<String, Tensor> = chunk.iter().cloned().collect();
        for (name, t) in chunk {
            weight_map.insert(name.clone(), file_name.clone().into());
            total_size += t.elem_count() * t.dtype().size_in_bytes();
        }
        candle_core::safetensors::save(&map, dir.join(&file_name))?;
    }
    let write_json = |name: &str, value: serde_json::Value| -> Result<()> {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(&value).expect("JSON values serialize");
        std::fs::write(&path, text).map_err(io(&path))
    };
    if shards > 1 {
        write_json(
            hf::WEIGHTS_INDEX_FILE,
            serde_json::json!({"metadata": {"total_size": total_size}, "weight_map": weight_map}),
        )?;
    }

    let rope_scaling = match &config.rope_scaling {
        None => serde_json::Value::Null,
        Some(RopeScaling::Linear { factor }) => {
            serde_json::json!({"rope_type": "linear", "factor": factor})
        }
        Some(RopeScaling::FreqFactors(_)) => {
            return Err(ModelError::Unsupported {
                path: gguf.to_path_buf(),
                what: "export of rope_freqs (llama3 rope scaling) to config.json".into(),
            })
        }
        Some(RopeScaling::Yarn(y)) => serde_json::json!({
            "rope_type": "yarn",
            "factor": y.factor,
            "original_max_position_embeddings": y.original_context,
            "beta_fast": y.beta_fast,
            "beta_slow": y.beta_slow,
            "attention_factor": y.attn_factor,
        }),
    };
    let torch_dtype = match export.dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    };
    let eos_ids = tokenizer.eos_token_ids().to_vec();
    let mut config_json = serde_json::json!({
            "architectures": [checkpoint.class],
            "model_type": checkpoint.model_type,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads,
            "num_key_value_heads": config.num_kv_heads,
            "head_dim": config.head_dim,
            "vocab_size": config.vocab_size,
            "rms_norm_eps": config.rms_norm_eps,
            "rope_theta": config.rope_theta,
            "rope_scaling": rope_scaling,
            "max_position_embeddings": config.max_position_embeddings,
            "tie_word_embeddings": config.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": arch.traits().qkv_bias,
            "use_sliding_window": false,
            "sliding_window": config.max_position_embeddings,
            "max_window_layers": config.num_layers,
            "torch_dtype": torch_dtype,
            "bos_token_id": tokenizer.bos_token_id(),
            "eos_token_id": tokenizer.eos_token_id(),
    });
    if let Some(moe) = &config.moe {
        if moe.weights_scale != 1.0 || !moe.dense_layers.is_empty() {
            return Err(ModelError::Unsupported {
                path: gguf.to_path_buf(),
                what: "export of a scaled or partly dense mixture of experts to config.json".into(),
            });
        }
    }
    for (key, value) in checkpoint.fields.as_object().expect("an object") {
        config_json[key] = value.clone();
    }
    if let Some(text_model_type) = checkpoint.text_model_type {
        // The text fields nested, as a multimodal checkpoint's config holds them.
        let mut text = config_json;
        let outer = serde_json::json!({
            "architectures": text["architectures"].take(),
            "model_type": text["model_type"].take(),
            "tie_word_embeddings": text["tie_word_embeddings"].clone(),
        });
        text["model_type"] = text_model_type.into();
        text.as_object_mut()
            .expect("an object")
            .remove("architectures");
        config_json = outer;
        config_json["text_config"] = text;
    }
    write_json(hf::CONFIG_FILE, config_json)?;
    let tokenizer_json = Tokenizer::hf_json_from_gguf(&file, gguf)?;
    let path = dir.join(hf::TOKENIZER_FILE);
    std::fs::write(&path, tokenizer_json).map_err(io(&path))?;
    write_json(
        "tokenizer_config.json",
        serde_json::json!({
            "bos_token": tokenizer.bos_token(),
            "eos_token": tokenizer.eos_token(),
            "pad_token": tokenizer.pad_token_id().and_then(|id| tokenizer.id_to_token(id)),
            "add_bos_token": tokenizer.add_bos_token(),
            "chat_template": tokenizer.chat_template(),
        }),
    )?;
    write_json(
        hf::GENERATION_CONFIG_FILE,
        serde_json::json!({"bos_token_id": tokenizer.bos_token_id(), "eos_token_id": eos_ids}),
    )
}

/// What a hybrid's `ssm_a` (`-exp(A_log)`) becomes through its Hugging Face checkpoint:
/// [`write_hf_from_gguf`] stores the nearest `A_log`, whose `-exp` is `a` or a neighbour of it
/// (f32 cannot hold an `A_log` for every `a`). A GGUF file whose `ssm_a` went through this is
/// the one a converter writes from that checkpoint, and loads to the directory's bits.
pub fn delta_net_a_through_hf(a: f32) -> f32 {
    use crate::arch::qwen35_hf::{a_from_a_log, a_log_from_a};
    a_from_a_log(a_log_from_a(a))
}

impl TinyModelSpec {
    /// Writes the model as a Hugging Face directory (through [`write_hf_from_gguf`]; the GGUF
    /// file is written beside `dir` as `dir.gguf` and kept, so tests can compare the two).
    pub fn write_hf(&self, dir: &Path, export: &HfExport) -> Result<()> {
        let gguf = dir.with_extension("gguf");
        self.write_gguf(&gguf)?;
        write_hf_from_gguf(&gguf, dir, export)
    }
}

pub use sluice_tokenizer::testing::{in_ci, optional_input as optional_model};

/// A random LoRA adapter for a tiny model ([`TinyModelSpec`]): rank `rank`, `lora_alpha`
/// `alpha`, an update of each of `targets` in every layer, A and B drawn from `seed`, large
/// enough to change the greedy tokens.
#[derive(Debug, Clone)]
pub struct TinyLoraSpec {
    pub rank: usize,
    pub alpha: f32,
    pub targets: Vec<LoraProjection>,
    pub seed: u64,
}

/// One update of a [`TinyLoraSpec`]: layer, projection, A `[rank, inputs]` and B `[outputs,
/// rank]` (row-major, Hugging Face row order).
pub type TinyLoraUpdate = (usize, LoraProjection, Vec<f32>, Vec<f32>);

impl TinyLoraSpec {
    /// Its updates for a model of `config`, in layer then projection order.
    pub fn updates(&self, config: &ModelConfig) -> Vec<TinyLoraUpdate> {
        let mut rng = Rng(self.seed);
        let mut out = Vec::new();
        for layer in 0..config.num_layers {
            for &p in &self.targets {
                let (inputs, outputs) = p.shape(config);
                let a_scale = 1.0 / (inputs as f32).sqrt();
                let b_scale = 1.0 / (self.rank as f32).sqrt();
                let a = (0..self.rank * inputs)
                    .map(|_| rng.next_f32() * a_scale)
                    .collect();
                let b = (0..outputs * self.rank)
                    .map(|_| rng.next_f32() * b_scale)
                    .collect();
                out.push((layer, p, a, b));
            }
        }
        out
    }

    /// PEFT's directory: `adapter_config.json` and `adapter_model.safetensors` (f32).
    pub fn write_peft(&self, config: &ModelConfig, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let targets: Vec<&str> = self.targets.iter().map(|p| p.peft_name()).collect();
        let json = serde_json::json!({
            "peft_type": "LORA", "r": self.rank, "lora_alpha": self.alpha,
            "target_modules": targets, "bias": "none", "use_rslora": false,
            "fan_in_fan_out": false, "modules_to_save": null,
        });
        let path = dir.join(crate::lora::PEFT_CONFIG_FILE);
        std::fs::write(&path, json.to_string())
            .map_err(|source| ModelError::Io { path, source })?;
        let mut tensors = std::collections::HashMap::new();
        for (layer, p, a, b) in self.updates(config) {
            let (inputs, outputs) = p.shape(config);
            let name = |side: &str| {
                format!(
                    "base_model.model.model.layers.{layer}.{}.{}.lora_{side}.weight",
                    p.peft_path(),
                    p.peft_name()
                )
            };
            tensors.insert(
                name("A"),
                Tensor::from_vec(a, (self.rank, inputs), &Device::Cpu)?,
            );
            tensors.insert(
                name("B"),
                Tensor::from_vec(b, (outputs, self.rank), &Device::Cpu)?,
            );
        }
        candle_core::safetensors::save(&tensors, dir.join(crate::lora::PEFT_WEIGHTS_FILE))?;
        Ok(())
    }

    /// llama.cpp's GGUF adapter, as `convert_lora_to_gguf.py` writes one: F32 `lora_a` and
    /// `lora_b`, `adapter.lora.alpha`, and for a llama model the Q/K B rows permuted as the
    /// converter permutes the base weights.
    pub fn write_gguf(&self, config: &ModelConfig, path: &Path) -> Result<()> {
        let arch = config.architecture.name();
        let meta: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(arch.into())),
            ("general.type".into(), Value::String("adapter".into())),
            ("adapter.type".into(), Value::String("lora".into())),
            ("adapter.lora.alpha".into(), Value::F32(self.alpha)),
        ];
        let permuted = config.architecture.traits().gguf_qk_permuted;
        let mut tensors: Vec<(String, QTensor)> = Vec::new();
        for (layer, p, a, b) in self.updates(config) {
            let (inputs, outputs) = p.shape(config);
            let b = if permuted && matches!(p, LoraProjection::Q | LoraProjection::K) {
                // GGUF row g holds original row `unpermuted_row`'s inverse: put each original
                // row where the converter puts it.
                let mut out = vec![0f32; b.len()];
                for g in 0..outputs {
                    let from = crate::weights::unpermuted_row(g, config.head_dim);
                    out[from * self.rank..][..self.rank]
                        .copy_from_slice(&b[g * self.rank..][..self.rank]);
                }
                out
            } else {
                b
            };
            let q = |v: Vec<f32>, shape: (usize, usize)| -> Result<QTensor> {
                Ok(QTensor::quantize(
                    &Tensor::from_vec(v, shape, &Device::Cpu)?,
                    GgmlDType::F32,
                )?)
            };
            let name = |side: &str| format!("blk.{layer}.{}.weight.lora_{side}", p.gguf_name());
            tensors.push((name("a"), q(a, (self.rank, inputs))?));
            tensors.push((name("b"), q(b, (outputs, self.rank))?));
        }
        write_gguf_file(path, &meta, &tensors)
    }
}

/// Writes a GGUF file of `meta` and `tensors` to `path`.
fn write_gguf_file(
    path: &Path,
    meta: &[(String, Value)],
    tensors: &[(String, QTensor)],
) -> Result<()> {
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    gguf_file::write(&mut file, &meta_refs, &tensor_refs)?;
    Ok(())
}
