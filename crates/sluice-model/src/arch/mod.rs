//! Model families as units. Each module here holds everything one family decides: the names
//! it answers to (GGUF `general.architecture`, Hugging Face `model_type`), the hyper-parameters
//! only its files carry (from GGUF keys and from its own config.json fields), its tensor names
//! where they differ from llama's, and its per-layer plan ([`LayerPlan`]). [`FAMILIES`] is the
//! registry: one line a family. Outside this folder nothing matches on an architecture: the
//! loaders ask the family, the forwards read the plan, and [`supports`] answers once whether a
//! backend runs every layer kind a model has.
//!
//! A new family is a module here and a line in [`FAMILIES`] (and a variant of
//! [`Architecture`], the registry's key); a new layer kind is a field of [`LayerPlan`] that
//! the forwards read, and a line in [`supports`] for a backend that lacks it.

mod experts;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod export;
mod gemma3;
mod gpt_oss;
mod layer_plan;
mod llama;
mod qwen2;
mod qwen3;
mod qwen35;
pub(crate) mod qwen35_hf;
mod qwen_moe;
mod smollm3;
mod windows;

pub use crate::config::{Architecture, ExpertActivation, ExpertGating};
pub use layer_plan::{AttentionKind, LayerPlan, Mixer, MlpKind, Rotary};
pub(crate) use windows::{LocalTheta, WindowRule};

use candle_core::Tensor;
use sluice_kernels::cpu::swiglu::GatedActivation;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf_keys::GgufKeys;
use crate::hf_keys::HfKeys;
use crate::load::Weight;
use crate::weights::RowOrder;

/// The registry: every family sluice runs, one line each.
static FAMILIES: &[&dyn Family] = &[
    &llama::Llama,
    &qwen2::Qwen2,
    &qwen3::Qwen3,
    &qwen_moe::Qwen2Moe,
    &qwen_moe::Qwen3Moe,
    &gemma3::Gemma3,
    &gpt_oss::GptOss,
    &smollm3::SmolLm3,
    &qwen35::QWEN35,
    &qwen35::QWEN35MOE,
    &qwen35::QWEN3NEXT,
];

impl Architecture {
    /// The family behind this key.
    pub(crate) fn family(self) -> &'static dyn Family {
        *FAMILIES
            .iter()
            .find(|f| f.architecture() == self)
            .expect("every Architecture is registered in FAMILIES")
    }

    /// The family a GGUF `general.architecture` or a Hugging Face `model_type` names.
    pub fn from_name(name: &str) -> Option<Self> {
        FAMILIES
            .iter()
            .find(|f| f.names().contains(&name))
            .map(|f| f.architecture())
    }

    /// Every name some family answers to, for the message that refuses another.
    pub fn supported_names() -> Vec<&'static str> {
        FAMILIES
            .iter()
            .flat_map(|f| f.names().iter().copied())
            .collect()
    }

    /// The name GGUF files give the family (`general.architecture`): its first name.
    pub fn name(self) -> &'static str {
        self.family().names()[0]
    }

    /// Whether `name` (a GGUF `general.architecture` or HF `model_type`) is this family.
    pub fn answers_to(self, name: &str) -> bool {
        Self::from_name(name) == Some(self)
    }

    /// What the family is, in data.
    pub fn traits(self) -> &'static Traits {
        self.family().traits()
    }
}

