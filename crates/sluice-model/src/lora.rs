//! LoRA adapters: a fine-tune kept as low-rank updates beside the base weights, so that one
//! base serves many of them. A projection `W` of an adapted layer computes `W x + s B (A x)`,
//! `A` `[rank, inputs]`, `B` `[outputs, rank]`, `s` the adapter's scale (`alpha / rank`, or
//! `alpha / sqrt(rank)` with rsLoRA).
//!
//! Two layouts are read, the same numbers either way:
//! - PEFT's directory: `adapter_config.json` (`r`, `lora_alpha`, `target_modules`,
//!   `use_rslora`) and `adapter_model.safetensors`
//!   (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`, ...), in the Hugging
//!   Face row order;
//! - llama.cpp's GGUF adapter (`general.type` `adapter`, `adapter.type` `lora`,
//!   `adapter.lora.alpha`; `blk.N.attn_q.weight.lora_a` and `.lora_b`), whose llama Q/K `B`
//!   rows llama.cpp's converter permuted as it permutes the base weights: put back here, as the
//!   base loader puts the weights back.
//!
//! The update runs row by row after the base matmul ([`StepLoras::add`]): each row's
//! arithmetic is its own, in a fixed order, whatever else the step holds, so batching stays
//! invisible; rows without an adapter pay nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;
use serde::Deserialize;

use crate::config::{Architecture, ModelConfig};
use crate::error::{ModelError, Result};
use crate::weights::unpermuted_row;

/// PEFT's adapter files.
pub const PEFT_CONFIG_FILE: &str = "adapter_config.json";
pub const PEFT_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// The projections an adapter may update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Projection {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Projection {
    pub const ALL: [Projection; 7] = [
        Self::Q,
        Self::K,
        Self::V,
        Self::O,
        Self::Gate,
        Self::Up,
        Self::Down,
    ];

    /// PEFT's `target_modules` name.
    pub fn peft_name(self) -> &'static str {
        match self {
            Self::Q => "q_proj",
            Self::K => "k_proj",
            Self::V => "v_proj",
            Self::O => "o_proj",
            Self::Gate => "gate_proj",
            Self::Up => "up_proj",
            Self::Down => "down_proj",
        }
    }

    /// Where the module lies in a transformers decoder layer.
    pub(crate) fn peft_path(self) -> &'static str {
        match self {
            Self::Q | Self::K | Self::V | Self::O => "self_attn",
            Self::Gate | Self::Up | Self::Down => "mlp",
        }
    }

    /// llama.cpp's tensor name in a layer.
    pub(crate) fn gguf_name(self) -> &'static str {
        match self {
            Self::Q => "attn_q",
            Self::K => "attn_k",
            Self::V => "attn_v",
            Self::O => "attn_output",
            Self::Gate => "ffn_gate",
            Self::Up => "ffn_up",
            Self::Down => "ffn_down",
        }
    }

    /// `(inputs, outputs)` of the projection in `c`.
    pub(crate) fn shape(self, c: &ModelConfig) -> (usize, usize) {
        let (h, q, kv, inter) = (
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
            c.intermediate_size,
        );
        match self {
            Self::Q => (h, q),
            Self::K | Self::V => (h, kv),
            Self::O => (q, h),
            Self::Gate | Self::Up => (h, inter),
            Self::Down => (inter, h),
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn is_mlp(self) -> bool {
        matches!(self, Self::Gate | Self::Up | Self::Down)
    }
}

/// One projection's update: `B (A x)`, the adapter's scale applied after.
#[derive(Debug, Clone)]
pub struct LowRank {
    rank: usize,
    inputs: usize,
    outputs: usize,
    /// `[rank, inputs]`, row-major.
    a: Vec<f32>,
    /// `[outputs, rank]`, row-major.
    b: Vec<f32>,
}

/// A LoRA adapter, checked against the model it adapts.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    path: PathBuf,
    rank: usize,
    scale: f32,
    /// Per layer, per [`Projection`]: its update, if the adapter has one.
    layers: Vec<[Option<LowRank>; 7]>,
}

