//! Hyper-parameters of a llama-family transformer, independent of the file they came from.
//! What a family decides lives in the `arch` modules (with `ModelConfig::layer_plan` and the
//! parameter counts, which ask the family); this is what every family's files fill.

/// The families whose forward sluice runs: the key of the `arch` registry, where each
/// family's module says what it is (`Architecture::family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// llama, SmolLM, Mistral; Mixtral with experts (`arch::llama`).
    Llama,
    /// qwen2: biases on Q, K and V (`arch::qwen2`).
    Qwen2,
    /// qwen3: per-head QK-norm (`arch::qwen3`).
    Qwen3,
    /// qwen2moe: qwen2's attention, experts beside a gated shared expert (`arch::qwen_moe`).
    Qwen2Moe,
    /// qwen3moe (Qwen3-30B-A3B): qwen3's attention, experts (`arch::qwen_moe`).
    Qwen3Moe,
    /// gemma3 text models (`arch::gemma3`).
    Gemma3,
    /// gpt-oss-20b/-120b (`arch::gpt_oss`).
    GptOss,
    /// SmolLM3: llama's layers, every fourth without RoPE (`arch::smollm3`).
    SmolLm3,
    /// qwen35 (Qwen3.5/3.6 dense): Gated DeltaNet layers and gated full attention
    /// (`arch::qwen35`).
    Qwen35,
    /// qwen35moe (Qwen3.5/3.6-A3B...): qwen35's layers, experts beside a gated shared expert
    /// (`arch::qwen35`).
    Qwen35Moe,
    /// qwen3next (Qwen3-Next-80B-A3B, Qwen3-Coder-Next): qwen35moe's layers in another tensor
    /// layout (`arch::qwen35`).
    Qwen3Next,
}

/// The Gated DeltaNet layers of a hybrid (Qwen3.5/3.6): linear attention whose memory of a
/// sequence is a fixed-size state (a conv's last inputs and a `head_dim x head_dim` matrix a
/// value head), not a KV cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaNetConfig {
    /// Taps of the causal conv over q, k and v (GGUF `ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// The size of every key and value head (`ssm.state_size`).
    pub head_dim: usize,
    /// Key heads (`ssm.group_count`).
    pub k_heads: usize,
    /// Value heads (`ssm.time_step_rank`).
    pub v_heads: usize,
    /// `recurrent[i]`: layer `i` is a DeltaNet layer (the others full attention).
    pub recurrent: Vec<bool>,
    /// Value head `h` reads key head `h % k_heads` (llama.cpp's GGUF order) rather than
    /// `h / (v_heads / k_heads)`.
    pub tiled: bool,
}

impl DeltaNetConfig {
    /// The kernel's view of a layer.
    pub fn shape(&self) -> sluice_kernels::cpu::delta_net::DeltaNetShape {
        sluice_kernels::cpu::delta_net::DeltaNetShape {
            k_heads: self.k_heads,
            v_heads: self.v_heads,
            head_dim: self.head_dim,
            conv_kernel: self.conv_kernel,
            tiled: self.tiled,
        }
    }

    /// Whether layer `i` is a DeltaNet layer.
    pub fn is_recurrent(&self, layer: usize) -> bool {
        self.recurrent.get(layer).copied().unwrap_or(false)
    }

    /// The DeltaNet layers, ascending.
    pub fn layers(&self) -> Vec<usize> {
        (0..self.recurrent.len())
            .filter(|&i| self.recurrent[i])
            .collect()
    }

    /// f32 values of one sequence's state in one layer: the conv's last inputs and every
    /// value head's matrix.
    pub fn state_values_per_layer(&self) -> usize {
        let shape = self.shape();
        shape.conv_state_len() + self.v_heads * shape.head_state_len()
    }

    /// Bytes of one sequence's state over every DeltaNet layer (f32).
    pub fn state_bytes(&self) -> usize {
        4 * self.state_values_per_layer() * self.layers().len()
    }
}

