//! Random-weight checkpoints of real model shapes, written as GGUF files in any format sluice
//! loads: a machine with nothing but our binaries (a lent GPU, which can download nothing) can
//! then benchmark every size and format. The weights are random, so the text is not; their speed
//! is a real model's: the same shapes, the same bytes a step reads, the same kernels.
//!
//! Quantizing billions of random values would take minutes, so each matrix is assembled from a
//! pool of rows quantized once by candle's reference quantizer ([`POOL_ROWS`] of them, drawn at
//! random for each output row): every block is a valid block of its format.
//!
//! `sluice synth` is the command (`sluice-server`); [`SyntheticSpec::write_gguf`] the writer.

use std::path::Path;
use std::str::FromStr;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use sluice_tokenizer::ByteLevelAlphabet;

use crate::config::Architecture;
use crate::error::{ModelError, Result};
use crate::load::Weight;

/// A real model's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelShape {
    pub name: &'static str,
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    /// `None`: hidden / heads (Qwen3's is its own).
    pub head_dim: Option<usize>,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rope_theta: f32,
    pub tie_word_embeddings: bool,
    /// A mixture of experts in every layer.
    pub experts: Option<ShapeExperts>,
    /// gpt-oss's attention: a window on every other layer, sinks, biases and YaRN.
    pub gpt_oss: Option<GptOssAttention>,
    /// The Qwen3.5/3.6 hybrids' Gated DeltaNet layers and gated attention.
    pub hybrid: Option<HybridShape>,
}

/// What a Qwen3.5/3.6 hybrid's shape adds: its Gated DeltaNet layers (all but each
/// `full_attention_interval`-th), the full-attention layers' output gate and partial rotary, and
/// a mixture's shared expert.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HybridShape {
    pub full_attention_interval: usize,
    pub conv_kernel: usize,
    /// Key and value heads' size (`ssm.state_size`).
    pub state_size: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    /// Rotated dimensions of an attention head.
    pub rotary_dim: usize,
    /// The shared expert's size beside a mixture (0: none).
    pub shared_expert_size: usize,
}

impl HybridShape {
    fn is_recurrent(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.full_attention_interval)
    }
}

/// What gpt-oss's shape adds to the attention.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptOssAttention {
    /// The local layers' window (every other layer, from the first).
    pub window: usize,
    /// YaRN's factor and original context.
    pub yarn_factor: f32,
    pub yarn_original_context: usize,
}

/// A shape's mixture of experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapeExperts {
    pub count: usize,
    pub used: usize,
    pub intermediate_size: usize,
}

impl ModelShape {
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_heads)
    }

    /// Experts a layer holds (0 for a dense model).
    fn expert_count(&self) -> usize {
        self.experts.map_or(0, |e| e.count)
    }
}