/// What a family is, as data the loaders and the layer plan read.
#[derive(Debug)]
pub struct Traits {
    /// Biases on the Q, K and V projections.
    pub qkv_bias: bool,
    /// A bias on the attention's output projection.
    pub output_bias: bool,
    /// One learned logit a query head in every softmax's denominator (gpt-oss's sinks).
    pub attention_sinks: bool,
    /// Per-head RMSNorm of Q and K (weights of `head_dim`) before the rotary embedding.
    pub qk_norm: bool,
    /// Each query head's projection followed by a gate's (`attn_q` twice the heads' size):
    /// the attention output times its sigmoid (Qwen3.5's full-attention layers).
    pub attention_output_gate: bool,
    /// The embedding rows multiplied by sqrt(hidden) before the first layer (Gemma).
    pub scales_embeddings: bool,
    /// An RMSNorm on the attention's and on the MLP's output before each joins the residual
    /// stream (Gemma's `post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// The dense MLP's gate activation.
    pub activation: GatedActivation,
    /// llama.cpp's rope type NORM: its GGUF files hold Q and K rows permuted for the
    /// interleaved rotary, which the loader (and a GGUF LoRA adapter's reader) undoes.
    pub gguf_qk_permuted: bool,
    /// Whether the sliding-window layers take the global layers' rope scaling (gpt-oss), rather
    /// than a base of their own and no scaling (Gemma 3).
    pub local_layers_share_rope: bool,
    /// Hugging Face checkpoints store every RMSNorm weight minus one (Gemma: `x * (1 + w)`).
    pub hf_norms_minus_one: bool,
    /// Embeddings tied unless config.json says otherwise (Gemma; the others: tied when the
    /// checkpoint has no `lm_head`).
    pub hf_tied_by_default: bool,
    /// Its mixture of experts, where it can have one.
    pub experts: Option<ExpertTraits>,
}

/// How a family's mixture of experts is built.
#[derive(Debug)]
pub struct ExpertTraits {
    /// Every file holds experts (qwen MoEs, gpt-oss); llama holds them only when it says so
    /// (Mixtral).
    pub required: bool,
    /// How the router's logits become the chosen experts' weights.
    pub gating: ExpertGating,
    /// The experts' gated activation.
    pub activation: ExpertActivation,
    /// Biases on the router and every expert's gate, up and down (gpt-oss).
    pub biases: bool,
    /// The chosen weights divided by their sum where a file does not say (llama.cpp's choice
    /// for each family); `None`: never, whatever the file says (gpt-oss, whose weights are
    /// the softmax of the chosen logits).
    pub default_norm_topk: Option<bool>,
    /// Hugging Face: `Some(absent)`: config.json's `norm_topk_prob` decides the
    /// renormalisation, `absent` where it does not say (the qwen MoEs: false, transformers'
    /// default; Qwen3.5's: true, as vLLM reads those configs); `None`:
    /// [`Self::default_norm_topk`] decides (Mixtral: always; gpt-oss: never).
    pub hf_norm_topk_from_config: Option<bool>,
    /// A shared expert beside the routed ones, scaled by a sigmoid gate (qwen2moe).
    pub shared_expert: bool,
    /// Experts sized by `feed_forward_length / k` when a GGUF file gives no
    /// `expert_feed_forward_length` (llama.cpp's rule for the qwen MoEs); else by
    /// `feed_forward_length` itself (Mixtral).
    pub gguf_ff_divided_by_k: bool,
    /// Hugging Face: experts of `intermediate_size` (Mixtral, gpt-oss: no dense MLP), not
    /// `moe_intermediate_size`.
    pub hf_experts_of_intermediate_size: bool,
    /// How a Hugging Face checkpoint lays its experts out.
    pub hf_layout: HfExpertLayout,
}

/// How a Hugging Face checkpoint lays a layer's experts out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfExpertLayout {
    /// Each expert's own gate, up and down, or transformers 5's fused 3-D tensors.
    Separate,
    /// gpt-oss's: gate and up interleaved in one 3-D tensor with its biases, MXFP4 blocks and
    /// scales as released.
    GptOss,
}