impl LoraAdapter {
    /// The adapter at `path` (a PEFT directory or a GGUF adapter file) for a model of
    /// `config`; refused, naming the problem, when its rank exceeds `max_rank`, a tensor is
    /// missing or mis-shaped, or it adapts what the model lacks or sluice cannot adapt.
    pub fn load(path: &Path, config: &ModelConfig, max_rank: usize) -> Result<Self> {
        let adapter = if path.is_dir() {
            Self::from_peft(path, config)?
        } else {
            Self::from_gguf(path, config)?
        };
        if adapter.rank > max_rank {
            return Err(invalid(
                path,
                format!("rank {} is above --max-lora-rank {max_rank}", adapter.rank),
            ));
        }
        Ok(adapter)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The largest rank of its updates.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// `alpha / rank` (or `alpha / sqrt(rank)` with rsLoRA).
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Whether the adapter has an update for `projection` of layer `layer`.
    pub fn adapts(&self, layer: usize, projection: Projection) -> bool {
        self.update(layer, projection).is_some()
    }

    fn update(&self, layer: usize, projection: Projection) -> Option<&LowRank> {
        self.layers.get(layer)?[projection.index()].as_ref()
    }

    /// `W + scale * B A` for `projection` of layer `layer`, given `W` `[outputs, inputs]`
    /// row-major: the weights an adapter merged into its base would have (tests compare the
    /// two ways of computing them).
    pub fn merged(&self, layer: usize, projection: Projection, w: &[f32]) -> Vec<f32> {
        let mut out = w.to_vec();
        if let Some(u) = self.update(layer, projection) {
            for o in 0..u.outputs {
                for i in 0..u.inputs {
                    let ba: f32 = (0..u.rank)
                        .map(|k| u.b[o * u.rank + k] * u.a[k * u.inputs + i])
                        .sum();
                    out[o * u.inputs + i] += self.scale * ba;
                }
            }
        }
        out
    }

    fn from_peft(dir: &Path, config: &ModelConfig) -> Result<Self> {
        let config_path = dir.join(PEFT_CONFIG_FILE);
        let text = std::fs::read_to_string(&config_path).map_err(|source| ModelError::Io {
            path: config_path.clone(),
            source,
        })?;
        let c: PeftConfig = serde_json::from_str(&text)
            .map_err(|e| invalid(&config_path, format!("not a PEFT LoRA config: {e}")))?;
        c.check(&config_path)?;
        let targets = c.targets(&config_path)?;
        let weights_path = dir.join(PEFT_WEIGHTS_FILE);
        if !weights_path.is_file() {
            return Err(invalid(dir, format!("no {PEFT_WEIGHTS_FILE}")));
        }
        let tensors = candle_core::safetensors::load(&weights_path, &Device::Cpu)
            .map_err(|e| invalid(&weights_path, format!("not a valid safetensors file: {e}")))?;
        let mut pairs = Pairs::new(config.num_layers);
        for (name, tensor) in tensors {
            let Some((layer, projection, side)) = parse_peft_name(&name) else {
                return Err(invalid(
                    &weights_path,
                    format!(
                        "tensor `{name}` is not a LoRA update of a decoder layer's q/k/v/o/gate/\
                         up/down projection"
                    ),
                ));
            };
            if !targets.contains(&projection) {
                return Err(invalid(
                    &weights_path,
                    format!(
                        "tensor `{name}` updates `{}`, which target_modules does not list",
                        projection.peft_name()
                    ),
                ));
            }
            pairs.insert(&weights_path, &name, layer, projection, side, tensor)?;
        }
        let scale = if c.use_rslora.unwrap_or(false) {
            c.lora_alpha / (c.r as f32).sqrt()
        } else {
            c.lora_alpha / c.r as f32
        };
        pairs.into_adapter(&weights_path, config, Scale::Peft { scale, rank: c.r })
    }

    fn from_gguf(path: &Path, config: &ModelConfig) -> Result<Self> {
        let mut file = std::fs::File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let content = gguf_file::Content::read(&mut file)
            .map_err(|e| invalid(path, format!("not a GGUF file: {e}")))?;
        let text = |key: &str| match content.metadata.get(key) {
            Some(gguf_file::Value::String(s)) => Some(s.clone()),
            _ => None,
        };
        if text("general.type").as_deref() != Some("adapter")
            || text("adapter.type").as_deref() != Some("lora")
        {
            return Err(invalid(
                path,
                "not a LoRA adapter (`general.type` adapter, `adapter.type` lora)".to_string(),
            ));
        }
        let arch = text("general.architecture").unwrap_or_default();
        if Architecture::from_name(&arch) != Some(config.architecture) {
            return Err(invalid(
                path,
                format!(
                    "`general.architecture` is `{arch}`; the model is {}",
                    config.architecture.name()
                ),
            ));
        }
        let alpha = match content.metadata.get("adapter.lora.alpha") {
            Some(v) => v
                .to_f32()
                .map_err(|e| invalid(path, format!("`adapter.lora.alpha`: {e}")))?,
            None => 0.0,
        };
        let mut pairs = Pairs::new(config.num_layers);
        let names: Vec<String> = content.tensor_infos.keys().cloned().collect();
        for name in names {
            let Some((layer, projection, side)) = parse_gguf_name(&name) else {
                return Err(invalid(
                    path,
                    format!(
                        "tensor `{name}` is not a LoRA update of a layer's attn_q/k/v/output or \
                         ffn_gate/up/down"
                    ),
                ));
            };
            let tensor = content
                .tensor(&mut file, &name, &Device::Cpu)
                .and_then(|q| q.dequantize(&Device::Cpu))
                .map_err(|e| invalid(path, format!("tensor `{name}`: {e}")))?;
            pairs.insert(path, &name, layer, projection, side, tensor)?;
        }
        // llama files' Q and K rows were permuted by the converter, B's with them.
        let permuted = config.architecture == Architecture::Llama;
        pairs.into_adapter(path, config, Scale::Gguf { alpha, permuted })
    }
}

/// PEFT's `adapter_config.json`, the fields sluice reads; unknown ones are ignored.
#[derive(Debug, Deserialize)]
struct PeftConfig {
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f32,
    target_modules: Option<serde_json::Value>,
    use_rslora: Option<bool>,
    use_dora: Option<bool>,
    bias: Option<String>,
    fan_in_fan_out: Option<bool>,
    modules_to_save: Option<serde_json::Value>,
    rank_pattern: Option<serde_json::Map<String, serde_json::Value>>,
    alpha_pattern: Option<serde_json::Map<String, serde_json::Value>>,
}

impl PeftConfig {
    /// Refuses what sluice's update does not compute, naming the field.
    fn check(&self, path: &Path) -> Result<()> {
        let field = |key: &str, why: &str| invalid(path, format!("`{key}`: {why}"));
        if let Some(t) = self.peft_type.as_deref().filter(|t| *t != "LORA") {
            return Err(field("peft_type", &format!("{t} (supported: LORA)")));
        }
        if self.r == 0 {
            return Err(field("r", "the rank must be at least 1"));
        }
        if self.use_dora == Some(true) {
            return Err(field(
                "use_dora",
                "DoRA's magnitude vectors are not supported",
            ));
        }
        if let Some(b) = self.bias.as_deref().filter(|b| *b != "none") {
            return Err(field("bias", &format!("`{b}` (supported: none)")));
        }
        if self.fan_in_fan_out == Some(true) {
            return Err(field(
                "fan_in_fan_out",
                "transposed (Conv1D) layers are not supported",
            ));
        }
        let non_empty = |v: &Option<serde_json::Value>| {
            v.as_ref()
                .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
        };
        if non_empty(&self.modules_to_save) {
            return Err(field(
                "modules_to_save",
                "whole modules saved beside the adapter (an embedding, a head) are not supported",
            ));
        }
        if self.rank_pattern.as_ref().is_some_and(|p| !p.is_empty()) {
            return Err(field("rank_pattern", "per-module ranks are not supported"));
        }
        if self.alpha_pattern.as_ref().is_some_and(|p| !p.is_empty()) {
            return Err(field(
                "alpha_pattern",
                "per-module alphas are not supported",
            ));
        }
        Ok(())
    }

