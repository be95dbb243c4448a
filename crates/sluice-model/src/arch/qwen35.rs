//! The Qwen3.5/3.6 hybrids (GGUF `qwen35`, `qwen35moe`; HF `Qwen3_5ForCausalLM`,
//! `Qwen3_5MoeForCausalLM`, the text parts of their `...ForConditionalGeneration`) and
//! Qwen3-Next (GGUF `qwen3next`, the same layers in another layout: [`QWEN3NEXT`]): Gated
//! DeltaNet layers, three for each full-attention layer by default, whose memory of a
//! sequence is a fixed-size state (`crate::config::DeltaNetConfig`); full-attention layers with
//! QK-norm, an output gate per query head and RoPE on the first quarter of each head; the
//! MLP's norm is the file's `post_attention_norm`. qwen35moe's MLP is qwen3moe's experts beside
//! qwen2moe's sigmoid-gated shared expert.
//!
//! As llama.cpp defines them (`src/models/qwen35.cpp`, `qwen35moe.cpp`, `delta-net-base.cpp`):
//! its converter stores `-exp(A_log)` as `ssm_a`, the norms (but the DeltaNet's own) plus one,
//! and the value heads in tiled order (value head `h` reads key head `h % k_heads`). The
//! interleaved multi-section RoPE (`rope.dimension_sections`) gives every section a text
//! token's one position, which makes it NEOX RoPE on `rope.dimension_count` dimensions: that is
//! what a text model runs (the sections are read and checked). Files with multi-token
//! prediction layers (`nextn_predict_layers`) load their main layers; the last blocks stay in
//! the file, unused.

use candle_core::quantized::gguf_file::Value;

use super::qwen_moe::QWEN_EXPERTS;
use super::{Architecture, ExpertTraits, Family, FamilyParams, SharedParams, Traits};
use candle_core::Tensor;

use super::qwen35_hf;
use crate::config::{DeltaNetConfig, ModelConfig};
use crate::error::Result;
use crate::gguf_keys::{int_value, GgufKeys};
use crate::hf_keys::HfKeys;
use crate::load::Weight;
use crate::weights::RowOrder;

/// A Qwen3.5/3.6 hybrid family: its key, names and traits.
pub(crate) struct Hybrid {
    architecture: Architecture,
    names: &'static [&'static str],
    traits: &'static Traits,
}

pub(crate) static QWEN35: Hybrid = Hybrid {
    architecture: Architecture::Qwen35,
    names: &["qwen35", "qwen3_5", "qwen3_5_text"],
    traits: &QWEN35_TRAITS,
};

pub(crate) static QWEN35MOE: Hybrid = Hybrid {
    architecture: Architecture::Qwen35Moe,
    names: &["qwen35moe", "qwen3_5_moe", "qwen3_5_moe_text"],
    traits: &QWEN35MOE_TRAITS,
};

/// Qwen3-Next: qwen35moe's layers, its GGUF files laid out as llama.cpp's converter writes
/// them for this family (`src/models/qwen3next.cpp`): the value heads in the checkpoint's
/// grouped order (value head `h` reads key head `h / (v_heads / k_heads)`: the converter does
/// not re-tile them), beta and alpha in one `ssm_ba` (each key head's beta rows, then its
/// alpha rows), and RoPE without sections.
pub(crate) static QWEN3NEXT: Hybrid = Hybrid {
    architecture: Architecture::Qwen3Next,
    names: &["qwen3next", "qwen3_next"],
    traits: &QWEN35MOE_TRAITS,
};

const QWEN35_TRAITS: Traits = Traits {
    attention_output_gate: true,
    // Qwen3.5's RMSNorms multiply by `1 + w` (`arch::qwen35_hf`).
    hf_norms_minus_one: true,
    ..super::qwen3::QWEN3_TRAITS
};

const QWEN35MOE_TRAITS: Traits = Traits {
    experts: Some(ExpertTraits {
        shared_expert: true,
        // Renormalised where config.json does not say (vLLM's reading; llama.cpp always).
        hf_norm_topk_from_config: Some(true),
        ..QWEN_EXPERTS
    }),
    ..QWEN35_TRAITS
};

/// llama.cpp's default when a file has neither `attention.recurrent_layers` nor
/// `full_attention_interval`: every fourth layer attends.
const FULL_ATTENTION_INTERVAL: usize = 4;