/// What a family reads beyond the hyper-parameters every family shares.
#[derive(Debug, Default)]
pub(crate) struct FamilyParams {
    pub moe: Option<crate::config::MoeConfig>,
    pub sliding_window: Option<crate::config::SlidingWindow>,
    /// The factor on Q·K where it is not `1 / sqrt(head_dim)`.
    pub attention_scale: Option<f32>,
    pub final_logit_softcap: Option<f32>,
    /// Layers that attend without rotating Q and K (SmolLM3's every fourth).
    pub layers_without_rope: Vec<usize>,
    /// A context limit the family's config imposes (Mistral's and qwen's `sliding_window`
    /// attention, which sluice serves up to the window).
    pub context_limit: Option<usize>,
    /// Dimensions of a head that RoPE rotates, where not all (Qwen3.5's quarter).
    pub rotary_dim: Option<usize>,
    /// The hybrids' Gated DeltaNet layers.
    pub delta_net: Option<crate::config::DeltaNetConfig>,
    /// Layers of the main model where the file holds more blocks (Qwen3.5's multi-token
    /// prediction layers after them, kept aside): `block_count` less those.
    pub trunk_layers: Option<usize>,
}

/// One model family: see the module's documentation.
pub(crate) trait Family: Sync {
    fn architecture(&self) -> Architecture;

    /// GGUF's `general.architecture` first, then every other name (HF `model_type`s) it
    /// answers to.
    fn names(&self) -> &'static [&'static str];

    fn traits(&self) -> &'static Traits;

    /// What its GGUF files say beyond the shared keys. The default: the experts, where the
    /// family has any.
    fn gguf_params(&self, keys: &GgufKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        Ok(FamilyParams {
            moe: gguf_moe(self.traits(), keys, shared)?,
            ..FamilyParams::default()
        })
    }

    /// What its config.json says beyond the shared fields. The default: the experts, where the
    /// family has any.
    fn hf_params(&self, keys: &HfKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        Ok(FamilyParams {
            moe: hf_moe(self.architecture(), keys, shared, false)?,
            ..FamilyParams::default()
        })
    }

    /// Whether a Hugging Face checkpoint quantized by `method` (`quantization_config`) is
    /// read as it is; the others are refused.
    fn hf_accepts_quantization(&self, _method: &str) -> bool {
        false
    }

    /// The tensor's name in the family's GGUF files.
    fn gguf_tensor_name(&self, w: Weight) -> String {
        w.gguf_name()
    }

    /// The tensor's name in the family's Hugging Face checkpoints.
    fn hf_tensor_name(&self, w: Weight) -> String {
        w.hf_name()
    }

    /// The shape `w` has in the family's Hugging Face checkpoints where it differs from the
    /// layer's `shape` (its GGUF files'). The default: the same.
    fn hf_stored_shape(&self, _w: Weight, shape: &[usize], _config: &ModelConfig) -> Vec<usize> {
        shape.to_vec()
    }

    /// `w` as a Hugging Face checkpoint stores it, made what the family's GGUF files hold:
    /// what llama.cpp's converter does to it (the norms' one of
    /// [`Traits::hf_norms_minus_one`] aside). The default: nothing.
    fn hf_to_gguf(&self, _w: Weight, t: Tensor, _config: &ModelConfig) -> Result<Tensor> {
        Ok(t)
    }

    /// Where `w`'s rows lie in the tensor of the family's GGUF files that holds it
    /// ([`Family::gguf_tensor_name`]). The default: as stored (llama's Q/K un-permuting is
    /// the loader's, by [`Traits::gguf_qk_permuted`]).
    fn gguf_row_order(&self, _w: Weight, _config: &ModelConfig) -> RowOrder {
        RowOrder::Stored
    }

    /// The inverse of [`Family::hf_to_gguf`], for the test writer
    /// (`crate::testing::write_hf_from_gguf`).
    #[cfg(any(test, feature = "testing"))]
    fn gguf_to_hf(&self, _w: Weight, t: Tensor, _config: &ModelConfig) -> Result<Tensor> {
        Ok(t)
    }

    /// The one checkpoint tensor that several roles of the same [`Family::hf_tensor_name`]
    /// come from (Qwen3-Next's `in_proj_qkvz`, `in_proj_ba`), from each role's tensor as
    /// [`Family::gguf_to_hf`] made it, for the test writer. The default: none share a name.
    #[cfg(any(test, feature = "testing"))]
    fn hf_fused(&self, parts: &[(Weight, Tensor)], _config: &ModelConfig) -> Result<Tensor> {
        Err(crate::error::ModelError::WeightLayout(format!(
            "{:?} share a checkpoint tensor",
            parts.iter().map(|(w, _)| *w).collect::<Vec<_>>()
        )))
    }

    /// Layer `layer`'s plan. The default: the traits, the config's sliding window, experts and
    /// layers without RoPE.
    fn layer_plan(&self, config: &ModelConfig, layer: usize) -> LayerPlan {
        LayerPlan::from_traits(self.traits(), config, layer)
    }

    /// What a tiny test model of the family holds beyond the shared GGUF keys
    /// (`crate::testing::TinyModelSpec`). The default: nothing.
    #[cfg(any(test, feature = "testing"))]
    fn tiny_gguf_keys(&self) -> export::TinyKeys {
        Vec::new()
    }

    /// `config` as a Hugging Face checkpoint of the family, the inverse of
    /// [`Family::hf_params`] (`crate::testing::write_hf_from_gguf`); `None`: not written as one.
    #[cfg(any(test, feature = "testing"))]
    fn hf_checkpoint(&self, config: &ModelConfig) -> Option<export::HfCheckpoint>;
}