    /// The projections `target_modules` names: a list of module names (or one name);
    /// `all-linear` is all seven.
    fn targets(&self, path: &Path) -> Result<Vec<Projection>> {
        let names: Vec<&str> = match &self.target_modules {
            Some(serde_json::Value::String(s)) if s == "all-linear" => {
                return Ok(Projection::ALL.to_vec())
            }
            Some(serde_json::Value::String(s)) => vec![s.as_str()],
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str().ok_or_else(|| {
                        invalid(path, "`target_modules`: not a list of names".into())
                    })
                })
                .collect::<Result<_>>()?,
            _ => return Err(invalid(path, "`target_modules`: not present".into())),
        };
        names
            .into_iter()
            .map(|name| {
                Projection::ALL
                    .into_iter()
                    .find(|p| p.peft_name() == name)
                    .ok_or_else(|| {
                        invalid(
                            path,
                            format!(
                                "`target_modules` names `{name}`, which this model does not have \
                                 (supported: {})",
                                Projection::ALL.map(Projection::peft_name).join(", ")
                            ),
                        )
                    })
            })
            .collect()
    }
}

/// Which half of an update a tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

/// `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` (a `.default` before
/// `.weight` in some PEFT versions).
fn parse_peft_name(name: &str) -> Option<(usize, Projection, Side)> {
    let rest = name.strip_prefix("base_model.model.")?;
    let rest = rest.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let rest = rest.strip_suffix(".weight")?.trim_end_matches(".default");
    let (module, side) = rest.rsplit_once('.')?;
    let side = match side {
        "lora_A" => Side::A,
        "lora_B" => Side::B,
        _ => return None,
    };
    let projection = Projection::ALL
        .into_iter()
        .find(|p| module == format!("{}.{}", p.peft_path(), p.peft_name()))?;
    Some((layer, projection, side))
}