/// The shapes `sluice synth --shape` knows, from each model's published config.
pub const SHAPES: [ModelShape; 10] = [
    ModelShape {
        name: "smollm2-135m",
        architecture: Architecture::Llama,
        hidden_size: 576,
        intermediate_size: 1536,
        num_layers: 30,
        num_heads: 9,
        num_kv_heads: 3,
        vocab_size: 49152,
        context_length: 8192,
        rope_theta: 100_000.0,
        tie_word_embeddings: true,
        head_dim: None,
        experts: None,
        gpt_oss: None,
        hybrid: None,
    },
    ModelShape {
        name: "qwen2.5-0.5b",
        architecture: Architecture::Qwen2,
        hidden_size: 896,
        intermediate_size: 4864,
        num_layers: 24,
        num_heads: 14,
        num_kv_heads: 2,
        vocab_size: 151_936,
        context_length: 32768,
        rope_theta: 1_000_000.0,
        tie_word_embeddings: true,
        head_dim: None,
        experts: None,
        gpt_oss: None,
        hybrid: None,
    },
    ModelShape {
        name: "qwen2.5-1.5b",
        architecture: Architecture::Qwen2,
        hidden_size: 1536,
        intermediate_size: 8960,
        num_layers: 28,
        num_heads: 12,
        num_kv_heads: 2,
        vocab_size: 151_936,
        context_length: 32768,
        rope_theta: 1_000_000.0,
        tie_word_embeddings: true,
        head_dim: None,
        experts: None,
        gpt_oss: None,
        hybrid: None,
    },
    ModelShape {
        name: "qwen2.5-7b",
        architecture: Architecture::Qwen2,
        hidden_size: 3584,
        intermediate_size: 18944,
        num_layers: 28,
        num_heads: 28,
        num_kv_heads: 4,
        vocab_size: 152_064,
        context_length: 32768,
        rope_theta: 1_000_000.0,
        tie_word_embeddings: false,
        head_dim: None,
        experts: None,
        gpt_oss: None,
        hybrid: None,
    },
    ModelShape {
        name: "llama-3.1-8b",
        architecture: Architecture::Llama,
        hidden_size: 4096,
        intermediate_size: 14336,
        num_layers: 32,
        num_heads: 32,
        num_kv_heads: 8,
        vocab_size: 128_256,
        // The real model's 131072 with llama3 RoPE scaling; plain RoPE over 8192 positions
        // here: the same step cost, a smaller table.
        context_length: 8192,
        rope_theta: 500_000.0,
        tie_word_embeddings: false,
        head_dim: None,
        experts: None,
        gpt_oss: None,
        hybrid: None,
    },
    // Qwen3-30B-A3B (and Qwen3-Coder-30B-A3B, the same shape): 128 experts of 768, 8 a token,
    // heads of 128 over a hidden size of 2048, QK-norm.
    ModelShape {
        name: "qwen3-30b-a3b",
        architecture: Architecture::Qwen3Moe,
        hidden_size: 2048,
        intermediate_size: 6144,
        num_layers: 48,
        num_heads: 32,
        num_kv_heads: 4,
        head_dim: Some(128),
        vocab_size: 151_936,
        context_length: 40960,
        rope_theta: 1_000_000.0,
        tie_word_embeddings: false,
        experts: Some(ShapeExperts {
            count: 128,
            used: 8,
            intermediate_size: 768,
        }),
        gpt_oss: None,
        hybrid: None,
    },
    // Mixtral-8x7B: llama with 8 experts of 14336, 2 a token.
    ModelShape {
        name: "mixtral-8x7b",
        architecture: Architecture::Llama,
        hidden_size: 4096,
        intermediate_size: 14336,
        num_layers: 32,
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: None,
        vocab_size: 32000,
        context_length: 32768,
        rope_theta: 1_000_000.0,
        tie_word_embeddings: false,
        experts: Some(ShapeExperts {
            count: 8,
            used: 2,
            intermediate_size: 14336,
        }),
        gpt_oss: None,
        hybrid: None,
    },
    // gpt-oss-20b: 24 layers of 64 query heads of 64 over 8 KV heads (hidden 2880), every other
    // layer a window of 128 keys, 32 experts of 2880, 4 a token, YaRN x32 over 4096 positions,
    // the o200k vocabulary's size.
    ModelShape {
        name: "gpt-oss-20b",
        architecture: Architecture::GptOss,
        hidden_size: 2880,
        intermediate_size: 2880,
        num_layers: 24,
        num_heads: 64,
        num_kv_heads: 8,
        head_dim: Some(64),
        vocab_size: 201_088,
        context_length: 131_072,
        rope_theta: 150_000.0,
        tie_word_embeddings: false,
        experts: Some(ShapeExperts {
            count: 32,
            used: 4,
            intermediate_size: 2880,
        }),
        gpt_oss: Some(GptOssAttention {
            window: 128,
            yarn_factor: 32.0,
            yarn_original_context: 4096,
        }),
        hybrid: None,
    },
    // Qwen3.6-35B-A3B (Qwen3.5-35B-A3B's shape), as its published config gives it (recalled:
    // no hub is reachable where this was written): 40 layers, every fourth full attention (16
    // query heads of 256 over 2 KV heads, a gate each, RoPE on 64 dimensions), the others Gated
    // DeltaNet (16 key and 32 value heads of 128, a conv of 4); 256 experts of 512, 8 a token,
    // beside a shared expert of 512; a vocabulary of 248,320.
    ModelShape {
        name: "qwen3.6-35b-a3b",
        architecture: Architecture::Qwen35Moe,
        hidden_size: 2048,
        intermediate_size: 512,
        num_layers: 40,
        num_heads: 16,
        num_kv_heads: 2,
        head_dim: Some(256),
        vocab_size: 248_320,
        context_length: 262_144,
        rope_theta: 10_000_000.0,
        tie_word_embeddings: false,
        experts: Some(ShapeExperts {
            count: 256,
            used: 8,
            intermediate_size: 512,
        }),
        gpt_oss: None,
        hybrid: Some(HybridShape {
            full_attention_interval: 4,
            conv_kernel: 4,
            state_size: 128,
            k_heads: 16,
            v_heads: 32,
            rotary_dim: 64,
            shared_expert_size: 512,
        }),
    },
    // Qwen3.6-27B (Qwen3.5-27B's shape), recalled likewise: 64 layers, every fourth full
    // attention (24 query heads of 256 over 4 KV heads), the others Gated DeltaNet (16 key and
    // 48 value heads of 128); dense SwiGLU of 17,408.
    ModelShape {
        name: "qwen3.6-27b",
        architecture: Architecture::Qwen35,
        hidden_size: 5120,
        intermediate_size: 17_408,
        num_layers: 64,
        num_heads: 24,
        num_kv_heads: 4,
        head_dim: Some(256),
        vocab_size: 248_320,
        context_length: 262_144,
        rope_theta: 10_000_000.0,
        tie_word_embeddings: false,
        experts: None,
        gpt_oss: None,
        hybrid: Some(HybridShape {
            full_attention_interval: 4,
            conv_kernel: 4,
            state_size: 128,
            k_heads: 16,
            v_heads: 48,
            rotary_dim: 64,
            shared_expert_size: 0,
        }),
    },
];