/// The experts a GGUF file of a family with `traits` holds, if it can hold any.
pub(crate) fn gguf_moe(
    traits: &Traits,
    keys: &GgufKeys<'_>,
    shared: &SharedParams,
) -> Result<Option<crate::config::MoeConfig>> {
    match &traits.experts {
        Some(rules) => experts::gguf_moe(keys, rules, shared),
        None => Ok(None),
    }
}

/// The experts a config.json of `architecture` describes, if the family can have any
/// (`required`: the config names a mixture, as Mixtral's does).
pub(crate) fn hf_moe(
    architecture: Architecture,
    keys: &HfKeys<'_>,
    shared: &SharedParams,
    required: bool,
) -> Result<Option<crate::config::MoeConfig>> {
    match &architecture.traits().experts {
        Some(rules) => experts::hf_moe(keys, architecture, rules, required, shared),
        None => Ok(None),
    }
}

/// The hyper-parameters every family shares, read before the family's own.
#[derive(Debug, Clone)]
pub(crate) struct SharedParams {
    pub hidden_size: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    pub num_layers: usize,
    pub intermediate_size: usize,
    pub rope_theta: f32,
}

/// What depends on the family in a config (config.rs holds the data, and nothing that asks a
/// family).
impl ModelConfig {
    /// What layer `layer` is, as the model's family plans it.
    pub fn layer_plan(&self, layer: usize) -> LayerPlan {
        self.architecture.family().layer_plan(self, layer)
    }

    /// Parameters of the transformer (embedding counted once when tied), for FLOP estimates;
    /// every expert of a mixture counted.
    pub fn num_parameters(&self) -> usize {
        self.parameters(false)
    }

    /// Parameters one token's forward multiplies by: a mixture's k chosen experts only (and
    /// its router and shared expert); [`Self::num_parameters`] for a dense model.
    pub fn active_parameters(&self) -> usize {
        self.parameters(true)
    }