/// `blk.N.attn_q.weight.lora_a`.
fn parse_gguf_name(name: &str) -> Option<(usize, Projection, Side)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, side) = rest.rsplit_once(".weight.lora_")?;
    let side = match side {
        "a" => Side::A,
        "b" => Side::B,
        _ => return None,
    };
    let projection = Projection::ALL
        .into_iter()
        .find(|p| p.gguf_name() == module)?;
    Some((layer, projection, side))
}

/// The halves read so far, checked into an adapter at the end.
struct Pairs {
    layers: Vec<[(Option<Tensor>, Option<Tensor>); 7]>,
}

impl Pairs {
    fn new(num_layers: usize) -> Self {
        Self {
            layers: (0..num_layers).map(|_| Default::default()).collect(),
        }
    }

    fn insert(
        &mut self,
        path: &Path,
        name: &str,
        layer: usize,
        projection: Projection,
        side: Side,
        tensor: Tensor,
    ) -> Result<()> {
        let num_layers = self.layers.len();
        let Some(slots) = self.layers.get_mut(layer) else {
            return Err(invalid(
                path,
                format!("tensor `{name}` is for layer {layer}; the model has {num_layers}"),
            ));
        };
        let slot = &mut slots[projection.index()];
        let half = match side {
            Side::A => &mut slot.0,
            Side::B => &mut slot.1,
        };
        if half.replace(tensor).is_some() {
            return Err(invalid(path, format!("tensor `{name}` appears twice")));
        }
        Ok(())
    }

