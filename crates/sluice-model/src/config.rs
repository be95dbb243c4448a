//! Hyper-parameters of a llama-family transformer, independent of the file they came from.

/// The architectures whose forward we implement. They share one code path; the differences are
/// data (biases, QK-norm) rather than structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// llama, SmolLM, Mistral: no biases.
    Llama,
    /// qwen2: biases on the Q, K and V projections.
    Qwen2,
    /// qwen3: no biases; an RMSNorm over each head of Q and K before the rotary embedding, and
    /// a head size of its own (not necessarily hidden / heads).
    Qwen3,
}

impl Architecture {
    /// Names as GGUF `general.architecture` and Hugging Face `model_type` spell them.
    pub const NAMES: &'static [&'static str] = &["llama", "mistral", "qwen2", "qwen3"];

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" | "mistral" => Some(Self::Llama),
            "qwen2" => Some(Self::Qwen2),
            "qwen3" => Some(Self::Qwen3),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }

    pub fn has_qkv_bias(self) -> bool {
        matches!(self, Self::Qwen2)
    }

    /// Per-head RMSNorm of Q and K (weights of `head_dim`) before the rotary embedding.
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Self::Qwen3)
    }
}

/// How rotary frequencies are stretched for contexts longer than the model was trained on.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor` (equivalently, every frequency divided by it).
    Linear { factor: f32 },
    /// A per-frequency divisor (llama3-style scaling as GGUF stores it: `rope_freqs.weight`).
    FreqFactors(Vec<f32>),
}

/// How an embedding pools a sequence's final (normed) hidden states into one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every token: sentence-transformers' default for encoders.
    Mean,
    /// The first token's state (BERT's `[CLS]`).
    Cls,
    /// The last token's state: decoder embedding models (Qwen3-Embedding), whose last token
    /// has attended to the whole input.
    Last,
}

impl Pooling {
    pub const NAMES: &'static [&'static str] = &["mean", "cls", "last"];

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "mean" => Some(Self::Mean),
            "cls" => Some(Self::Cls),
            "last" => Some(Self::Last),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::Cls => "cls",
            Self::Last => "last",
        }
    }
}

impl std::str::FromStr for Pooling {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Self::from_name(name).ok_or_else(|| {
            format!(
                "`{name}` is not a pooling; use one of {}",
                Self::NAMES.join(", ")
            )
        })
    }
}

impl std::fmt::Display for Pooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    /// Longest sequence the model supports (prompt + generated tokens).
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// The pooling the file declares for embeddings (GGUF `{arch}.pooling_type`); `None` when
    /// it declares none (a model made for generation).
    pub pooling: Option<Pooling>,
}

impl ModelConfig {
    /// Query heads that share one KV head.
    pub fn gqa_group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Bytes of K and V that one token occupies across all layers at `bytes_per_value`.
    pub fn kv_bytes_per_token(&self, bytes_per_value: usize) -> usize {
        2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_value
    }

    /// Parameters of the transformer (embedding counted once when tied), for FLOP estimates.
    pub fn num_parameters(&self) -> usize {
        let attn = self.hidden_size * self.num_heads * self.head_dim * 2
            + self.hidden_size * self.num_kv_heads * self.head_dim * 2;
        let mlp = 3 * self.hidden_size * self.intermediate_size;
        let embed = self.vocab_size * self.hidden_size;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        self.num_layers * (attn + mlp + 2 * self.hidden_size) + embed + head + self.hidden_size
    }
}