    fn parameters(&self, active: bool) -> usize {
        let h = self.hidden_size;
        let gates = usize::from(self.architecture.traits().attention_output_gate);
        let attn = h * self.num_heads * self.head_dim * (2 + gates)
            + h * self.num_kv_heads * self.head_dim * 2;
        // A DeltaNet layer: its in-projections, conv taps, out-projection and small vectors.
        let recurrent = self.delta_net.as_ref().map_or(0, |d| {
            let sh = d.shape();
            h * sh.in_cols()
                + sh.conv_dim() * d.conv_kernel
                + sh.value_dim() * h
                + 2 * d.v_heads
                + d.head_dim
        });
        let mixers: usize = (0..self.num_layers)
            .map(|i| {
                if self.is_recurrent(i) {
                    recurrent
                } else {
                    attn
                }
            })
            .sum();
        let dense_mlp = 3 * h * self.intermediate_size;
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        let mlps: usize = (0..self.num_layers)
            .map(|i| match &self.moe {
                Some(moe) if moe.is_sparse(i) => {
                    let experts = if active {
                        moe.num_experts_used
                    } else {
                        moe.num_experts
                    };
                    let shared = moe
                        .shared_expert_intermediate_size
                        .map_or(0, |inter| 3 * h * inter + h);
                    experts * 3 * h * moe.expert_intermediate_size + moe.num_experts * h + shared
                }
                _ => dense_mlp,
            })
            .sum();
        let norms: usize = (0..self.num_layers)
            .map(|i| if self.layer_plan(i).post_norms { 4 } else { 2 } * h)
            .sum();
        mixers + norms + mlps + embed + head + h
    }
}

/// The backends a model can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
}

/// The vision projector (llama.cpp's `clip.projector_type`) whose images a text model of
/// `architecture` reads: its image tokens' attention and embedding rules are that family's
/// (Gemma 3's bidirectional image tokens, unscaled rows). `None`: it takes no images here.
pub fn vision_projector(architecture: Architecture) -> Option<&'static str> {
    match architecture {
        Architecture::Gemma3 => Some("gemma3"),
        _ => None,
    }
}