    /// The updates, each checked against the model's projection: A `[rank, inputs]`, B
    /// `[outputs, rank]`, both present.
    fn into_adapter(self, path: &Path, config: &ModelConfig, scale: Scale) -> Result<LoraAdapter> {
        let mut layers = Vec::with_capacity(self.layers.len());
        let mut max_rank = 0;
        let mut one_rank = None;
        for (i, slots) in self.layers.into_iter().enumerate() {
            let mut out: [Option<LowRank>; 7] = Default::default();
            for (projection, (a, b)) in Projection::ALL.into_iter().zip(slots) {
                let what = |side: &str| format!("layer {i}'s {} {side}", projection.peft_name());
                let (a, b) = match (a, b) {
                    (None, None) => continue,
                    (Some(_), None) => {
                        return Err(invalid(path, format!("{} is missing", what("lora_B"))))
                    }
                    (None, Some(_)) => {
                        return Err(invalid(path, format!("{} is missing", what("lora_A"))))
                    }
                    (Some(a), Some(b)) => (a, b),
                };
                if projection.is_mlp() && config.moe.is_some() {
                    return Err(invalid(
                        path,
                        format!(
                            "it adapts {} of a mixture-of-experts layer: only attention \
                             projections are adapted on a mixture",
                            projection.peft_name()
                        ),
                    ));
                }
                let (inputs, outputs) = projection.shape(config);
                let dims = |t: &Tensor| t.dims().to_vec();
                let (ad, bd) = (dims(&a), dims(&b));
                let r = ad.first().copied().unwrap_or(0);
                if ad.len() != 2 || ad[1] != inputs || r == 0 {
                    return Err(invalid(
                        path,
                        format!(
                            "{} has shape {ad:?}; expected [rank, {inputs}]",
                            what("lora_A")
                        ),
                    ));
                }
                if bd != [outputs, r] {
                    return Err(invalid(
                        path,
                        format!(
                            "{} has shape {bd:?}; expected [{outputs}, {r}] (its rank is A's)",
                            what("lora_B")
                        ),
                    ));
                }
                if let Scale::Peft { rank, .. } = scale {
                    if rank != r {
                        return Err(invalid(
                            path,
                            format!(
                                "{} has rank {r}; the config's `r` is {rank}",
                                what("lora_A")
                            ),
                        ));
                    }
                }
                if *one_rank.get_or_insert(r) != r {
                    return Err(invalid(
                        path,
                        format!(
                            "{} has rank {r}, other updates {}: an adapter has one rank",
                            what("lora_A"),
                            one_rank.unwrap_or(0)
                        ),
                    ));
                }
                let values = |t: Tensor| -> Result<Vec<f32>> {
                    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
                };
                let a = values(a)?;
                let mut b = values(b)?;
                if let Scale::Gguf { permuted: true, .. } = scale {
                    if matches!(projection, Projection::Q | Projection::K) {
                        let permuted = b.clone();
                        for (row, out) in b.chunks_exact_mut(r).enumerate() {
                            let from = unpermuted_row(row, config.head_dim);
                            out.copy_from_slice(&permuted[from * r..][..r]);
                        }
                    }
                }
                max_rank = max_rank.max(r);
                out[projection.index()] = Some(LowRank {
                    rank: r,
                    inputs,
                    outputs,
                    a,
                    b,
                });
            }
            layers.push(out);
        }
        if max_rank == 0 {
            return Err(invalid(path, "the adapter updates nothing".into()));
        }
        if max_rank > MAX_RANK {
            return Err(invalid(
                path,
                format!("rank {max_rank} is above the most sluice supports, {MAX_RANK}"),
            ));
        }
        let scale = match scale {
            Scale::Peft { scale, .. } => scale,
            // llama.cpp's rule: alpha / rank, or 1 without an alpha.
            Scale::Gguf { alpha, .. } if alpha != 0.0 => alpha / max_rank as f32,
            Scale::Gguf { .. } => 1.0,
        };
        Ok(LoraAdapter {
            path: path.to_path_buf(),
            rank: max_rank,
            scale,
            layers,
        })
    }
}

