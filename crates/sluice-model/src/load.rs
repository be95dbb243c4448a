//! What loading a model takes: the options a user picks ([`LoadOptions`]), the tensors of a
//! llama-family model by role ([`Weight`]), and what a file format hands the layer builder
//! ([`WeightSource`], implemented in [`crate::gguf`] and [`crate::hf`]).

use std::path::Path;
use std::str::FromStr;

use candle_core::{Device, Tensor};

use crate::attention::AttentionBackend;
use crate::embedding::Embedding;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvDtype;
use crate::weights::{Linear, LinearOptions, WeightsKind};

/// How decode steps run on a GPU (`--cuda-graphs`; [`crate::PagedLlama::enable_cuda_graphs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CudaGraphs {
    /// Captured once per bucket and replayed (the default).
    #[default]
    On,
    /// Every step on the eager forward, as before graphs: to compare.
    Off,
    /// The graphs' launches on their static buffers, enqueued one by one each step: what a
    /// replay must equal bit for bit (tests), and a way to tell a capture problem from a
    /// kernel one.
    Eager,
}

impl FromStr for CudaGraphs {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            "eager" => Ok(Self::Eager),
            other => Err(format!(
                "--cuda-graphs takes on, off or eager, not {other:?}"
            )),
        }
    }
}

impl std::fmt::Display for CudaGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::On => "on",
            Self::Off => "off",
            Self::Eager => "eager",
        })
    }
}

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub weights: WeightsKind,
    pub device: Device,
    /// `None`: the CPU kernel where it runs (AVX-512), the reference elsewhere.
    pub attention: Option<AttentionBackend>,
    /// Element type of the KV cache: F16 (default: half the bytes read per decode step, as
    /// llama.cpp) or F32.
    pub kv_dtype: KvDtype,
    /// With [`WeightsKind::Auto`] on a CPU with AMX, steps of at least this many rows of the
    /// f32 panels (f32/f16 matrices; quantized formats run on the int8 kernels, which AMX
    /// CPUs all have) multiply on AMX tiles (`sluice_kernels::cpu::amx`, split-bf16 products;
    /// e.g. [`AUTO_AMX_MIN_ROWS`](crate::weights::AUTO_AMX_MIN_ROWS)), smaller ones on the
    /// exact f32 kernels. Default `None`, every step exact: with a threshold, a step's
    /// size chooses its rows' arithmetic, and batching shows in the results. For benches and
    /// tests of the tiles (`Some(1)`: every step on them).
    pub amx_min_rows: Option<usize>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            weights: WeightsKind::Auto,
            device: Device::Cpu,
            attention: None,
            kv_dtype: KvDtype::F16,
            amx_min_rows: None,
        }
    }
}

impl LoadOptions {
    /// The weights' kind on this device: `auto` on a GPU is bf16, which measured faster than
    /// the file's blocks there (`--weights quantized`) at 1 and at 256 clients on the
    /// Qwen2.5-1.5B shape, and at 256 on the 7B shape (BENCHMARKS.md, GPU section); `exact`
    /// is f32 there; elsewhere the kind asked for.
    pub fn effective_weights(&self) -> WeightsKind {
        match (self.weights, self.device.is_cuda()) {
            (WeightsKind::Auto, true) => WeightsKind::Bf16,
            // No exact panels on a GPU: f32's own arithmetic there.
            (WeightsKind::Exact, true) => WeightsKind::F32,
            (kind, _) => kind,
        }
    }

