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
//! The update runs after each fused projection's base matmul ([`StepLoras::add`]), each
//! adapter's rows together on the packed kernels ([`crate::low_rank`]): each row's arithmetic
//! is its own, in a fixed order, whatever else the step holds, so batching stays invisible;
//! rows without an adapter pay nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::low_rank::{LowRankGroup, LowRankScratch, PartValues};
use crate::weights::unpermuted_row;
use rayon::prelude::*;

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

    /// The fused projection the CPU forward computes it in.
    fn group(self) -> Group {
        match self {
            Self::Q | Self::K | Self::V => Group::Qkv,
            Self::O => Group::O,
            Self::Gate | Self::Up => Group::GateUp,
            Self::Down => Group::Down,
        }
    }
}

/// A fused projection of the CPU forward: projections that read one input, their outputs side
/// by side in [`Group::projections`]' order (Q, K, V; gate, up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    Qkv,
    O,
    GateUp,
    Down,
}

impl Group {
    const ALL: [Group; 4] = [Self::Qkv, Self::O, Self::GateUp, Self::Down];

    fn projections(self) -> &'static [Projection] {
        match self {
            Self::Qkv => &[Projection::Q, Projection::K, Projection::V],
            Self::O => &[Projection::O],
            Self::GateUp => &[Projection::Gate, Projection::Up],
            Self::Down => &[Projection::Down],
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// An adapter's updates of one fused projection, and the projections they are (in the
/// update's parts' order).
#[derive(Debug)]
struct AdaptedGroup {
    update: LowRankGroup,
    projections: Vec<Projection>,
}

/// A LoRA adapter, checked against the model it adapts.
#[derive(Debug)]
pub struct LoraAdapter {
    path: PathBuf,
    rank: usize,
    scale: f32,
    /// Per layer, per [`Group`]: its updates, if the adapter has any.
    layers: Vec<[Option<AdaptedGroup>; 4]>,
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
        self.part(layer, projection).is_some()
    }

    /// The group holding `projection`'s update in layer `layer`, and its part there.
    fn part(&self, layer: usize, projection: Projection) -> Option<(&LowRankGroup, usize)> {
        let group = self.layers.get(layer)?[projection.group().index()].as_ref()?;
        let part = group.projections.iter().position(|&p| p == projection)?;
        Some((&group.update, part))
    }

    /// `W + scale * B A` for `projection` of layer `layer`, given `W` `[outputs, inputs]`
    /// row-major: the weights an adapter merged into its base would have (tests compare the
    /// two ways of computing them).
    pub fn merged(&self, layer: usize, projection: Projection, w: &[f32]) -> Vec<f32> {
        let mut out = w.to_vec();
        if let Some((group, part)) = self.part(layer, projection) {
            let (rank, outputs) = group.part_shape(part);
            let inputs = w.len() / outputs;
            let a: Vec<Vec<f32>> = (0..rank).map(|k| group.a_row(part, k)).collect();
            for o in 0..outputs {
                let b = group.b_row(part, o);
                for i in 0..inputs {
                    let ba: f32 = (0..rank).map(|k| b[k] * a[k][i]).sum();
                    out[o * inputs + i] += self.scale * ba;
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
        if !config.architecture.answers_to(&arch) {
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
        let permuted = config.architecture.traits().gguf_qk_permuted;
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
            let mut loaded: [Option<LoadedUpdate>; 7] = Default::default();
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
                loaded[projection.index()] = Some((r, a, b));
            }
            layers.push(Group::ALL.map(|group| adapted_group(group, config, &mut loaded)));
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

/// One projection's update as read: its rank, A `[rank, inputs]` and B `[outputs, rank]`.
type LoadedUpdate = (usize, Vec<f32>, Vec<f32>);

/// `group`'s updates among a layer's `loaded` ones (per [`Projection`]), taken out; `None`
/// when it has none.
fn adapted_group(
    group: Group,
    config: &ModelConfig,
    loaded: &mut [Option<LoadedUpdate>; 7],
) -> Option<AdaptedGroup> {
    let inputs = group.projections()[0].shape(config).0;
    let (mut column, mut parts, mut projections) = (0, Vec::new(), Vec::new());
    for &projection in group.projections() {
        let outputs = projection.shape(config).1;
        if let Some((rank, a, b)) = loaded[projection.index()].take() {
            parts.push(PartValues {
                column,
                rank,
                outputs,
                a,
                b,
            });
            projections.push(projection);
        }
        column += outputs;
    }
    (!parts.is_empty()).then(|| AdaptedGroup {
        update: LowRankGroup::new(inputs, parts),
        projections,
    })
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

/// Rows of a step from which the updates are added back in parallel, a share of rows a task
/// (below it the adds are too few to be worth the tasks).
const PARALLEL_ADD_ROWS: usize = 16;

/// The LoRA update's buffers, kept from step to step.
#[derive(Debug, Default)]
pub(crate) struct LoraScratch {
    /// Per adapter slot (slot `i + 1` at `i`): its rows and their products.
    slots: Vec<LowRankScratch>,
    /// Per step row: its place among its adapter's rows.
    positions: Vec<usize>,
    /// The slots (as indices into `slots`) with rows in the step and an adapter.
    active: Vec<usize>,
}

/// The adapters of one step's rows: `slots[row]` is 0 for the base model, else the adapter in
/// `adapters[slot - 1]`. Empty `slots`: no row has one.
#[derive(Clone, Copy)]
pub(crate) struct StepLoras<'a> {
    slots: &'a [u16],
    adapters: &'a [Option<Arc<LoraAdapter>>],
}

impl<'a> StepLoras<'a> {
    /// The step's adapters, its rows sorted by adapter into `scratch` once for all the step's
    /// projections.
    pub fn new(
        slots: &'a [u16],
        adapters: &'a [Option<Arc<LoraAdapter>>],
        scratch: &mut LoraScratch,
    ) -> Self {
        scratch.active.clear();
        scratch.positions.clear();
        if !slots.is_empty() {
            if scratch.slots.len() < adapters.len() {
                scratch.slots.resize_with(adapters.len(), Default::default);
            }
            for s in &mut scratch.slots {
                s.rows.clear();
            }
            for (row, &slot) in slots.iter().enumerate() {
                let position = match scratch.slots.get_mut((slot as usize).wrapping_sub(1)) {
                    Some(s) => {
                        s.rows.push(row);
                        s.rows.len() - 1
                    }
                    None => 0,
                };
                scratch.positions.push(position);
            }
            scratch.active.extend(
                (0..adapters.len())
                    .filter(|&i| adapters[i].is_some() && !scratch.slots[i].rows.is_empty()),
            );
        }
        Self { slots, adapters }
    }

    /// Adapter slot `i`'s update of `group` in layer `layer`, with its scale.
    fn update(&self, i: usize, layer: usize, group: Group) -> Option<(&LowRankGroup, f32)> {
        let adapter = self.adapters.get(i)?.as_deref()?;
        let update = adapter.layers.get(layer)?[group.index()].as_ref()?;
        Some((&update.update, adapter.scale))
    }

    /// Adds each adapted row's update to `out` (`[rows, n]`: the output of the fused
    /// projection `group`) from that row of `x` (`[rows, inputs]`). Each adapter's rows are
    /// multiplied together ([`LowRankGroup::compute`]), so its A and B are read once a step,
    /// not once a row, and the adapters of a step at once; every value is the same chain of
    /// operations as for the row alone, so a row's result is the same in any batch.
    pub fn add(
        &self,
        layer: usize,
        group: Group,
        x: &[f32],
        out: &mut [f32],
        n: usize,
        scratch: &mut LoraScratch,
    ) {
        let LoraScratch {
            slots,
            positions,
            active,
        } = scratch;
        match active.as_slice() {
            [] => return,
            &[i] => {
                if let Some((update, _)) = self.update(i, layer, group) {
                    update.compute(x, &mut slots[i]);
                }
            }
            _ => slots
                .par_iter_mut()
                .enumerate()
                .filter(|(i, _)| active.contains(i))
                .for_each(|(i, s)| {
                    if let Some((update, _)) = self.update(i, layer, group) {
                        update.compute(x, s);
                    }
                }),
        }
        let add = |(row, out): (usize, &mut [f32])| {
            let i = (self.slots[row] as usize).wrapping_sub(1);
            if let Some((update, scale)) = self.update(i, layer, group) {
                update.add_row(scale, &slots[i], positions[row], out);
            }
        };
        if self.slots.len() >= PARALLEL_ADD_ROWS {
            out.par_chunks_mut(n).enumerate().for_each(add);
        } else {
            out.chunks_mut(n).enumerate().for_each(add);
        }
    }
}

/// Most ranks an adapter may have ([`LoraAdapter::load`] refuses more).
pub const MAX_RANK: usize = 512;