/// How an adapter's layout scales its updates.
#[derive(Debug, Clone, Copy)]
enum Scale {
    /// PEFT: `lora_alpha / r` (or over `sqrt(r)`), every update of rank `r`.
    Peft { scale: f32, rank: usize },
    /// llama.cpp: `adapter.lora.alpha / rank` (1 when 0); `permuted`: llama Q/K B rows in the
    /// converter's order.
    Gguf { alpha: f32, permuted: bool },
}

fn invalid(path: &Path, reason: String) -> ModelError {
    ModelError::InvalidFile {
        path: path.to_path_buf(),
        reason,
    }
}

/// The adapters of one step's rows: `slots[row]` is 0 for the base model, else the adapter in
/// `adapters[slot - 1]`. Empty `slots`: no row has one.
#[derive(Clone, Copy)]
pub(crate) struct StepLoras<'a> {
    pub slots: &'a [u16],
    pub adapters: &'a [Option<Arc<LoraAdapter>>],
}

impl StepLoras<'_> {
    /// Adds each adapted row's update to `out` (`[rows, n]`: a base projection's output, whose
    /// columns from `parts[i].1` on are `parts[i].0`'s), from that row of `x` (`[rows,
    /// inputs]`). Each adapter's rows are updated together ([`LowRank::add_rows`]), so its A
    /// and B are read once a step, not once a row; every element is the same dot products in
    /// the same order as a row alone, so a row's result is the same in any batch.
    pub fn add(
        &self,
        layer: usize,
        parts: &[(Projection, usize)],
        x: &[f32],
        out: &mut [f32],
        n: usize,
    ) {
        if self.slots.is_empty() {
            return;
        }
        for (i, adapter) in self.adapters.iter().enumerate() {
            let Some(adapter) = adapter.as_deref() else {
                continue;
            };
            let slot = i as u16 + 1;
            if !self.slots.contains(&slot) {
                continue;
            }
            for &(projection, offset) in parts {
                if let Some(u) = adapter.update(layer, projection) {
                    let rows = Rows {
                        slots: self.slots,
                        slot,
                    };
                    u.add_rows(adapter.scale, rows, x, out, n, offset);
                }
            }
        }
    }
}

/// The rows of a step one adapter updates: those whose slot is `slot`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    slots: &'a [u16],
    slot: u16,
}

impl Rows<'_> {
    fn has(&self, row: usize) -> bool {
        self.slots[row] == self.slot
    }
}

/// Most ranks an adapter may have ([`LoraAdapter::load`] refuses more).
pub const MAX_RANK: usize = 512;

/// Rows of one adapter up to which [`LowRank::add_rows`] reads A and B once for all of them,
/// split over their columns; past it each row is one task that reads them itself. Measured on
/// Qwen2.5-1.5B, rank 16, 2 cores (BENCHMARKS.md): the split pays for one row (a lone decode
/// row would otherwise run on one core), while 16 decode rows or a prefill chunk run faster a
/// row a task (A and B stay in the cache; the split's many small tasks cost more).
const GROUPED_ROWS: usize = 1;

/// Output columns one task of [`LowRank::add_rows`]'s second product computes.
const COLUMNS_PER_TASK: usize = 64;

thread_local! {
    /// [`LowRank::add_rows`]'s intermediates, kept from call to call: `A x` by rank then row,
    /// the same by row then rank, and the update by column then row.
    static SCRATCH: std::cell::RefCell<[Vec<f32>; 3]> = Default::default();
}

