//! Hugging Face checkpoints of the Qwen3.5/3.6 hybrids (`Qwen3_5ForCausalLM`,
//! `Qwen3_5MoeForCausalLM`, and the text part of their `...ForConditionalGeneration`s, which
//! `hf_config` and `hf.rs` unwrap): config.json's DeltaNet fields, and the DeltaNet tensors made
//! what llama.cpp's converter (`convert_hf_to_gguf.py`'s Qwen3.5 classes) writes into a GGUF
//! file, so that a directory and the GGUF file converted from it load to the same weights:
//!
//! - the value heads from the checkpoint's grouped order (value head `h` reads key head
//!   `h / (v_heads / k_heads)`) to the tiled one (`h % k_heads`) in every tensor indexed by
//!   value head: the V rows of `in_proj_qkv` and of the conv, `in_proj_z`, `in_proj_b`,
//!   `in_proj_a`, `dt_bias`, `A_log`, and the columns of `out_proj`. Re-tiling at load (rather
//!   than running the kernel in grouped order) keeps `out_proj`'s sums in the GGUF file's
//!   order, so both give the same bits;
//! - `A_log` to `-exp(A_log)`, computed in f64 and rounded once ([`a_from_a_log`]), so the
//!   result is the correctly rounded one on every platform;
//! - the conv's `[channels, 1, taps]` squeezed to `[channels, taps]`;
//! - every RMSNorm but the DeltaNet's own stored minus one (`Traits::hf_norms_minus_one`).
//!
//! The full-attention layers' `q_proj` (each head's query beside its gate) is stored as GGUF
//! files hold it. Multi-token prediction weights (`mtp.*`) are not read.

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use super::{Architecture, FamilyParams, SharedParams};
use crate::config::{DeltaNetConfig, ModelConfig};
use crate::error::Result;
use crate::hf_keys::HfKeys;
use crate::load::Weight;

/// transformers' default when a config has no `layer_types`: every fourth layer attends.
const FULL_ATTENTION_INTERVAL: usize = 4;
/// transformers' and llama.cpp's default share of a head that RoPE rotates.
const PARTIAL_ROTARY_FACTOR: f64 = 0.25;