/// What the hybrids' GGUF files say beyond the shared keys: the DeltaNet layers, the rotary's
/// share of a head, the main layers, and (qwen35moe) the experts.
fn gguf_params(
    keys: &GgufKeys<'_>,
    shared: &SharedParams,
    traits: &Traits,
    tiled: bool,
) -> Result<FamilyParams> {
    let key = |k: &str| keys.key(k);
    let block_count = shared.num_layers;
    let nextn = keys
        .opt(&key("nextn_predict_layers"), GgufKeys::get_usize)?
        .unwrap_or(0);
    if nextn >= block_count {
        return Err(keys.err(
            &key("nextn_predict_layers"),
            format!("{nextn} prediction layers leave none of the {block_count} blocks"),
        ));
    }
    let layers = block_count - nextn;
    let positive = |k: &str| -> Result<usize> {
        match keys.get_usize(&key(k))? {
            0 => Err(keys.err(&key(k), "must be at least 1")),
            n => Ok(n),
        }
    };
    let conv_kernel = positive("ssm.conv_kernel")?;
    let head_dim = positive("ssm.state_size")?;
    let k_heads = positive("ssm.group_count")?;
    let v_heads = positive("ssm.time_step_rank")?;
    if !v_heads.is_multiple_of(k_heads) {
        return Err(keys.err(
            &key("ssm.time_step_rank"),
            format!("{v_heads} value heads cannot be grouped over {k_heads} key heads (ssm.group_count)"),
        ));
    }
    let inner = keys.get_usize(&key("ssm.inner_size"))?;
    if inner != v_heads * head_dim {
        return Err(keys.err(
            &key("ssm.inner_size"),
            format!(
                "{inner} is not {v_heads} value heads (ssm.time_step_rank) of {head_dim} (ssm.state_size)"
            ),
        ));
    }
    let recurrent = recurrent_layers(keys, block_count, layers)?;
    let rotary_dim = match keys.opt(&key("rope.dimension_count"), GgufKeys::get_usize)? {
        Some(d) if d == 0 || d % 2 != 0 || d > shared.head_dim => {
            return Err(keys.err(
                &key("rope.dimension_count"),
                format!(
                    "{d} must be even and at most the head size {}",
                    shared.head_dim
                ),
            ))
        }
        Some(d) if d < shared.head_dim => Some(d),
        _ => None,
    };
    check_sections(keys, rotary_dim.unwrap_or(shared.head_dim))?;
    Ok(FamilyParams {
        moe: super::gguf_moe(traits, keys, shared)?,
        rotary_dim,
        delta_net: Some(DeltaNetConfig {
            conv_kernel,
            head_dim,
            k_heads,
            v_heads,
            recurrent,
            tiled,
        }),
        trunk_layers: (layers != block_count).then_some(layers),
        ..FamilyParams::default()
    })
}

/// Which of the main `layers` are DeltaNet layers: `attention.recurrent_layers` (one flag a
/// block), else every layer but each `full_attention_interval`-th.
fn recurrent_layers(keys: &GgufKeys<'_>, block_count: usize, layers: usize) -> Result<Vec<bool>> {
    let list_key = keys.key("attention.recurrent_layers");
    let recurrent = match keys.metadata().get(&list_key) {
        Some(Value::Array(flags)) => {
            if flags.len() != block_count {
                return Err(keys.err(
                    &list_key,
                    format!(
                        "{} flags for {block_count} blocks (block_count)",
                        flags.len()
                    ),
                ));
            }
            flags
                .iter()
                .map(|f| match f {
                    Value::Bool(b) => Ok(*b),
                    other => match int_value(other) {
                        Some(0) => Ok(false),
                        Some(1) => Ok(true),
                        _ => {
                            Err(keys.err(&list_key, format!("expected booleans, found {other:?}")))
                        }
                    },
                })
                .collect::<Result<Vec<bool>>>()?
        }
        Some(other) => {
            return Err(keys.err(&list_key, format!("expected an array, found {other:?}")))
        }
        None => {
            let interval_key = keys.key("full_attention_interval");
            let interval = keys
                .opt(&interval_key, GgufKeys::get_usize)?
                .unwrap_or(FULL_ATTENTION_INTERVAL);
            if interval == 0 {
                return Err(keys.err(&interval_key, "must be at least 1"));
            }
            (0..block_count)
                .map(|i| !(i + 1).is_multiple_of(interval))
                .collect()
        }
    };
    // The prediction layers after the main ones attend; the main model needs an attention
    // layer for its KV cache to mean anything, and a recurrent one to be a hybrid.
    let recurrent: Vec<bool> = recurrent[..layers].to_vec();
    if recurrent.iter().all(|&r| r) {
        return Err(keys.err(&list_key, "no layer attends: every layer is recurrent"));
    }
    Ok(recurrent)
}