impl LowRank {
    /// `out[row] += scale * B (A x[row])` for every row of `rows`, `x` `[rows, inputs]` and
    /// `out` `[rows, n]` (this update's columns from `offset`). Parallel over A's rows, then
    /// over B's: each is read once for all the rows. Every element is `dot(A_k, x_row)`, then
    /// `out + scale * dot(B_o, t_row)`, as for one row alone.
    fn add_rows(
        &self,
        scale: f32,
        rows: Rows<'_>,
        x: &[f32],
        out: &mut [f32],
        n: usize,
        offset: usize,
    ) {
        let count = rows.slots.len();
        let (inputs, rank) = (self.inputs, self.rank);
        if (0..count).filter(|&r| rows.has(r)).count() > GROUPED_ROWS {
            out.par_chunks_mut(n)
                .zip(x.par_chunks(inputs))
                .enumerate()
                .filter(|(row, _)| rows.has(*row))
                .for_each(|(_, (out, x))| {
                    self.add_row(scale, x, &mut out[offset..offset + self.outputs]);
                });
            return;
        }
        // Taken out for the call and put back after: a rayon worker waiting in this call's
        // parallel loops may run another step's call on the same thread.
        let [mut by_rank, mut by_row, mut delta] =
            SCRATCH.with(|scratch| std::mem::take(&mut *scratch.borrow_mut()));
        {
            by_rank.clear();
            by_rank.resize(rank * count, 0.0);
            by_rank
                .par_chunks_mut(count)
                .enumerate()
                .for_each(|(k, t)| {
                    let a = &self.a[k * inputs..][..inputs];
                    for (row, t) in t.iter_mut().enumerate() {
                        if rows.has(row) {
                            *t = dot(a, &x[row * inputs..][..inputs]);
                        }
                    }
                });
            by_row.clear();
            by_row.resize(count * rank, 0.0);
            for (row, t) in by_row.chunks_exact_mut(rank).enumerate() {
                for (k, t) in t.iter_mut().enumerate() {
                    *t = by_rank[k * count + row];
                }
            }
            delta.clear();
            delta.resize(self.outputs * count, 0.0);
            delta
                .par_chunks_mut(COLUMNS_PER_TASK * count)
                .enumerate()
                .for_each(|(chunk, d)| {
                    for (j, d) in d.chunks_exact_mut(count).enumerate() {
                        let o = chunk * COLUMNS_PER_TASK + j;
                        let b = &self.b[o * rank..][..rank];
                        for (row, d) in d.iter_mut().enumerate() {
                            if rows.has(row) {
                                *d = scale * dot(b, &by_row[row * rank..][..rank]);
                            }
                        }
                    }
                });
            for (row, out) in out.chunks_exact_mut(n).enumerate() {
                if !rows.has(row) {
                    continue;
                }
                let out = &mut out[offset..offset + self.outputs];
                for (o, out) in out.iter_mut().enumerate() {
                    *out += delta[o * count + row];
                }
            }
        }
        SCRATCH.with(|scratch| *scratch.borrow_mut() = [by_rank, by_row, delta]);
    }
}

impl LowRank {
    /// `out += scale * B (A x)` for one row: the same dot products, in the same order, as
    /// [`LowRank::add_rows`]'s grouped path computes for each of its rows.
    fn add_row(&self, scale: f32, x: &[f32], out: &mut [f32]) {
        let mut t = [0f32; MAX_RANK];
        let t = &mut t[..self.rank];
        for (k, t) in t.iter_mut().enumerate() {
            *t = dot(&self.a[k * self.inputs..][..self.inputs], x);
        }
        for (o, out) in out.iter_mut().enumerate() {
            *out += scale * dot(&self.b[o * self.rank..][..self.rank], t);
        }
    }
}

/// `a . b` in a fixed order: eight running sums over the elements in turn, added together
/// left to right, then the tail. The compiler vectorizes the lanes; the order never changes.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (a, b) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            lanes[l] += a[l] * b[l];
        }
    }
    let mut sum = lanes.iter().sum::<f32>();
    for (a, b) in ca.remainder().iter().zip(cb.remainder()) {
        sum += a * b;
    }
    sum
}