/// config.json's fields of a hybrid beyond the shared ones.
#[derive(Debug, Deserialize)]
struct HybridJson {
    linear_conv_kernel_dim: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    /// One `linear_attention` or `full_attention` a layer.
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    /// Qwen3-Next's place for it; Qwen3.5's is `rope_parameters` (transformers 5) or
    /// `rope_scaling`.
    partial_rotary_factor: Option<f64>,
    rope_parameters: Option<RopeJson>,
    rope_scaling: Option<RopeJson>,
    attn_output_gate: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct RopeJson {
    partial_rotary_factor: Option<f64>,
    /// Rotated pairs a section of the multi-section RoPE (three or four counts); a text token
    /// gives every section its one position, so only their sum is checked.
    mrope_section: Option<Vec<i64>>,
}

/// What a hybrid's config.json says beyond the shared fields.
pub(super) fn hf_params(
    keys: &HfKeys<'_>,
    shared: &SharedParams,
    architecture: Architecture,
) -> Result<FamilyParams> {
    let c: HybridJson = keys.family_fields()?;
    let positive = |key: &str, value: Option<usize>| -> Result<usize> {
        match keys.required(key, value)? {
            0 => Err(keys.err(key, "must be at least 1")),
            n => Ok(n),
        }
    };
    let conv_kernel = positive("linear_conv_kernel_dim", c.linear_conv_kernel_dim)?;
    let head_dim = positive("linear_key_head_dim", c.linear_key_head_dim)?;
    let value_dim = positive("linear_value_head_dim", c.linear_value_head_dim)?;
    if value_dim != head_dim {
        return Err(keys.unsupported(format!(
            "linear_value_head_dim {value_dim} unlike linear_key_head_dim {head_dim} (the \
             DeltaNet layers take one head size, as llama.cpp's `ssm.state_size`)"
        )));
    }
    let k_heads = positive("linear_num_key_heads", c.linear_num_key_heads)?;
    let v_heads = positive("linear_num_value_heads", c.linear_num_value_heads)?;
    if !v_heads.is_multiple_of(k_heads) {
        return Err(keys.err(
            "linear_num_value_heads",
            format!("{v_heads} value heads cannot be grouped over {k_heads} key heads (linear_num_key_heads)"),
        ));
    }
    let layers = shared.num_layers;
    let recurrent: Vec<bool> = match &c.layer_types {
        Some(types) => {
            if types.len() != layers {
                return Err(keys.err(
                    "layer_types",
                    format!(
                        "{} types for {layers} layers (num_hidden_layers)",
                        types.len()
                    ),
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "linear_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(keys.err(
                        "layer_types",
                        format!("`{other}` (expected linear_attention or full_attention)"),
                    )),
                })
                .collect::<Result<_>>()?
        }
        None => {
            let interval = c.full_attention_interval.unwrap_or(FULL_ATTENTION_INTERVAL);
            if interval == 0 {
                return Err(keys.err("full_attention_interval", "must be at least 1"));
            }
            (0..layers)
                .map(|i| !(i + 1).is_multiple_of(interval))
                .collect()
        }
    };
    if recurrent.iter().all(|&r| r) {
        return Err(keys.err("layer_types", "no layer attends: every layer is recurrent"));
    }
    if c.attn_output_gate == Some(false) {
        return Err(keys.unsupported(
            "attn_output_gate false (Qwen3.5's full-attention layers gate their output)".into(),
        ));
    }
    let rope = c.rope_parameters.as_ref().or(c.rope_scaling.as_ref());
    let factor = c
        .partial_rotary_factor
        .or(rope.and_then(|r| r.partial_rotary_factor))
        .unwrap_or(PARTIAL_ROTARY_FACTOR);
    let rotary = (shared.head_dim as f64 * factor).round();
    if !(rotary >= 2.0 && rotary <= shared.head_dim as f64 && (rotary as usize).is_multiple_of(2)) {
        return Err(keys.err(
            "partial_rotary_factor",
            format!(
                "{factor} of the head size {} is not an even count of dimensions",
                shared.head_dim
            ),
        ));
    }
    let rotary = rotary as usize;
    if let Some(sections) = rope.and_then(|r| r.mrope_section.as_ref()) {
        if sections.iter().any(|&n| n < 0) || sections.iter().sum::<i64>() as usize * 2 > rotary {
            return Err(keys.err(
                "rope_parameters.mrope_section",
                format!(
                    "{sections:?}: counts of rotated pairs summing to at most {}",
                    rotary / 2
                ),
            ));
        }
    }
    Ok(FamilyParams {
        moe: super::hf_moe(architecture, keys, shared, false)?,
        rotary_dim: (rotary < shared.head_dim).then_some(rotary),
        delta_net: Some(DeltaNetConfig {
            conv_kernel,
            head_dim,
            k_heads,
            v_heads,
            recurrent,
            // Qwen3-Next's GGUF files keep the checkpoint's grouped order; so does its load.
            tiled: architecture != Architecture::Qwen3Next,
        }),
        ..FamilyParams::default()
    })
}

/// `-exp(A_log)` as llama.cpp's converter stores it (`ssm_a`), rounded once from f64.
pub fn a_from_a_log(a_log: f32) -> f32 {
    -((a_log as f64).exp() as f32)
}

/// The tensor's name: transformers' Qwen3.5 names, or Qwen3-Next's fused in-projections
/// (`next`): `in_proj_qkvz` (q, k, v and z, a key head's rows together) and `in_proj_ba`.
pub(super) fn tensor_name(w: Weight, next: bool) -> String {
    match w {
        Weight::SsmQkv(i) | Weight::SsmGate(i) if next => {
            format!("model.layers.{i}.linear_attn.in_proj_qkvz.weight")
        }
        Weight::SsmBeta(i) | Weight::SsmAlpha(i) if next => {
            format!("model.layers.{i}.linear_attn.in_proj_ba.weight")
        }
        _ => w.hf_name(),
    }
}