/// How a router's logits become its chosen experts' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertGating {
    /// A softmax over every expert, then the top k's probabilities (Mixtral, the qwen MoEs).
    SoftmaxTopK,
    /// The top k of the raw logits, then a softmax over those k (gpt-oss).
    TopKSoftmax,
}

/// The gated activation of every expert's MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertActivation {
    /// `silu(gate) * up`.
    Swiglu,
    /// gpt-oss's: `g * sigmoid(1.702 g) * (u + 1)` with `g = min(gate, 7)` and `u = up`
    /// clamped to `[-7, 7]`.
    ClampedSwiglu,
}

/// A mixture of experts in place of a layer's MLP: a router picks `num_experts_used` of
/// `num_experts` SwiGLU experts for every token and sums their outputs, weighted by the
/// router's probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    /// k: the experts each token runs.
    pub num_experts_used: usize,
    /// Each expert's intermediate size.
    pub expert_intermediate_size: usize,
    /// The k chosen probabilities divided by their sum (Mixtral, qwen3moe's `norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// A factor on the k weights (GGUF `expert_weights_scale`); 1 for none.
    pub weights_scale: f32,
    /// qwen2moe's shared expert: its intermediate size.
    pub shared_expert_intermediate_size: Option<usize>,
    /// Layers that hold a dense MLP of `intermediate_size` instead of experts (HF qwen MoE
    /// configs' `mlp_only_layers` and `decoder_sparse_step`); empty for every GGUF file.
    pub dense_layers: Vec<usize>,
}

impl MoeConfig {
    /// Whether layer `i` holds experts.
    pub fn is_sparse(&self, layer: usize) -> bool {
        !self.dense_layers.contains(&layer)
    }

    /// Checks the counts: at least one expert, and 1 <= k <= experts. `Err` says which count
    /// is wrong, for the loader to name the key it came from.
    pub fn check(&self) -> Result<(), MoeConfigError> {
        if self.num_experts == 0 {
            return Err(MoeConfigError::NoExperts);
        }
        if self.num_experts_used == 0 || self.num_experts_used > self.num_experts {
            return Err(MoeConfigError::ExpertsUsed {
                used: self.num_experts_used,
                experts: self.num_experts,
            });
        }
        if self.expert_intermediate_size == 0 {
            return Err(MoeConfigError::IntermediateSize);
        }
        if !(self.weights_scale.is_finite() && self.weights_scale > 0.0) {
            return Err(MoeConfigError::Scale(self.weights_scale));
        }
        Ok(())
    }
}

/// What is wrong with a [`MoeConfig`]'s counts.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MoeConfigError {
    #[error("a mixture of experts needs at least one expert, found 0")]
    NoExperts,
    #[error("{used} experts used per token must be between 1 and the {experts} experts")]
    ExpertsUsed { used: usize, experts: usize },
    #[error("the experts' intermediate size must be positive")]
    IntermediateSize,
    #[error("the experts' weight scale must be positive and finite, found {0}")]
    Scale(f32),
}

/// Layers that attend over a sliding window of recent keys (Gemma 3's local layers), with a
/// rotary base of their own.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Keys a query sees, itself included: position `p` attends to `p + 1 - window..=p`.
    pub window: usize,
    /// `local[i]`: whether layer `i` is a sliding-window layer (the others attend to all).
    pub local: Vec<bool>,
    /// The local layers' rotary base; they take no rope scaling (llama.cpp's and HF's rule:
    /// the scaling is the global layers').
    pub local_rope_theta: f32,
}

impl SlidingWindow {
    /// The window layer `i` attends over, `None` for a global layer.
    pub fn of_layer(&self, layer: usize) -> Option<usize> {
        self.local
            .get(layer)
            .copied()
            .unwrap_or(false)
            .then_some(self.window)
    }
}