impl FromStr for ModelShape {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        SHAPES
            .iter()
            .find(|shape| shape.name.eq_ignore_ascii_case(s))
            .copied()
            .ok_or_else(|| {
                let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
                format!("unknown shape {s:?}: one of {}", names.join(", "))
            })
    }
}

/// The weights' format: one GGML type for every matrix, or one of llama.cpp's mixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyntheticFormat {
    Uniform(GgmlDType),
    /// llama.cpp's Q4_K_M: Q4_K, with Q6_K for V and down in its "more bits" layers and for the
    /// output matrix.
    Q4KM,
    /// llama.cpp's Q5_K_M: the same with Q5_K.
    Q5KM,
    /// llama.cpp's MXFP4_MOE (gpt-oss's files): the experts in MXFP4, every other matrix in
    /// Q8_0.
    Mxfp4Moe,
}

impl FromStr for SyntheticFormat {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        use GgmlDType::*;
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" => Self::Uniform(F32),
            "f16" => Self::Uniform(F16),
            "bf16" => Self::Uniform(BF16),
            "q4_0" => Self::Uniform(Q4_0),
            "q4_1" => Self::Uniform(Q4_1),
            "q5_0" => Self::Uniform(Q5_0),
            "q5_1" => Self::Uniform(Q5_1),
            "q8_0" => Self::Uniform(Q8_0),
            "q2_k" => Self::Uniform(Q2K),
            "q3_k" => Self::Uniform(Q3K),
            "q4_k" => Self::Uniform(Q4K),
            "q5_k" => Self::Uniform(Q5K),
            "q6_k" => Self::Uniform(Q6K),
            "q4_k_m" => Self::Q4KM,
            "q5_k_m" => Self::Q5KM,
            "mxfp4_moe" => Self::Mxfp4Moe,
            other => {
                return Err(format!(
                    "unknown format {other:?}: one of f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, \
                     q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, q4_k_m, q5_k_m, mxfp4_moe"
                ))
            }
        })
    }
}

/// The matrices of a layer, for the mixes' choice of format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Embedding,
    Output,
    AttnK,
    AttnV,
    AttnOutput,
    /// `ffn_down`, or a mixture's `ffn_down_exps`.
    FfnDown,
    /// A mixture's `ffn_gate_exps` or `ffn_up_exps`.
    Experts,
    Other,
}

impl SyntheticFormat {
    /// The format of a matrix of `role` in layer `layer` of `layers` of a model of `experts`
    /// experts (0: dense), before the fallback for rows that do not split into its blocks.
    fn dtype(self, role: Role, layer: usize, layers: usize, experts: usize) -> GgmlDType {
        let (base, more) = match self {
            Self::Uniform(dtype) => return dtype,
            // The experts are written as MXFP4 by `write_gguf` (candle has no such type).
            Self::Mxfp4Moe => return GgmlDType::Q8_0,
            Self::Q4KM => (GgmlDType::Q4K, GgmlDType::Q6K),
            Self::Q5KM => (GgmlDType::Q5K, GgmlDType::Q6K),
        };
        // llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third
        // one between.
        let more_bits =
            layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
        match role {
            Role::Output => more,
            // llama.cpp's rules for 8-expert models (Mixtral): K and V in Q8_0, the attention
            // output in Q5_K under Q4_K_M.
            Role::AttnK | Role::AttnV if experts == 8 => GgmlDType::Q8_0,
            Role::AttnOutput if experts == 8 && self == Self::Q4KM => GgmlDType::Q5K,
            Role::AttnV | Role::FfnDown if more_bits => more,
            _ => base,
        }
    }
}

/// Rows quantized per matrix; each output row is one of them, drawn at random.
pub const POOL_ROWS: usize = 64;

/// Rows of a mixture's embedding pool (see [`SyntheticSpec::write_gguf`]).
const EMBEDDING_POOL_ROWS: usize = 4096;

/// What to write.
#[derive(Debug, Clone)]
pub struct SyntheticSpec {
    pub shape: ModelShape,
    pub format: SyntheticFormat,
    /// Fewer layers than the shape's (tests); `None`: the shape's.
    pub num_layers: Option<usize>,
    pub seed: u64,
}