/// Qwen3-Next's fused tensor holding `w`: the rows of all its parts.
fn fused_rows(w: Weight, dn: &DeltaNetConfig) -> Option<usize> {
    let value = dn.v_heads * dn.head_dim;
    match w {
        Weight::SsmQkv(_) | Weight::SsmGate(_) => Some(2 * dn.k_heads * dn.head_dim + 2 * value),
        Weight::SsmBeta(_) | Weight::SsmAlpha(_) => Some(2 * dn.v_heads),
        _ => None,
    }
}

/// As the checkpoint stores `w`: the conv's taps `[channels, 1, taps]`; Qwen3-Next's fused
/// in-projections whole.
pub(super) fn stored_shape(w: Weight, shape: &[usize], config: &ModelConfig) -> Vec<usize> {
    let fused = delta_net(config)
        .filter(|_| config.architecture == Architecture::Qwen3Next)
        .and_then(|dn| fused_rows(w, dn));
    match (w, shape, fused) {
        (Weight::SsmConv(_), &[channels, taps], _) => vec![channels, 1, taps],
        (_, &[_, hidden], Some(rows)) => vec![rows, hidden],
        _ => shape.to_vec(),
    }
}

/// Row `s` of Qwen3-Next's fused tensor is row `index[s]` of its parts stacked in the kernel's
/// order (q, k, v, z; or beta, alpha): the checkpoint keeps each key head's rows together
/// (its `head_dim` q rows, `head_dim` k rows, then its value heads' v rows and z rows; its
/// value heads' beta rows, then their alpha rows).
fn fused_order(w: Weight, dn: &DeltaNetConfig) -> Vec<u32> {
    let (hd, k, per_key) = (dn.head_dim, dn.k_heads, dn.v_heads / dn.k_heads);
    // Each key head's span: (rows in the fused group, where the stacked part starts, its
    // rows a key head).
    let spans: Vec<(usize, usize)> = match w {
        Weight::SsmQkv(_) | Weight::SsmGate(_) => {
            let (key, value) = (k * hd, dn.v_heads * hd);
            vec![
                (0, hd),
                (key, hd),
                (2 * key, per_key * hd),
                (2 * key + value, per_key * hd),
            ]
        }
        _ => vec![(0, per_key), (dn.v_heads, per_key)],
    };
    let mut index = Vec::new();
    for kh in 0..k {
        for &(start, len) in &spans {
            let first = start + kh * len;
            index.extend((first..first + len).map(|r| r as u32));
        }
    }
    index
}

/// Where role `w`'s rows lie among its fused group's stacked parts: from, rows.
fn fused_part(w: Weight, dn: &DeltaNetConfig) -> (usize, usize) {
    let conv = 2 * dn.k_heads * dn.head_dim + dn.v_heads * dn.head_dim;
    match w {
        Weight::SsmQkv(_) => (0, conv),
        Weight::SsmGate(_) => (conv, dn.v_heads * dn.head_dim),
        Weight::SsmBeta(_) => (0, dn.v_heads),
        _ => (dn.v_heads, dn.v_heads),
    }
}

/// `w`'s rows out of Qwen3-Next's fused tensor `t`.
fn unfused(t: Tensor, w: Weight, dn: &DeltaNetConfig) -> Result<Tensor> {
    let order = fused_order(w, dn);
    let mut stored_of = vec![0u32; order.len()];
    for (s, &m) in order.iter().enumerate() {
        stored_of[m as usize] = s as u32;
    }
    let (from, rows) = fused_part(w, dn);
    let index = Tensor::from_vec(stored_of[from..from + rows].to_vec(), rows, t.device())?;
    Ok(t.index_select(&index, 0)?.contiguous()?)
}