/// Whether `backend` runs every layer kind of `config`; `Err` names the first missing piece.
/// The CPU forward runs every kind; the CUDA forward runs full attention with the global
/// rotary, QKV biases, QK-norm and dense SwiGLU MLPs.
pub fn supports(config: &ModelConfig, backend: Backend) -> std::result::Result<(), String> {
    if backend == Backend::Cpu {
        return Ok(());
    }
    let traits = config.architecture.traits();
    let missing = (0..config.num_layers).find_map(|i| {
        let plan = config.layer_plan(i);
        if let MlpKind::Experts = plan.mlp {
            let moe = config
                .moe
                .as_ref()
                .expect("an experts layer has a MoeConfig");
            return Some(format!(
                "a grouped expert matmul (its mixture of {} experts, {} a token)",
                moe.num_experts, moe.num_experts_used
            ));
        }
        let gaps = [
            (plan.mixer == Mixer::GatedDeltaNet, "Gated DeltaNet layers"),
            (plan.output_gate, "gated attention outputs"),
            (plan.post_norms, "post-norms"),
            (
                plan.mlp != MlpKind::Dense(GatedActivation::Silu),
                "a GeGLU MLP",
            ),
            (
                matches!(plan.attention, AttentionKind::SlidingWindow(_)),
                "sliding-window attention",
            ),
            (plan.sinks, "attention sinks"),
            (plan.rotary != Rotary::Global, "layers without RoPE"),
        ];
        gaps.iter()
            .find(|(gap, _)| *gap)
            .map(|(_, what)| format!("{what} (layer {i})"))
    });
    let missing = missing.or_else(|| {
        [
            (traits.scales_embeddings, "scaled embeddings"),
            (
                config.query_scale() != 1.0 / (config.head_dim as f32).sqrt(),
                "attention scale but 1 / sqrt(head_dim)",
            ),
            (
                config.rotary_dims() != config.head_dim,
                "RoPE on part of each head",
            ),
        ]
        .iter()
        .find(|(gap, _)| *gap)
        .map(|(_, what)| what.to_string())
    });
    match missing {
        None => Ok(()),
        Some(what) => Err(format!(
            "{} on a GPU: it needs {what}, which sluice's CUDA forward does not have yet; serve \
             it with a build without the `cuda` feature, whose CPU forward runs it",
            config.architecture.name()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_registered_once_under_its_own_key() {
        for f in FAMILIES {
            assert_eq!(f.architecture().family().names(), f.names());
            for name in f.names() {
                assert_eq!(
                    Architecture::from_name(name),
                    Some(f.architecture()),
                    "{name}"
                );
            }
        }
        let names = Architecture::supported_names();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a name answered by two families");
        assert_eq!(Architecture::from_name("bert"), None);
    }

    pub(super) fn tiny(architecture: Architecture) -> ModelConfig {
        ModelConfig {
            architecture,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 4,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            vocab_size: 32,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            rope_scaling: None,
            max_position_embeddings: 64,
            tie_word_embeddings: true,
            pooling: None,
            moe: None,
            sliding_window: None,
            attention_scale: None,
            final_logit_softcap: None,
            layers_without_rope: Vec::new(),
            rotary_dim: None,
            delta_net: None,
        }
    }

    #[test]
    fn a_gpu_refuses_the_layer_kinds_its_forward_lacks_naming_them() {
        for arch in [
            Architecture::Llama,
            Architecture::Qwen2,
            Architecture::Qwen3,
        ] {
            assert_eq!(supports(&tiny(arch), Backend::Cuda), Ok(()));
        }
        let cases = [
            (
                ModelConfig {
                    moe: Some(crate::config::MoeConfig {
                        num_experts: 8,
                        num_experts_used: 2,
                        expert_intermediate_size: 32,
                        norm_topk_prob: true,
                        weights_scale: 1.0,
                        shared_expert_intermediate_size: None,
                        dense_layers: Vec::new(),
                    }),
                    ..tiny(Architecture::Qwen3Moe)
                },
                "grouped expert matmul (its mixture of 8 experts, 2 a token)",
            ),
            (tiny(Architecture::Gemma3), "post-norms (layer 0)"),
            (
                ModelConfig {
                    layers_without_rope: vec![3],
                    ..tiny(Architecture::SmolLm3)
                },
                "layers without RoPE (layer 3)",
            ),
            (
                ModelConfig {
                    attention_scale: Some(0.5),
                    ..tiny(Architecture::Llama)
                },
                "attention scale",
            ),
            (
                ModelConfig {
                    delta_net: Some(crate::config::DeltaNetConfig {
                        conv_kernel: 4,
                        head_dim: 16,
                        k_heads: 2,
                        v_heads: 4,
                        recurrent: vec![true, true, true, false],
                        tiled: true,
                    }),
                    ..tiny(Architecture::Qwen35)
                },
                "Gated DeltaNet layers (layer 0)",
            ),
            (
                ModelConfig {
                    rotary_dim: Some(8),
                    ..tiny(Architecture::Qwen3)
                },
                "RoPE on part of each head",
            ),
        ];
        for (config, missing) in cases {
            assert_eq!(supports(&config, Backend::Cpu), Ok(()));
            let err = supports(&config, Backend::Cuda).unwrap_err();
            assert!(err.contains(missing), "{err}");
            assert!(err.starts_with(config.architecture.name()), "{err}");
        }
    }

    #[test]
    fn the_plan_follows_the_family_and_the_config() {
        let plan = tiny(Architecture::Qwen2).layer_plan(0);
        assert!(plan.qkv_bias && !plan.qk_norm && !plan.sinks);
        assert_eq!(plan.mlp, MlpKind::Dense(GatedActivation::Silu));
        let gemma = ModelConfig {
            sliding_window: Some(crate::config::SlidingWindow {
                window: 8,
                local: vec![true, false, true, false],
                local_rope_theta: 10_000.0,
            }),
            ..tiny(Architecture::Gemma3)
        };
        let plans: Vec<LayerPlan> = (0..4).map(|i| gemma.layer_plan(i)).collect();
        assert_eq!(plans[0].attention, AttentionKind::SlidingWindow(8));
        assert_eq!(plans[0].rotary, Rotary::Local);
        assert_eq!(plans[1].attention, AttentionKind::Full);
        assert_eq!(plans[1].rotary, Rotary::Global);
        assert!(plans.iter().all(|p| p.post_norms && p.qk_norm));
        assert_eq!(plans[1].mlp, MlpKind::Dense(GatedActivation::GeluTanh));
    }
}