/// How rotary frequencies are stretched for contexts longer than the model was trained on.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor` (equivalently, every frequency divided by it).
    Linear { factor: f32 },
    /// A per-frequency divisor (llama3-style scaling as GGUF stores it: `rope_freqs.weight`).
    FreqFactors(Vec<f32>),
    /// YaRN (gpt-oss, long-context Qwen): frequencies interpolated by `factor` below a ramp
    /// between the dimensions where `beta_slow` and `beta_fast` rotations fit the original
    /// context, kept above it, and cos/sin scaled by `attn_factor * (1 + 0.1 ln factor)`.
    Yarn(Yarn),
}

/// The parameters of [`RopeScaling::Yarn`], as GGUF `rope.scaling.*` keys or config.json's
/// `rope_scaling` give them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    /// The context the model was trained on before the extension.
    pub original_context: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub attn_factor: f32,
    /// The ramp's ends rounded to whole dimensions (floor and ceil), as llama.cpp always
    /// rounds them; transformers' `truncate` (true unless a config says false, as gpt-oss's).
    pub truncate: bool,
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
    /// A mixture of experts in place of the MLP (Mixtral, qwen2moe, qwen3moe); `None` for a
    /// dense model.
    pub moe: Option<MoeConfig>,
    /// Sliding-window layers (Gemma 3); `None` when every layer attends to the whole context.
    pub sliding_window: Option<SlidingWindow>,
    /// The factor on each query-key product; `None` for `1 / sqrt(head_dim)`. Gemma's comes
    /// from its `query_pre_attn_scalar`.
    pub attention_scale: Option<f32>,
    /// Final logits soft-capped as `cap * tanh(logits / cap)` (Gemma 2, some Gemma 3 files).
    pub final_logit_softcap: Option<f32>,
    /// Layers that attend without rotating Q and K (SmolLM3's every fourth); empty for most.
    pub layers_without_rope: Vec<usize>,
    /// Dimensions of each head that RoPE rotates, from the first (GGUF `rope.dimension_count`,
    /// HF `partial_rotary_factor`); `None`: all of them. The rest pass through.
    pub rotary_dim: Option<usize>,
    /// The hybrids' Gated DeltaNet layers; `None` when every layer attends.
    pub delta_net: Option<DeltaNetConfig>,
}

impl ModelConfig {
    /// The factor on each query-key product: the file's, else `1 / sqrt(head_dim)`.
    pub fn query_scale(&self) -> f32 {
        self.attention_scale
            .unwrap_or_else(|| 1.0 / (self.head_dim as f32).sqrt())
    }

    /// The sliding window layer `i` attends over, `None` for a layer that sees every key.
    pub fn window_of_layer(&self, layer: usize) -> Option<usize> {
        self.sliding_window.as_ref().and_then(|s| s.of_layer(layer))
    }

    /// Query heads that share one KV head.
    pub fn gqa_group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Bytes of K and V that one token occupies across all layers at `bytes_per_value` (the
    /// attention layers: a DeltaNet layer keeps no K/V).
    pub fn kv_bytes_per_token(&self, bytes_per_value: usize) -> usize {
        2 * self.num_attention_layers() * self.num_kv_heads * self.head_dim * bytes_per_value
    }

    /// Layers that attend (and keep K/V): all but the DeltaNet layers.
    pub fn num_attention_layers(&self) -> usize {
        let recurrent = self.delta_net.as_ref().map_or(0, |d| {
            d.recurrent
                .iter()
                .take(self.num_layers)
                .filter(|&&r| r)
                .count()
        });
        self.num_layers - recurrent
    }

    /// Whether layer `i` is a DeltaNet layer.
    pub fn is_recurrent(&self, layer: usize) -> bool {
        self.delta_net
            .as_ref()
            .is_some_and(|d| d.is_recurrent(layer))
    }

    /// Dimensions of a head that RoPE rotates.
    pub fn rotary_dims(&self) -> usize {
        self.rotary_dim.unwrap_or(self.head_dim)
    }
}