/// Qwen3-Next's fused tensor from its roles' (`parts`, in any order), for the test writer.
#[cfg(any(test, feature = "testing"))]
pub(super) fn fused(parts: &[(Weight, Tensor)], config: &ModelConfig) -> Result<Tensor> {
    let dn = delta_net(config).expect("a hybrid's config");
    let mut sorted: Vec<&(Weight, Tensor)> = parts.iter().collect();
    sorted.sort_by_key(|(w, _)| fused_part(*w, dn).0);
    let stacked = Tensor::cat(&sorted.iter().map(|(_, t)| t).collect::<Vec<_>>(), 0)?;
    let order = fused_order(sorted[0].0, dn);
    let n = order.len();
    let index = Tensor::from_vec(order, n, stacked.device())?;
    Ok(stacked.index_select(&index, 0)?.contiguous()?)
}

/// Where a tensor's value heads lie: along `dim`, after `offset` rows of other things (q and k
/// in the projection and the conv), `rows` a value head.
struct ValueHeads {
    dim: usize,
    offset: usize,
    rows: usize,
}

fn value_heads(w: Weight, dn: &DeltaNetConfig) -> Option<ValueHeads> {
    let key_rows = 2 * dn.k_heads * dn.head_dim;
    let (dim, offset, rows) = match w {
        Weight::SsmQkv(_) | Weight::SsmConv(_) => (0, key_rows, dn.head_dim),
        Weight::SsmGate(_) => (0, 0, dn.head_dim),
        Weight::SsmBeta(_) | Weight::SsmAlpha(_) | Weight::SsmDtBias(_) | Weight::SsmA(_) => {
            (0, 0, 1)
        }
        Weight::SsmOut(_) => (1, 0, dn.head_dim),
        _ => return None,
    };
    Some(ValueHeads { dim, offset, rows })
}

/// Entry `i` of the tiled order is entry `index[i]` of the grouped one (`to_tiled`), or the
/// other way round, over `at`'s span of a tensor of `len` entries along its dimension.
fn head_order(dn: &DeltaNetConfig, at: &ValueHeads, len: usize, to_tiled: bool) -> Vec<u32> {
    let (k, v) = (dn.k_heads, dn.v_heads);
    let per_key = v / k;
    let mut index: Vec<u32> = (0..at.offset as u32).collect();
    for head in 0..v {
        // Tiled head `j * k + kh` is grouped head `kh * per_key + j`.
        let source = if to_tiled {
            let (j, kh) = (head / k, head % k);
            kh * per_key + j
        } else {
            let (kh, j) = (head / per_key, head % per_key);
            j * k + kh
        };
        let start = at.offset + source * at.rows;
        index.extend((start..start + at.rows).map(|r| r as u32));
    }
    debug_assert_eq!(index.len(), len);
    index
}

/// `t`'s value heads reordered (`to_tiled`: grouped to tiled, else back).
fn reorder(t: Tensor, w: Weight, dn: &DeltaNetConfig, to_tiled: bool) -> Result<Tensor> {
    let Some(at) = value_heads(w, dn) else {
        return Ok(t);
    };
    if dn.k_heads == dn.v_heads {
        return Ok(t);
    }
    if !dn.tiled {
        // The config keeps the checkpoint's grouped order (Qwen3-Next).
        return Ok(t);
    }
    // The shape was checked against the config on reading.
    let len = t.dim(at.dim)?;
    let index = head_order(dn, &at, len, to_tiled);
    let index = Tensor::from_vec(index, len, t.device())?;
    Ok(t.index_select(&index, at.dim)?.contiguous()?)
}

fn delta_net(config: &ModelConfig) -> Option<&DeltaNetConfig> {
    config.delta_net.as_ref()
}

