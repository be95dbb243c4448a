//! Tiny random-weight models written as real GGUF files, so tests of the model, the engine and
//! the server run the whole loading path without a download.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use crate::config::Architecture;
use crate::error::{ModelError, Result};
use crate::tokenizer::byte_level::ByteLevelAlphabet;

/// The shape of a tiny model. Defaults give GQA (4 query heads over 2 KV heads).
#[derive(Debug, Clone)]
pub struct TinyModelSpec {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub context_length: usize,
    /// Q8_0 keeps the quantized path honest; F32 makes every weight kind agree exactly.
    pub dtype: GgmlDType,
    pub seed: u64,
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
            context_length: 512,
            dtype: GgmlDType::F32,
            seed: 7,
        }
    }
}

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

/// `n` deterministic values in [-1, 1) for tests of kernels and models.
pub fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..n).map(|_| rng.next_f32()).collect()
}

/// SplitMix64: deterministic, dependency-free weights.
struct Rng(u64);
impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
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
        self.hidden_size / self.num_heads
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
            w.matrix(&p("ffn_gate.weight"), (inter, h), scale, self.dtype)?;
            w.matrix(&p("ffn_up.weight"), (inter, h), scale, self.dtype)?;
            w.matrix(
                &p("ffn_down.weight"),
                (h, inter),
                1.0 / (inter as f32).sqrt(),
                self.dtype,
            )?;
            w.vector(&p("attn_norm.weight"), h, 1.0, 0.1)?;
            w.vector(&p("ffn_norm.weight"), h, 1.0, 0.1)?;
            if self.architecture.has_qkv_bias() {
                w.vector(&p("attn_q.bias"), self.num_heads * hd, 0.0, 0.5)?;
                w.vector(&p("attn_k.bias"), kvh * hd, 0.0, 0.5)?;
                w.vector(&p("attn_v.bias"), kvh * hd, 0.0, 0.5)?;
            }
        }
        w.vector("output_norm.weight", h, 1.0, 0.1)?;
        let tensors = w.tensors;

        let arch = self.architecture.name();
        let k = |s: &str| format!("{arch}.{s}");
        let mut token_types = vec![Value::I32(1); vocab];
        for t in token_types
            .iter_mut()
            .skip(vocab - TINY_SPECIAL_TOKENS.len())
        {
            *t = Value::I32(3);
        }
        let eos = (vocab - TINY_SPECIAL_TOKENS.len()) as u32; // <|endoftext|>
        let meta: Vec<(String, Value)> = vec![
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
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Value::String("gpt-2".into())),
            ("tokenizer.ggml.tokens".into(), Value::Array(tokens.into_iter().map(Value::String).collect())),
            ("tokenizer.ggml.merges".into(), Value::Array(merges.into_iter().map(Value::String).collect())),
            ("tokenizer.ggml.token_type".into(), Value::Array(token_types)),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(eos)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)),
            ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
            (
                "tokenizer.chat_template".into(),
                Value::String(
                    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}".into(),
                ),
            ),
        ];
        let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> =
            tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let mut file = std::fs::File::create(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        gguf_file::write(&mut file, &meta_refs, &tensor_refs)?;
        Ok(())
    }
}