    /// What building a linear layer needs of these options.
    pub(crate) fn linear(&self) -> LinearOptions {
        LinearOptions {
            kind: self.effective_weights(),
            device: self.device.clone(),
            amx_min_rows: self.amx_min_rows,
        }
    }
}

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
    /// Gemma's norm of the attention's output, before it joins the residual stream.
    AttnPostNorm(usize),
    FfnNorm(usize),
    /// Gemma's norm of the MLP's output, before it joins the residual stream.
    FfnPostNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
    /// A mixture of experts' router `[experts, hidden]`.
    Router(usize),
    /// qwen2moe's shared expert: its MLP, and its gate `[1, hidden]` (GGUF: `[hidden]`).
    SharedGate(usize),
    SharedUp(usize),
    SharedDown(usize),
    SharedRouter(usize),
    /// gpt-oss: the attention output's bias `[hidden]`.
    OBias(usize),
    /// gpt-oss: one sink logit a query head `[heads]`.
    Sinks(usize),
    /// gpt-oss: the router's bias `[experts]`, and every expert's gate, up and down biases
    /// (`[experts, inter]`, `[experts, inter]`, `[experts, hidden]`).
    RouterBias(usize),
    ExpertGateBias(usize),
    ExpertUpBias(usize),
    ExpertDownBias(usize),
    /// A Gated DeltaNet layer's in-projections: q, k and v (the conv's input) `[conv_dim,
    /// hidden]`, the output gate z `[value_dim, hidden]`, beta and alpha `[v_heads, hidden]`.
    SsmQkv(usize),
    SsmGate(usize),
    SsmBeta(usize),
    SsmAlpha(usize),
    /// Its conv taps `[conv_dim, conv_kernel]`, alpha's bias and `-exp(A_log)` (`[v_heads]`
    /// each), its output norm `[head_dim]` and out-projection `[hidden, value_dim]`.
    SsmConv(usize),
    SsmDtBias(usize),
    SsmA(usize),
    SsmNorm(usize),
    SsmOut(usize),
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
            Self::AttnPostNorm(i) => blk(i, "post_attention_norm.weight"),
            Self::FfnNorm(i) => blk(i, "ffn_norm.weight"),
            Self::FfnPostNorm(i) => blk(i, "post_ffw_norm.weight"),
            Self::Gate(i) => blk(i, "ffn_gate.weight"),
            Self::Up(i) => blk(i, "ffn_up.weight"),
            Self::Down(i) => blk(i, "ffn_down.weight"),
            Self::Router(i) => blk(i, "ffn_gate_inp.weight"),
            Self::SharedGate(i) => blk(i, "ffn_gate_shexp.weight"),
            Self::SharedUp(i) => blk(i, "ffn_up_shexp.weight"),
            Self::SharedDown(i) => blk(i, "ffn_down_shexp.weight"),
            Self::SharedRouter(i) => blk(i, "ffn_gate_inp_shexp.weight"),
            Self::OBias(i) => blk(i, "attn_output.bias"),
            Self::Sinks(i) => blk(i, "attn_sinks.weight"),
            Self::RouterBias(i) => blk(i, "ffn_gate_inp.bias"),
            Self::ExpertGateBias(i) => blk(i, "ffn_gate_exps.bias"),
            Self::ExpertUpBias(i) => blk(i, "ffn_up_exps.bias"),
            Self::ExpertDownBias(i) => blk(i, "ffn_down_exps.bias"),
            Self::SsmQkv(i) => blk(i, "attn_qkv.weight"),
            Self::SsmGate(i) => blk(i, "attn_gate.weight"),
            Self::SsmBeta(i) => blk(i, "ssm_beta.weight"),
            Self::SsmAlpha(i) => blk(i, "ssm_alpha.weight"),
            Self::SsmConv(i) => blk(i, "ssm_conv1d.weight"),
            Self::SsmDtBias(i) => blk(i, "ssm_dt.bias"),
            Self::SsmA(i) => blk(i, "ssm_a"),
            Self::SsmNorm(i) => blk(i, "ssm_norm.weight"),
            Self::SsmOut(i) => blk(i, "ssm_out.weight"),
        }
    }

    /// Whether the tensor is an RMSNorm's weight: Gemma's Hugging Face checkpoints store it
    /// minus one (`x * (1 + w)`), GGUF files with the one added.
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            Self::OutputNorm
                | Self::AttnNorm(_)
                | Self::QNorm(_)
                | Self::KNorm(_)
                | Self::AttnPostNorm(_)
                | Self::FfnNorm(_)
                | Self::FfnPostNorm(_)
        )
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
            // Gemma's post-norms (its `post_attention_layernorm` is the attention's post-norm,
            // not the MLP's pre-norm: `arch::gemma3`).
            Self::AttnPostNorm(i) => layer(i, "post_attention_layernorm.weight"),
            Self::FfnPostNorm(i) => layer(i, "post_feedforward_layernorm.weight"),
            Self::Gate(i) => layer(i, "mlp.gate_proj.weight"),
            Self::Up(i) => layer(i, "mlp.up_proj.weight"),
            Self::Down(i) => layer(i, "mlp.down_proj.weight"),
            // Qwen's names, and transformers' since v5 for Mixtral too (older Mixtral
            // checkpoints say `block_sparse_moe.gate`: `hf.rs` looks for both).
            Self::Router(i) => layer(i, "mlp.gate.weight"),
            Self::SharedGate(i) => layer(i, "mlp.shared_expert.gate_proj.weight"),
            Self::SharedUp(i) => layer(i, "mlp.shared_expert.up_proj.weight"),
            Self::SharedDown(i) => layer(i, "mlp.shared_expert.down_proj.weight"),
            Self::SharedRouter(i) => layer(i, "mlp.shared_expert_gate.weight"),
            // transformers' gpt-oss names (its experts' gate and up biases are interleaved in
            // one tensor: `hf.rs` takes every other column).
            Self::OBias(i) => layer(i, "self_attn.o_proj.bias"),
            Self::Sinks(i) => layer(i, "self_attn.sinks"),
            Self::RouterBias(i) => layer(i, "mlp.router.bias"),
            Self::ExpertGateBias(i) | Self::ExpertUpBias(i) => {
                layer(i, "mlp.experts.gate_up_proj_bias")
            }
            Self::ExpertDownBias(i) => layer(i, "mlp.experts.down_proj_bias"),
            // transformers' Qwen3.5 names.
            Self::SsmQkv(i) => layer(i, "linear_attn.in_proj_qkv.weight"),
            Self::SsmGate(i) => layer(i, "linear_attn.in_proj_z.weight"),
            Self::SsmBeta(i) => layer(i, "linear_attn.in_proj_b.weight"),
            Self::SsmAlpha(i) => layer(i, "linear_attn.in_proj_a.weight"),
            Self::SsmConv(i) => layer(i, "linear_attn.conv1d.weight"),
            Self::SsmDtBias(i) => layer(i, "linear_attn.dt_bias"),
            Self::SsmA(i) => layer(i, "linear_attn.A_log"),
            Self::SsmNorm(i) => layer(i, "linear_attn.norm.weight"),
            Self::SsmOut(i) => layer(i, "linear_attn.out_proj.weight"),
        }
    }
}