/// `w` as read from a checkpoint, made what a GGUF file converted from it holds.
pub(super) fn to_gguf(w: Weight, t: Tensor, config: &ModelConfig) -> Result<Tensor> {
    let Some(dn) = delta_net(config) else {
        return Ok(t);
    };
    let next = config.architecture == Architecture::Qwen3Next;
    let t = match w {
        Weight::SsmConv(_) => t.squeeze(1)?,
        _ if next && fused_rows(w, dn).is_some() => unfused(t, w, dn)?,
        Weight::SsmA(_) => {
            let a: Vec<f32> = t.to_dtype(DType::F32)?.to_vec1()?;
            let n = a.len();
            Tensor::from_vec(a.into_iter().map(a_from_a_log).collect(), n, &Device::Cpu)?
        }
        _ => t,
    };
    reorder(t, w, dn, true)
}

/// `ln(-a)` in f32: the `A_log` nearest to what `a` came from.
#[cfg(any(test, feature = "testing"))]
pub fn a_log_from_a(a: f32) -> f32 {
    ((-a) as f64).ln() as f32
}

/// The inverse of [`to_gguf`], for the test writer: `A_log` as [`a_log_from_a`] (exact only
/// where [`a_from_a_log`] takes it back to `a`; `crate::testing` says how the tests keep it so).
#[cfg(any(test, feature = "testing"))]
pub(super) fn to_hf(w: Weight, t: Tensor, config: &ModelConfig) -> Result<Tensor> {
    let Some(dn) = delta_net(config) else {
        return Ok(t);
    };
    let t = reorder(t, w, dn, false)?;
    Ok(match w {
        Weight::SsmConv(_) => t.unsqueeze(1)?,
        Weight::SsmA(_) => {
            let a: Vec<f32> = t.to_dtype(DType::F32)?.to_vec1()?;
            let n = a.len();
            Tensor::from_vec(a.into_iter().map(a_log_from_a).collect(), n, &Device::Cpu)?
        }
        _ => t,
    })
}