/// Control tokens at the end of the vocabulary (ChatML).
const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// A byte-level BPE vocabulary of exactly `size` tokens: the 256 bytes, filler tokens that no
/// merge produces (the model may still emit them; they print as their text), the specials.
fn vocabulary(size: usize) -> Vec<String> {
    let alphabet = ByteLevelAlphabet::new();
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| alphabet.char_of(b).to_string())
        .collect();
    let fillers = size.saturating_sub(256 + SPECIAL_TOKENS.len());
    tokens.extend((0..fillers).map(|i| format!("t{i}")));
    tokens.extend(SPECIAL_TOKENS.iter().map(|s| s.to_string()));
    tokens
}

/// ChatML, the template a synthetic or test model carries.
pub(crate) const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GGUF metadata of a byte-level BPE vocabulary (`tokens`, whose last `specials` are control
/// tokens) with `merges`, BOS and EOS ids, no BOS added, and [`CHATML_TEMPLATE`].
pub(crate) fn tokenizer_metadata(
    tokens: Vec<String>,
    merges: Vec<String>,
    specials: usize,
    (bos, eos): (u32, u32),
) -> Vec<(String, Value)> {
    let control_from = tokens.len() - specials;
    let token_types: Vec<Value> = (0..tokens.len())
        .map(|i| Value::I32(if i >= control_from { 3 } else { 1 }))
        .collect();
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("gpt-2".into())),
        ("tokenizer.ggml.tokens".into(), strings(tokens)),
        ("tokenizer.ggml.merges".into(), strings(merges)),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(token_types),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(bos)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        (
            "tokenizer.chat_template".into(),
            Value::String(CHATML_TEMPLATE.into()),
        ),
    ]
}

/// SplitMix64: deterministic, dependency-free random weights (here and in `testing`).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

impl SyntheticSpec {
    pub fn num_layers(&self) -> usize {
        self.num_layers.unwrap_or(self.shape.num_layers)
    }