/// The sizes of a layer's experts: `experts` SwiGLU MLPs of `inter` over `hidden`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExpertMatrices {
    pub experts: usize,
    pub inter: usize,
    pub hidden: usize,
}

/// What the layer builder needs from a file format.
pub(crate) trait WeightSource {
    /// The file or directory, for logs and errors.
    fn path(&self) -> &Path;
    fn has(&self, w: Weight) -> bool;
    /// `w` (a vector, or the embedding) as f32 on `device`, checked to have `shape`.
    fn dense(&mut self, w: Weight, shape: &[usize], device: &Device) -> Result<Tensor>;
    /// The token embedding `[vocab, hidden]`: f32 rows unless the format keeps its own blocks.
    fn embedding(&mut self, shape: [usize; 2], options: &LinearOptions) -> Result<Embedding> {
        Ok(Embedding::Dense(self.dense(
            Weight::Embed,
            &shape,
            &options.device,
        )?))
    }
    /// The matrices `parts` (`(weight, rows)`, each `[rows, cols]`) stacked along their rows
    /// into one layer, so one matmul computes them all.
    fn linear(
        &mut self,
        parts: &[(Weight, usize)],
        cols: usize,
        bias: Option<Tensor>,
        options: &LinearOptions,
    ) -> Result<Linear>;
    /// Layer `layer`'s experts, each its gate and up stacked (`[2 * inter, hidden]`) and its
    /// down (`[hidden, inter]`), in expert order; an error naming the tensor when one is
    /// missing or mis-shaped.
    fn experts(
        &mut self,
        layer: usize,
        shape: ExpertMatrices,
        options: &LinearOptions,
    ) -> Result<Vec<crate::moe::Expert>>;
    /// A layer's weights are all built: what was read for them need not stay resident.
    fn layer_done(&mut self) -> Result<()> {
        Ok(())
    }
    /// The output projection `[vocab, hidden]`: the embedding itself when `tied`.
    fn lm_head(&mut self, tied: bool, shape: [usize; 2], options: &LinearOptions)
        -> Result<Linear>;
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