/// `rope.dimension_sections`, where the file has it: four counts of rotated pairs whose sum
/// is at most half the rotated dimensions.
fn check_sections(keys: &GgufKeys<'_>, rotary_dim: usize) -> Result<()> {
    let k = keys.key("rope.dimension_sections");
    let Some(value) = keys.metadata().get(&k) else {
        return Ok(());
    };
    let Value::Array(items) = value else {
        return Err(keys.err(&k, format!("expected an array, found {value:?}")));
    };
    let counts: Option<Vec<i64>> = items.iter().map(int_value).collect();
    match counts {
        Some(c)
            if c.iter().all(|&n| n >= 0) && c.iter().sum::<i64>() as usize * 2 <= rotary_dim =>
        {
            Ok(())
        }
        _ => Err(keys.err(
            &k,
            format!(
                "{items:?}: counts of rotated pairs summing to at most {}",
                rotary_dim / 2
            ),
        )),
    }
}

/// Both families' tensor names: llama's, but the MLP's norm (`post_attention_norm`).
fn gguf_name(w: Weight) -> String {
    match w {
        Weight::FfnNorm(i) => format!("blk.{i}.post_attention_norm.weight"),
        other => other.gguf_name(),
    }
}

/// Both families: the same layers and keys; one has experts.
impl Family for Hybrid {
    fn architecture(&self) -> Architecture {
        self.architecture
    }

    fn names(&self) -> &'static [&'static str] {
        self.names
    }

    fn traits(&self) -> &'static Traits {
        self.traits
    }

    fn gguf_params(&self, keys: &GgufKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        let tiled = self.architecture != Architecture::Qwen3Next;
        gguf_params(keys, shared, self.traits(), tiled)
    }

    fn hf_params(&self, keys: &HfKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        qwen35_hf::hf_params(keys, shared, self.architecture)
    }

    fn hf_tensor_name(&self, w: Weight) -> String {
        qwen35_hf::tensor_name(w, self.architecture == Architecture::Qwen3Next)
    }

    fn hf_stored_shape(&self, w: Weight, shape: &[usize], config: &ModelConfig) -> Vec<usize> {
        qwen35_hf::stored_shape(w, shape, config)
    }

    fn hf_to_gguf(&self, w: Weight, t: Tensor, config: &ModelConfig) -> Result<Tensor> {
        qwen35_hf::to_gguf(w, t, config)
    }

    #[cfg(any(test, feature = "testing"))]
    fn gguf_to_hf(&self, w: Weight, t: Tensor, config: &ModelConfig) -> Result<Tensor> {
        qwen35_hf::to_hf(w, t, config)
    }

    #[cfg(any(test, feature = "testing"))]
    fn hf_fused(&self, parts: &[(Weight, Tensor)], config: &ModelConfig) -> Result<Tensor> {
        qwen35_hf::fused(parts, config)
    }

    fn gguf_tensor_name(&self, w: Weight) -> String {
        match w {
            Weight::SsmBeta(i) | Weight::SsmAlpha(i)
                if self.architecture == Architecture::Qwen3Next =>
            {
                format!("blk.{i}.ssm_ba.weight")
            }
            _ => gguf_name(w),
        }
    }

    /// Qwen3-Next's beta and alpha rows out of its `ssm_ba`: a key head's `v_heads / k_heads`
    /// beta rows, then as many alpha rows.
    fn gguf_row_order(&self, w: Weight, config: &ModelConfig) -> RowOrder {
        let per_key = config
            .delta_net
            .as_ref()
            .map_or(1, |dn| dn.v_heads / dn.k_heads);
        match w {
            Weight::SsmBeta(_) | Weight::SsmAlpha(_)
                if self.architecture == Architecture::Qwen3Next =>
            {
                RowOrder::Strided {
                    len: per_key,
                    stride: 2 * per_key,
                    offset: if matches!(w, Weight::SsmAlpha(_)) {
                        per_key
                    } else {
                        0
                    },
                }
            }
            _ => RowOrder::Stored,
        }
    }

    /// qwen35 as `Qwen3_5ForCausalLM`'s flat config; qwen35moe as the text part of
    /// `Qwen3_5MoeForConditionalGeneration` (the released checkpoints' layout), so the tests
    /// read both.
    #[cfg(any(test, feature = "testing"))]
    fn hf_checkpoint(&self, config: &ModelConfig) -> Option<super::export::HfCheckpoint> {
        use super::export::HfCheckpoint;
        let fields = qwen35_hf::checkpoint_fields(config)?;
        Some(match self.architecture {
            Architecture::Qwen3Next => HfCheckpoint {
                fields,
                ..HfCheckpoint::plain("Qwen3NextForCausalLM", "qwen3_next")
            },
            Architecture::Qwen35Moe => HfCheckpoint {
                text_model_type: Some("qwen3_5_moe_text"),
                fields,
                ..HfCheckpoint::plain("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe")
            },
            _ => HfCheckpoint {
                fields,
                ..HfCheckpoint::plain("Qwen3_5ForCausalLM", "qwen3_5_text")
            },
        })
    }
}
