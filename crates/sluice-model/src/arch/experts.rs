//! A mixture of experts as a layer kind the families share: how GGUF keys and config.json
//! fields describe one, read by each family's [`super::ExpertTraits`].

use candle_core::quantized::gguf_file::Value;
use serde::Deserialize;

use super::{ExpertTraits, SharedParams};
use crate::config::{Architecture, ExpertGating, MoeConfig, MoeConfigError};
use crate::error::Result;
use crate::gguf_keys::{int_value, GgufKeys};
use crate::hf_keys::HfKeys;

/// The mixture of experts `{arch}.expert_*` describes, as llama.cpp reads it by `rules`: `None`
/// for a file without experts (`expert_count` absent or 0) where they are optional (Mixtral is
/// llama with experts). Each expert's size is `expert_feed_forward_length`, else the dense
/// `feed_forward_length` (divided by k where the family says so).
pub(crate) fn gguf_moe(
    keys: &GgufKeys<'_>,
    rules: &ExpertTraits,
    shared: &SharedParams,
) -> Result<Option<MoeConfig>> {
    let key = |k: &str| keys.key(k);
    let dense_ff = shared.intermediate_size;
    let num_experts = match keys.opt(&key("expert_count"), GgufKeys::get_usize)? {
        Some(n) if n > 0 || rules.required => n,
        None if rules.required => {
            return Err(keys.err(
                &key("expert_count"),
                format!(
                    "not present: a {} model is a mixture of experts",
                    keys.arch()
                ),
            ))
        }
        _ => return Ok(None),
    };
    let num_experts_used = keys.get_usize(&key("expert_used_count"))?;
    let expert_ff = match keys.metadata().get(&key("expert_feed_forward_length")) {
        None => None,
        // llama.cpp allows one size a layer; sluice runs one size for every layer.
        Some(Value::Array(sizes)) => {
            let sizes: Vec<i64> = sizes.iter().filter_map(int_value).collect();
            match sizes.first() {
                Some(&first) if sizes.iter().all(|&s| s == first) && first > 0 => {
                    Some(first as usize)
                }
                _ => {
                    return Err(keys.unsupported(format!(
                        "`{}`: experts of different sizes in different layers ({sizes:?})",
                        key("expert_feed_forward_length")
                    )))
                }
            }
        }
        Some(_) => Some(keys.get_usize(&key("expert_feed_forward_length"))?),
    };
    let expert_intermediate_size = match expert_ff {
        Some(n) => n,
        None if rules.gguf_ff_divided_by_k => dense_ff / num_experts_used.max(1),
        None => dense_ff,
    };
    let norm_key = key("expert_weights_norm");
    let norm_topk_prob = match (rules.default_norm_topk, keys.metadata().get(&norm_key)) {
        // Never renormalised, whatever the key says (gpt-oss: llama.cpp's rule).
        (None, _) => false,
        (Some(_), Some(Value::Bool(b))) => *b,
        (Some(_), Some(other)) => {
            return Err(keys.err(&norm_key, format!("expected a bool, found {other:?}")))
        }
        (Some(default), None) => default,
    };
    // llama.cpp reads 0 (its default) as no scale.
    let weights_scale = match keys.opt(&key("expert_weights_scale"), GgufKeys::get_f32)? {
        None | Some(0.0) => 1.0,
        Some(x) => x,
    };
    // 1 is a softmax over the experts' logits, the only gating these families use where the
    // key counts (a softmax over the top k is gpt-oss's own, whatever the key says: llama.cpp's
    // rule).
    if let Some(gating) = keys
        .opt(&key("expert_gating_func"), GgufKeys::get_usize)?
        .filter(|_| rules.gating == ExpertGating::SoftmaxTopK)
    {
        if gating != 1 {
            return Err(keys.unsupported(format!(
                "`{}` = {gating} (supported: 1, a softmax over the experts)",
                key("expert_gating_func")
            )));
        }
    }
    let shared_expert_intermediate_size = if rules.shared_expert {
        Some(
            keys.opt(
                &key("expert_shared_feed_forward_length"),
                GgufKeys::get_usize,
            )?
            .filter(|&n| n > 0)
            .unwrap_or(dense_ff),
        )
    } else {
        None
    };
    let moe = MoeConfig {
        num_experts,
        num_experts_used,
        expert_intermediate_size,
        norm_topk_prob,
        weights_scale,
        shared_expert_intermediate_size,
        dense_layers: Vec::new(),
    };
    moe.check().map_err(|e| {
        let k = match e {
            MoeConfigError::NoExperts => "expert_count",
            MoeConfigError::ExpertsUsed { .. } => "expert_used_count",
            MoeConfigError::IntermediateSize => "expert_feed_forward_length",
            MoeConfigError::Scale(_) => "expert_weights_scale",
        };
        keys.err(&key(k), e.to_string())
    })?;
    Ok(Some(moe))
}