    /// Writes the model, with a byte-level BPE vocabulary of the shape's size and a ChatML
    /// template, to `path`. Returns the bytes of its tensors.
    pub fn write_gguf(&self, path: &Path) -> Result<usize> {
        let s = &self.shape;
        let layers = self.num_layers();
        let head_dim = s.head_dim();
        let n_experts = s.expert_count();
        let (h, kvh, inter, vocab) = (
            s.hidden_size,
            s.num_kv_heads,
            s.intermediate_size,
            s.vocab_size,
        );
        let mut rng = Rng(self.seed);
        let mut tensors: Vec<(String, QTensor)> = Vec::new();
        // MXFP4 tensors, written as F16 placeholders of the same bytes (candle has no MXFP4
        // type) and patched to MXFP4 in the written header: name and row length.
        let mut mxfp4: Vec<(String, u64)> = Vec::new();
        // `experts` matrices of `[rows, cols]` (`[experts, rows, cols]`); 1: a plain matrix.
        let mut matrices = |name: String,
                            experts: usize,
                            rows: usize,
                            cols: usize,
                            role: Role,
                            layer: usize|
         -> Result<()> {
            if self.format == SyntheticFormat::Mxfp4Moe && experts > 1 {
                let bytes = mxfp4_pooled_rows(&mut rng, experts * rows, cols, POOL_ROWS);
                let storage = QStorage::from_data(
                    std::borrow::Cow::Owned(bytes),
                    &Device::Cpu,
                    GgmlDType::F16,
                )?;
                // 17 bytes a block of 32 values: `cols * 17 / 64` f16 values a row.
                tensors.push((
                    name.clone(),
                    QTensor::new(storage, (experts, rows, cols * 17 / 64))?,
                ));
                mxfp4.push((name, cols as u64));
                return Ok(());
            }
            let dtype = fit(self.format.dtype(role, layer, layers, n_experts), cols);
            // The embedding of a mixture from a larger pool: tokens that share an embedding
            // row share their first layer's experts, which 64 rows would make unlike a real
            // model's routing.
            let pool = if role == Role::Embedding && n_experts > 0 {
                EMBEDDING_POOL_ROWS
            } else {
                POOL_ROWS
            };
            let t = pooled_matrix(&mut rng, experts * rows, cols, dtype, pool)?;
            let t = if experts > 1 {
                let bytes = t.data()?.into_owned();
                let storage =
                    QStorage::from_data(std::borrow::Cow::Owned(bytes), &Device::Cpu, dtype)?;
                QTensor::new(storage, (experts, rows, cols))?
            } else {
                t
            };
            tensors.push((name, t));
            Ok(())
        };
        matrices("token_embd.weight".into(), 1, vocab, h, Role::Embedding, 0)?;
        for i in 0..layers {
            let p = |t: &str| format!("blk.{i}.{t}");
            match s.hybrid.filter(|hy| hy.is_recurrent(i)) {
                Some(hy) => {
                    // A Gated DeltaNet layer: q, k, v (the conv's input), z, beta and alpha,
                    // and the out-projection.
                    let (key, value) = (hy.k_heads * hy.state_size, hy.v_heads * hy.state_size);
                    matrices(p("attn_qkv.weight"), 1, 2 * key + value, h, Role::Other, i)?;
                    matrices(p("attn_gate.weight"), 1, value, h, Role::Other, i)?;
                    matrices(p("ssm_beta.weight"), 1, hy.v_heads, h, Role::Other, i)?;
                    matrices(p("ssm_alpha.weight"), 1, hy.v_heads, h, Role::Other, i)?;
                    matrices(p("ssm_out.weight"), 1, h, value, Role::AttnOutput, i)?;
                }
                None => {
                    // A hybrid's query heads are each followed by their gate's rows.
                    let gates = if s.hybrid.is_some() { 2 } else { 1 };
                    let q_rows = gates * s.num_heads * head_dim;
                    matrices(p("attn_q.weight"), 1, q_rows, h, Role::Other, i)?;
                    matrices(p("attn_k.weight"), 1, kvh * head_dim, h, Role::AttnK, i)?;
                    matrices(p("attn_v.weight"), 1, kvh * head_dim, h, Role::AttnV, i)?;
                    matrices(
                        p("attn_output.weight"),
                        1,
                        h,
                        s.num_heads * head_dim,
                        Role::AttnOutput,
                        i,
                    )?;
                }
            }
            match s.experts {
                None => {
                    matrices(p("ffn_gate.weight"), 1, inter, h, Role::Other, i)?;
                    matrices(p("ffn_up.weight"), 1, inter, h, Role::Other, i)?;
                    matrices(p("ffn_down.weight"), 1, h, inter, Role::FfnDown, i)?;
                }
                Some(e) => {
                    let (n, ei) = (e.count, e.intermediate_size);
                    matrices(p("ffn_gate_exps.weight"), n, ei, h, Role::Experts, i)?;
                    matrices(p("ffn_up_exps.weight"), n, ei, h, Role::Experts, i)?;
                    matrices(p("ffn_down_exps.weight"), n, h, ei, Role::FfnDown, i)?;
                    let shared = s.hybrid.map_or(0, |hy| hy.shared_expert_size);
                    if shared > 0 {
                        matrices(p("ffn_gate_shexp.weight"), 1, shared, h, Role::Other, i)?;
                        matrices(p("ffn_up_shexp.weight"), 1, shared, h, Role::Other, i)?;
                        matrices(p("ffn_down_shexp.weight"), 1, h, shared, Role::FfnDown, i)?;
                    }
                }
            }
        }
        if !s.tie_word_embeddings {
            matrices("output.weight".into(), 1, vocab, h, Role::Output, layers)?;
        }
        // The routers stay f32, as llama.cpp's quantizer leaves them; scaled up, so that a
        // token's experts differ as a trained router's do rather than all tie near 0.
        if let Some(e) = s.experts {
            for i in 0..layers {
                let scale = 4.0 / (h as f32).sqrt();
                let data: Vec<f32> = (0..e.count * h).map(|_| scale * rng.next_f32()).collect();
                let t = Tensor::from_vec(data, (e.count, h), &Device::Cpu)?;
                tensors.push((
                    format!("blk.{i}.ffn_gate_inp.weight"),
                    QTensor::quantize(&t, GgmlDType::F32)?,
                ));
            }
        }
        // Norms and biases stay f32, as in real files.
        let mut vector = |name: String, n: usize, base: f32, spread: f32| -> Result<()> {
            let data: Vec<f32> = (0..n).map(|_| base + spread * rng.next_f32()).collect();
            let t = Tensor::from_vec(data, n, &Device::Cpu)?;
            tensors.push((name, QTensor::quantize(&t, GgmlDType::F32)?));
            Ok(())
        };
        for i in 0..layers {
            let p = |t: &str| format!("blk.{i}.{t}");
            vector(p("attn_norm.weight"), h, 1.0, 0.1)?;
            vector(
                s.architecture.family().gguf_tensor_name(Weight::FfnNorm(i)),
                h,
                1.0,
                0.1,
            )?;
            if s.gpt_oss.is_some() {
                vector(p("attn_output.bias"), h, 0.0, 0.1)?;
                vector(p("attn_sinks.weight"), s.num_heads, 0.0, 1.0)?;
            }
            if s.architecture.traits().qkv_bias {
                vector(p("attn_q.bias"), s.num_heads * head_dim, 0.0, 0.1)?;
                vector(p("attn_k.bias"), kvh * head_dim, 0.0, 0.1)?;
                vector(p("attn_v.bias"), kvh * head_dim, 0.0, 0.1)?;
            }
            let recurrent = s.hybrid.filter(|hy| hy.is_recurrent(i));
            if s.architecture.traits().qk_norm && recurrent.is_none() {
                vector(p("attn_q_norm.weight"), head_dim, 1.0, 0.1)?;
                vector(p("attn_k_norm.weight"), head_dim, 1.0, 0.1)?;
            }
            if let Some(hy) = recurrent {
                // Alpha's bias, -exp(A_log) in [-1.2, -0.1], the output norm (the conv's taps
                // below).
                vector(p("ssm_dt.bias"), hy.v_heads, 0.0, 0.5)?;
                vector(p("ssm_a"), hy.v_heads, -0.65, 0.55)?;
                vector(p("ssm_norm.weight"), hy.state_size, 1.0, 0.1)?;
            }
            if s.hybrid.is_some_and(|hy| hy.shared_expert_size > 0) {
                vector(p("ffn_gate_inp_shexp.weight"), h, 0.0, 0.1)?;
            }
        }
        vector("output_norm.weight".into(), h, 1.0, 0.1)?;
        // A DeltaNet layer's conv taps: rows of `conv_kernel` values, too short for a
        // quantized block, f32 as in llama.cpp's files.
        if let Some(hy) = s.hybrid {
            let conv_dim = (2 * hy.k_heads + hy.v_heads) * hy.state_size;
            for i in (0..layers).filter(|&i| hy.is_recurrent(i)) {
                let data: Vec<f32> = (0..conv_dim * hy.conv_kernel)
                    .map(|_| 0.5 * rng.next_f32())
                    .collect();
                let t = Tensor::from_vec(data, (conv_dim, hy.conv_kernel), &Device::Cpu)?;
                tensors.push((
                    format!("blk.{i}.ssm_conv1d.weight"),
                    QTensor::quantize(&t, GgmlDType::F32)?,
                ));
            }
        }
        // gpt-oss: the router's bias, and every expert's biases (`[experts, n]`).
        if let (Some(_), Some(e)) = (s.gpt_oss, s.experts) {
            for i in 0..layers {
                let p = |t: &str| format!("blk.{i}.{t}");
                for (name, rows, n, spread) in [
                    (p("ffn_gate_inp.bias"), 1, e.count, 0.5),
                    (p("ffn_gate_exps.bias"), e.count, e.intermediate_size, 0.1),
                    (p("ffn_up_exps.bias"), e.count, e.intermediate_size, 0.1),
                    (p("ffn_down_exps.bias"), e.count, h, 0.1),
                ] {
                    let data: Vec<f32> = (0..rows * n).map(|_| spread * rng.next_f32()).collect();
                    let t = match rows {
                        1 => Tensor::from_vec(data, n, &Device::Cpu)?,
                        _ => Tensor::from_vec(data, (rows, n), &Device::Cpu)?,
                    };
                    tensors.push((name, QTensor::quantize(&t, GgmlDType::F32)?));
                }
            }
        }

        let arch = s.architecture.name();
        let k = |key: &str| format!("{arch}.{key}");
        let specials = vocab - SPECIAL_TOKENS.len();
        let (endoftext, im_end) = (specials as u32, specials as u32 + 2);
        let mut meta: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(arch.into())),
            (
                "general.name".into(),
                Value::String(format!("synthetic {} ({:?})", s.name, self.format)),
            ),
            (k("embedding_length"), Value::U32(h as u32)),
            (k("block_count"), Value::U32(layers as u32)),
            (k("feed_forward_length"), Value::U32(inter as u32)),
            (k("attention.head_count"), Value::U32(s.num_heads as u32)),
            (k("attention.head_count_kv"), Value::U32(kvh as u32)),
            (k("context_length"), Value::U32(s.context_length as u32)),
            (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
            (k("rope.freq_base"), Value::F32(s.rope_theta)),
            (k("vocab_size"), Value::U32(vocab as u32)),
        ];
        if let Some(d) = s.head_dim {
            meta.push((k("attention.key_length"), Value::U32(d as u32)));
            meta.push((k("attention.value_length"), Value::U32(d as u32)));
        }
        if let Some(g) = s.gpt_oss {
            meta.push((k("attention.sliding_window"), Value::U32(g.window as u32)));
            meta.push((k("rope.scaling.type"), Value::String("yarn".into())));
            meta.push((k("rope.scaling.factor"), Value::F32(g.yarn_factor)));
            meta.push((
                k("rope.scaling.original_context_length"),
                Value::U32(g.yarn_original_context as u32),
            ));
        }
        if let Some(e) = s.experts {
            meta.push((k("expert_count"), Value::U32(e.count as u32)));
            meta.push((k("expert_used_count"), Value::U32(e.used as u32)));
            meta.push((
                k("expert_feed_forward_length"),
                Value::U32(e.intermediate_size as u32),
            ));
        }
        if let Some(hy) = s.hybrid {
            let u = |n: usize| Value::U32(n as u32);
            meta.extend([
                (k("ssm.conv_kernel"), u(hy.conv_kernel)),
                (k("ssm.state_size"), u(hy.state_size)),
                (k("ssm.group_count"), u(hy.k_heads)),
                (k("ssm.time_step_rank"), u(hy.v_heads)),
                (k("ssm.inner_size"), u(hy.v_heads * hy.state_size)),
                (k("full_attention_interval"), u(hy.full_attention_interval)),
                (k("rope.dimension_count"), u(hy.rotary_dim)),
                (
                    k("rope.dimension_sections"),
                    // Qwen3.5's default split of the rotated pairs (llama.cpp's converter).
                    Value::Array([11, 11, 10, 0].map(Value::I32).to_vec()),
                ),
            ]);
            if hy.shared_expert_size > 0 {
                meta.push((
                    k("expert_shared_feed_forward_length"),
                    u(hy.shared_expert_size),
                ));
            }
        }
        meta.extend(tokenizer_metadata(
            vocabulary(vocab),
            // One merge (`t` + `0` = the first filler): llama.cpp refuses an empty merges
            // array (its GGUF writer types the array by its elements), and so could not run
            // the file beside sluice.
            vec!["t 0".to_string()],
            SPECIAL_TOKENS.len(),
            (endoftext, im_end),
        ));
        let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> =
            tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let file = std::fs::File::create(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut out = std::io::BufWriter::with_capacity(1 << 22, file);
        gguf_file::write(&mut out, &meta_refs, &tensor_refs)?;
        std::io::Write::flush(&mut out).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        drop(out);
        if !mxfp4.is_empty() {
            crate::gguf_header::patch_to_mxfp4(path, &mxfp4).map_err(|source| ModelError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        }
        Ok(tensors.iter().map(|(_, t)| t.storage_size_in_bytes()).sum())
    }
}

/// `rows` rows of `cols` values as MXFP4 blocks, each a copy of one of `pool` random rows: a
/// scale of 2^-8 or 2^-9 (values up to about 1/sqrt(cols) for gpt-oss's 2880) and random
/// E2M1 nibbles, every block a valid one.
fn mxfp4_pooled_rows(rng: &mut Rng, rows: usize, cols: usize, pool: usize) -> Vec<u8> {
    let row_bytes = cols / 32 * 17;
    let pool_rows = pool.min(rows);
    let mut rows_pool = vec![0u8; pool_rows * row_bytes];
    for block in rows_pool.chunks_exact_mut(17) {
        block[0] = 118 + (rng.next_u64() % 2) as u8;
        for b in &mut block[1..] {
            *b = rng.next_u64() as u8;
        }
    }
    let mut bytes = Vec::with_capacity(rows * row_bytes);
    for _ in 0..rows {
        let r = (rng.next_u64() % pool_rows as u64) as usize;
        bytes.extend_from_slice(&rows_pool[r * row_bytes..][..row_bytes]);
    }
    bytes
}

/// `dtype`, or, where rows of `cols` values do not split into its blocks (SmolLM2's 576 into
/// the K-quants' 256), what llama.cpp falls back to for such rows: Q8_0 (32-value blocks).
fn fit(dtype: GgmlDType, cols: usize) -> GgmlDType {
    if cols.is_multiple_of(dtype.block_size()) {
        dtype
    } else {
        GgmlDType::Q8_0
    }
}

/// A `[rows, cols]` matrix of `dtype` whose rows are drawn from `pool` random rows (values
/// uniform in +-1/sqrt(cols)) quantized once.
fn pooled_matrix(
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    dtype: GgmlDType,
    pool: usize,
) -> Result<QTensor> {
    let pool_rows = pool.min(rows);
    let scale = 1.0 / (cols as f32).sqrt();
    let values: Vec<f32> = (0..pool_rows * cols)
        .map(|_| rng.next_f32() * scale)
        .collect();
    let pool = QTensor::quantize(
        &Tensor::from_vec(values, (pool_rows, cols), &Device::Cpu)?,
        dtype,
    )?;
    let pool = pool.data()?;
    let row_bytes = pool.len() / pool_rows;
    let mut bytes = Vec::with_capacity(rows * row_bytes);
    for _ in 0..rows {
        let r = (rng.next_u64() % pool_rows as u64) as usize;
        bytes.extend_from_slice(&pool[r * row_bytes..][..row_bytes]);
    }
    let storage = QStorage::from_data(std::borrow::Cow::Owned(bytes), &Device::Cpu, dtype)?;
    Ok(QTensor::new(storage, (rows, cols))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_formats_parse_by_name() {
        let shape: ModelShape = "Qwen2.5-1.5B".parse().unwrap();
        assert_eq!(shape.hidden_size, 1536);
        assert!("gpt-5"
            .parse::<ModelShape>()
            .unwrap_err()
            .contains("qwen2.5-7b"));
        assert_eq!(
            "q4_k".parse::<SyntheticFormat>(),
            Ok(SyntheticFormat::Uniform(GgmlDType::Q4K))
        );
        assert_eq!(
            "Q4_K_M".parse::<SyntheticFormat>(),
            Ok(SyntheticFormat::Q4KM)
        );
        assert!("q9".parse::<SyntheticFormat>().is_err());
    }

    #[test]
    fn q4_k_m_gives_v_and_down_more_bits_in_llama_cpp_layers() {
        let f = SyntheticFormat::Q4KM;
        // 28 layers: 0..3 and 24.. get more bits, and 3 + 3j + 2 between.
        let more: Vec<usize> = (0..28)
            .filter(|&i| f.dtype(Role::FfnDown, i, 28, 0) == GgmlDType::Q6K)
            .collect();
        assert_eq!(more, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
        assert_eq!(f.dtype(Role::Other, 0, 28, 0), GgmlDType::Q4K);
        assert_eq!(f.dtype(Role::Output, 28, 28, 0), GgmlDType::Q6K);
        // 8 experts (Mixtral): K and V in Q8_0, the attention output in Q5_K.
        assert_eq!(f.dtype(Role::AttnK, 3, 32, 8), GgmlDType::Q8_0);
        assert_eq!(f.dtype(Role::AttnV, 3, 32, 8), GgmlDType::Q8_0);
        assert_eq!(f.dtype(Role::AttnOutput, 3, 32, 8), GgmlDType::Q5K);
        assert_eq!(f.dtype(Role::AttnOutput, 3, 48, 128), GgmlDType::Q4K);
        assert_eq!(fit(GgmlDType::Q4K, 576), GgmlDType::Q8_0);
        assert_eq!(fit(GgmlDType::Q4_1, 576), GgmlDType::Q4_1);
    }

    /// gpt-oss's shape in small, in llama.cpp's MXFP4_MOE mix: the experts read back as MXFP4
    /// (patched in place from their placeholders), the rest Q8_0, and the model runs.
    #[test]
    fn a_gpt_oss_shape_writes_mxfp4_experts_that_load_and_run() {
        let shape = ModelShape {
            name: "tiny-gpt-oss",
            hidden_size: 128,
            intermediate_size: 64,
            num_layers: 2,
            num_heads: 2,
            num_kv_heads: 1,
            vocab_size: 512,
            context_length: 256,
            experts: Some(ShapeExperts {
                count: 4,
                used: 2,
                intermediate_size: 64,
            }),
            gpt_oss: Some(GptOssAttention {
                window: 8,
                yarn_factor: 4.0,
                yarn_original_context: 64,
            }),
            ..SHAPES[7]
        };
        let spec = SyntheticSpec {
            shape,
            format: SyntheticFormat::Mxfp4Moe,
            num_layers: None,
            seed: 3,
        };
        let dir = std::env::temp_dir().join(format!("sluice-synth-oss-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny-gpt-oss.gguf");
        let bytes = spec.write_gguf(&path).unwrap();
        let file = crate::GgufFile::open(&path).unwrap();
        for name in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
            assert!(file.is_mxfp4(&format!("blk.1.{name}.weight")), "{name}");
        }
        assert_eq!(
            file.content.tensor_infos["blk.0.ffn_down_exps.weight"]
                .shape
                .dims(),
            [4, 128, 64]
        );
        assert_eq!(
            file.content.tensor_infos["blk.0.attn_q.weight"].ggml_dtype,
            GgmlDType::Q8_0
        );
        assert!(bytes > 0);
        for weights in [crate::WeightsKind::Auto, crate::WeightsKind::Exact] {
            let options = crate::LoadOptions {
                weights,
                ..crate::LoadOptions::default()
            };
            let model = crate::LlamaModel::load(&path, &options).unwrap();
            assert_eq!(model.config().window_of_layer(0), Some(8));
            let mut kv = model.new_kv_cache(2, 16).unwrap();
            let mut batch = crate::StepBatch::new(16);
            batch.push_sequence(&(0..20).collect::<Vec<u32>>(), 0, &[0, 1], true);
            let logits = model.forward(&batch, &mut kv).unwrap();
            let row = logits.to_vec2::<f32>().unwrap().remove(0);
            assert!(row.iter().all(|v| v.is_finite()), "{weights}");
        }
    }

    #[test]
    fn the_vocabulary_has_the_shapes_size_and_unique_tokens() {
        let tokens = vocabulary(1000);
        assert_eq!(tokens.len(), 1000);
        let unique: std::collections::HashSet<&String> = tokens.iter().collect();
        assert_eq!(unique.len(), 1000);
        assert_eq!(tokens[999], "<|im_end|>");
    }
}