/// config.json's hybrid fields for `config` (the inverse of [`hf_params`]): the rope in
/// transformers 5's `rope_parameters`, the layers as `layer_types`.
#[cfg(any(test, feature = "testing"))]
pub(super) fn checkpoint_fields(config: &ModelConfig) -> Option<serde_json::Value> {
    let dn = delta_net(config)?;
    let layer_types: Vec<&str> = (0..config.num_layers)
        .map(|i| {
            if dn.is_recurrent(i) {
                "linear_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let rotary = config.rotary_dim.unwrap_or(config.head_dim);
    let factor = rotary as f64 / config.head_dim as f64;
    let mut fields = serde_json::json!({
        "linear_conv_kernel_dim": dn.conv_kernel,
        "linear_key_head_dim": dn.head_dim,
        "linear_value_head_dim": dn.head_dim,
        "linear_num_key_heads": dn.k_heads,
        "linear_num_value_heads": dn.v_heads,
    });
    let own = if config.architecture == Architecture::Qwen3Next {
        // Qwen3-Next's config: the rope at the top level, the layers by their interval.
        let interval = (1..=config.num_layers).find(|&n| {
            (0..config.num_layers).all(|i| dn.is_recurrent(i) != (i + 1).is_multiple_of(n))
        })?;
        serde_json::json!({
            "full_attention_interval": interval,
            "partial_rotary_factor": factor,
        })
    } else {
        serde_json::json!({
            "layer_types": layer_types,
            "attn_output_gate": true,
            "rope_theta": null,
            "rope_scaling": null,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": config.rope_theta,
                "partial_rotary_factor": factor,
                "mrope_section": [rotary / 4, rotary / 4, rotary / 2 - 2 * (rotary / 4)],
                "mrope_interleaved": true,
            },
            "mtp_num_hidden_layers": 0,
        })
    };
    for (k, v) in own.as_object().expect("an object") {
        fields[k] = v.clone();
    }
    if let Some(moe) = &config.moe {
        for (k, v) in super::export::qwen_moe_fields(moe)
            .as_object()
            .expect("an object")
        {
            fields[k] = v.clone();
        }
    }
    Some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dn(k_heads: usize, v_heads: usize) -> DeltaNetConfig {
        DeltaNetConfig {
            conv_kernel: 4,
            head_dim: 2,
            k_heads,
            v_heads,
            recurrent: vec![true, false],
            tiled: true,
        }
    }

    #[test]
    fn value_heads_go_from_grouped_to_tiled_and_back() {
        // 2 key heads, 3 value heads each, heads of 2 rows: grouped head g = kh * 3 + j is
        // tiled head j * 2 + kh.
        let dn = dn(2, 6);
        let at = value_heads(Weight::SsmGate(0), &dn).unwrap();
        let to = head_order(&dn, &at, 12, true);
        assert_eq!(to, [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]);
        let back = head_order(&dn, &at, 12, false);
        let round: Vec<u32> = (0..12).map(|i| to[back[i] as usize]).collect();
        assert_eq!(round, (0..12).collect::<Vec<u32>>());
        // The projection's q and k rows stay where they are.
        let at = value_heads(Weight::SsmQkv(0), &dn).unwrap();
        let to = head_order(&dn, &at, 8 + 12, true);
        assert_eq!(&to[..8], &(0..8).collect::<Vec<u32>>()[..]);
        assert_eq!(to[8..12], [8, 9, 14, 15]);
    }

    /// Qwen3-Next's fused rows as llama.cpp's converter splits them (`Qwen3NextModel`:
    /// `[q, k, v, z]` a key head, each `head_dim`, `head_dim`, and per-key value heads of
    /// `head_dim`; `in_proj_ba` as `[b, a]` a key head): written out, not derived, since the
    /// round trip through the test writer cannot tell a wrong layout from a right one.
    #[test]
    fn qwen3_next_fused_rows_are_the_converters() {
        let mut dn = dn(2, 4);
        dn.head_dim = 1;
        // Stacked: q0 q1 | k0 k1 | v0..v3 (v0, v1 of key head 0) | z0..z3.
        let qkvz = fused_order(Weight::SsmQkv(0), &dn);
        assert_eq!(qkvz, [0, 2, 4, 5, 8, 9, 1, 3, 6, 7, 10, 11]);
        // Stacked: b0..b3 | a0..a3.
        let ba = fused_order(Weight::SsmBeta(0), &dn);
        assert_eq!(ba, [0, 1, 4, 5, 2, 3, 6, 7]);
    }

    #[test]
    fn a_log_round_trips_where_exp_allows() {
        for a in [-1.0f32, -0.5, -1.2, -0.75] {
            assert_eq!(a_from_a_log(a_log_from_a(a)), a);
        }
        assert_eq!(a_from_a_log(0.0), -1.0);
    }

    #[test]
    fn tensors_round_trip_through_the_checkpoint_layout() {
        let dn = dn(2, 4);
        let config = ModelConfig {
            delta_net: Some(dn.clone()),
            ..super::super::tests::tiny(Architecture::Qwen35)
        };
        let conv_dim = 2 * 2 * 2 + 4 * 2;
        let conv = Tensor::arange(0f32, (conv_dim * 4) as f32, &Device::Cpu)
            .unwrap()
            .reshape((conv_dim, 4))
            .unwrap();
        let hf = to_hf(Weight::SsmConv(0), conv.clone(), &config).unwrap();
        assert_eq!(
            hf.dims(),
            stored_shape(Weight::SsmConv(0), &[conv_dim, 4], &config)
        );
        let back = to_gguf(Weight::SsmConv(0), hf, &config).unwrap();
        assert_eq!(
            back.to_vec2::<f32>().unwrap(),
            conv.to_vec2::<f32>().unwrap()
        );
        let out = Tensor::arange(0f32, 24.0, &Device::Cpu)
            .unwrap()
            .reshape((3, 8))
            .unwrap();
        let hf = to_hf(Weight::SsmOut(0), out.clone(), &config).unwrap();
        assert_ne!(hf.to_vec2::<f32>().unwrap(), out.to_vec2::<f32>().unwrap());
        let back = to_gguf(Weight::SsmOut(0), hf, &config).unwrap();
        assert_eq!(
            back.to_vec2::<f32>().unwrap(),
            out.to_vec2::<f32>().unwrap()
        );
    }
}