/// The mixture-of-experts fields of config.json (Mixtral, the qwen MoEs, gpt-oss).
#[derive(Debug, Deserialize)]
struct MoeJson {
    /// Mixtral's and gpt-oss's expert count.
    num_local_experts: Option<usize>,
    /// qwen2_moe's and qwen3_moe's expert count.
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
}

/// The mixture of experts a config.json describes, as transformers builds it for
/// `architecture` by `rules`: Mixtral (`num_local_experts`, experts of `intermediate_size`, the
/// chosen weights always divided by their sum; `required` when the config names Mixtral),
/// qwen2_moe and qwen3_moe (`num_experts`, `moe_intermediate_size`, `norm_topk_prob` (default
/// false), dense layers by `mlp_only_layers` and `decoder_sparse_step`; qwen2_moe's shared
/// expert of `shared_expert_intermediate_size`), gpt-oss.
pub(crate) fn hf_moe(
    keys: &HfKeys<'_>,
    architecture: Architecture,
    rules: &ExpertTraits,
    required: bool,
    shared: &SharedParams,
) -> Result<Option<MoeConfig>> {
    let c: MoeJson = keys.family_fields()?;
    let required = required || rules.required;
    let (count_key, count) = match (c.num_local_experts, c.num_experts) {
        (Some(n), _) => ("num_local_experts", n),
        (None, Some(n)) => ("num_experts", n),
        (None, None) if required => {
            let k = if rules.hf_experts_of_intermediate_size {
                "num_local_experts"
            } else {
                "num_experts"
            };
            return Err(keys.err(
                k,
                format!(
                    "not present: a {} model is a mixture of experts",
                    architecture.name()
                ),
            ));
        }
        (None, None) => return Ok(None),
    };
    if count == 0 && !required {
        return Ok(None);
    }
    // Mixtral's are always renormalised; gpt-oss's never (its softmax is over the chosen k
    // already); the qwen MoEs' as `norm_topk_prob` says.
    let norm_topk_prob = match (rules.default_norm_topk, rules.hf_norm_topk_from_config) {
        (None, _) => false,
        (Some(_), Some(absent)) => c.norm_topk_prob.unwrap_or(absent),
        (Some(default), None) => default,
    };
    let step = c.decoder_sparse_step.unwrap_or(1);
    if step == 0 {
        return Err(keys.err("decoder_sparse_step", "must be at least 1"));
    }
    let only_dense = c.mlp_only_layers.clone().unwrap_or_default();
    let dense_layers = (0..shared.num_layers)
        .filter(|&i| only_dense.contains(&i) || !(i + 1).is_multiple_of(step))
        .collect();
    let shared_expert_intermediate_size = if rules.shared_expert {
        Some(keys.required(
            "shared_expert_intermediate_size",
            c.shared_expert_intermediate_size,
        )?)
    } else {
        None
    };
    let of_intermediate = rules.hf_experts_of_intermediate_size;
    let moe = MoeConfig {
        num_experts: count,
        num_experts_used: keys.required("num_experts_per_tok", c.num_experts_per_tok)?,
        expert_intermediate_size: if of_intermediate {
            shared.intermediate_size
        } else {
            keys.required("moe_intermediate_size", c.moe_intermediate_size)?
        },
        norm_topk_prob,
        weights_scale: 1.0,
        shared_expert_intermediate_size,
        dense_layers,
    };
    moe.check().map_err(|e| {
        let key = match e {
            MoeConfigError::NoExperts => count_key,
            MoeConfigError::ExpertsUsed { .. } => "num_experts_per_tok",
            MoeConfigError::IntermediateSize if of_intermediate => "intermediate_size",
            MoeConfigError::IntermediateSize | MoeConfigError::Scale(_) => "moe_intermediate_size",
        };
        keys.err(key, e.to_string())
    })?;
    Ok(Some(moe))
}
