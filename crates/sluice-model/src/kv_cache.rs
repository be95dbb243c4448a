//! The paged KV cache: per layer, K and V for `num_blocks * block_size` token slots. Which slots
//! a sequence owns is the block manager's business; the cache only stores and reads slots.
//!
//! The layers are described by group, as vLLM v1 describes a cache by per-layer specs: the
//! full-attention layers share the full pool, and each further group the layer plans declare
//! ([`cache_groups`]: today the sliding-window layers, by window) may have a pool of its own
//! ([`KvPools`]), sized for the running sequences' windows rather than their lengths, that the
//! step addresses through that group's tables (`StepBatch::groups`). The memory this saves
//! goes to the full pool, which is what bounds how many tokens the server holds. All pools
//! come out of one budget ([`KvCache::pools_for_budget`]).
//!
//! The hybrids' Gated DeltaNet layers keep no K/V: their group ([`CacheKind::Recurrent`]) is
//! a pool of fixed-size states, one a running sequence, taken from the same budget (states
//! for up to the running sequences' count, at most half of it), and the full pool holds the
//! attention layers only.
//!
//! Its layout is the kernels' ([`KvLayout`]): block-major, K dimension-major within a block.
//! On the CPU the cache is host memory that the step writes and the attention kernels read in
//! place ([`HostKv`]): f32, f16, or 8-bit ([`KvDtype::Q8_0`]: the same layout as int8 with a
//! scale per 32 values, `sluice_kernels::cpu::attention::Q8Cache`). On a GPU it is device
//! tensors, which the CUDA kernels write and read.

use candle_core::{DType, Device, Tensor};
use half::f16;
use sluice_kernels::cpu::attention::{write_kv, write_q8, Q8Cache, Q8CacheMut, Q8_GROUP};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

pub use sluice_kernels::KvLayout;

/// What a KV cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    /// Half the bytes of f32 that attention reads at every decode step; the default.
    F16,
    /// On a GPU only (the CPU attention kernel does not read bf16).
    Bf16,
    /// int8 in groups of 32 along the head dimension, each with an f32 scale (absmax / 127):
    /// 1.125 bytes a value, so 1.8x the tokens of f16 per byte. CPU only.
    Q8_0,
}

impl KvDtype {
    /// The tensor element type of a float cache (`None` for the 8-bit one).
    pub fn float(self) -> Option<DType> {
        match self {
            Self::F32 => Some(DType::F32),
            Self::F16 => Some(DType::F16),
            Self::Bf16 => Some(DType::BF16),
            Self::Q8_0 => None,
        }
    }

    /// Bytes one token's K and V take in every layer, scales included.
    pub fn bytes_per_token(self, config: &ModelConfig) -> usize {
        match self.float() {
            Some(dtype) => config.kv_bytes_per_token(dtype.size_in_bytes()),
            // One byte a value and an f32 scale per group.
            None => config.kv_bytes_per_token(1) + config.kv_bytes_per_token(4) / Q8_GROUP,
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Q8_0 => "q8_0",
        })
    }
}

/// One layer on a GPU: K and V in one allocation (so a CUDA kernel writes both in one
/// launch), and each as a view of its half.
struct DeviceLayer {
    kv: Tensor,
    k: Tensor,
    v: Tensor,
}

/// One layer of a host float cache (zero pages until written).
struct HostLayer<E> {
    k: Vec<E>,
    v: Vec<E>,
}

/// One layer of an 8-bit cache, host memory (zero pages until written).
struct Q8Layer {
    k: Vec<i8>,
    k_scales: Vec<f32>,
    v: Vec<i8>,
    v_scales: Vec<f32>,
}

/// One DeltaNet layer's states (`sluice_kernels::cpu::delta_net::DeltaNetStates`'s layout).
struct StateLayer {
    conv: Vec<f32>,
    ssm: Vec<f32>,
}

enum Layers {
    Device(Vec<DeviceLayer>),
    F32(Vec<HostLayer<f32>>),
    F16(Vec<HostLayer<f16>>),
    Q8(Vec<Q8Layer>),
}

/// One layer of a host cache as the CPU attention kernels read it, in [`KvLayout`] order.
#[derive(Clone, Copy)]
pub enum HostKv<'a> {
    F32 { k: &'a [f32], v: &'a [f32] },
    F16 { k: &'a [f16], v: &'a [f16] },
    Q8(Q8Cache<'a>),
}

impl HostKv<'_> {
    /// Copies of K and V as flat tensors, for the candle reference attention (a test oracle,
    /// not a serving path). An 8-bit layer has none.
    pub fn tensors(&self, device: &Device) -> Result<(Tensor, Tensor)> {
        match self {
            Self::F32 { k, v } => Ok((
                Tensor::from_slice(k, k.len(), device)?,
                Tensor::from_slice(v, v.len(), device)?,
            )),
            Self::F16 { k, v } => Ok((
                Tensor::from_slice(k, k.len(), device)?,
                Tensor::from_slice(v, v.len(), device)?,
            )),
            Self::Q8(_) => Err(ModelError::KvCache(
                "a q8_0 KV cache is read only by the CPU attention kernel (attention backend cpu)"
                    .into(),
            )),
        }
    }
}

/// How many blocks each pool of a cache has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPools {
    /// Blocks of the full pool (the full-attention layers, and every layer of a group
    /// without a pool of its own).
    pub num_blocks: usize,
    /// Blocks of each group's own pool, one entry per group of [`cache_groups`] in its order
    /// (a recurrent group's: its states); empty: every layer in the full pool (a model
    /// without recurrent layers).
    pub group_blocks: Vec<usize>,
}

impl KvPools {
    /// One pool of `num_blocks` blocks for every layer.
    pub fn one(num_blocks: usize) -> Self {
        Self {
            num_blocks,
            group_blocks: Vec::new(),
        }
    }

    /// [`KvPools::one`] for a model without recurrent layers; for one with them, the same
    /// blocks for every attention layer and `num_states` states for its recurrent layers
    /// (which cannot live in a paged pool).
    pub fn one_with_states(config: &ModelConfig, num_blocks: usize, num_states: usize) -> Self {
        let groups = cache_groups(config);
        if !groups.iter().any(|g| g.kind == CacheKind::Recurrent) {
            return Self::one(num_blocks);
        }
        Self {
            num_blocks,
            group_blocks: groups
                .iter()
                .map(|g| match g.kind {
                    CacheKind::Recurrent => num_states,
                    _ => num_blocks,
                })
                .collect(),
        }
    }
}

/// What a group of layers keeps for a sequence beside the full-attention layers' paged K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKind {
    /// Paged K/V of the keys in a window of this many tokens.
    SlidingWindow(usize),
    /// One fixed-size state a sequence (the hybrids' Gated DeltaNet layers): the group's
    /// "blocks" are its states.
    Recurrent,
}

/// Layers that may keep their cache in a pool of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheGroup {
    pub kind: CacheKind,
    /// Its layers, ascending.
    pub layers: Vec<usize>,
}

/// The groups beside the full-attention layers that `config`'s layer plans declare: its
/// recurrent layers, and its sliding-window layers, one group a window, in the order of their
/// first layers. A model whose every attention layer is windowed declares no window group
/// (its full pool is the window layers' pool).
pub fn cache_groups(config: &ModelConfig) -> Vec<CacheGroup> {
    let mut groups: Vec<CacheGroup> = Vec::new();
    let mut full = false;
    for layer in 0..config.num_layers {
        let Some(kind) = config.layer_plan(layer).cache_kind() else {
            full = true;
            continue;
        };
        match groups.iter_mut().find(|g| g.kind == kind) {
            Some(g) => g.layers.push(layer),
            None => groups.push(CacheGroup {
                kind,
                layers: vec![layer],
            }),
        }
    }
    if !full {
        groups.retain(|g| g.kind == CacheKind::Recurrent);
    }
    groups
}

/// What the running sequences may need of a window pool at once: at most `max_seqs` of them,
/// computing at most `max_batched_tokens` tokens a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowDemand {
    pub max_seqs: usize,
    pub max_batched_tokens: usize,
}

impl WindowDemand {
    /// Blocks of `block_size` tokens that the windows of `window` tokens need at most: each
    /// sequence's window and a partial block at each end, and the step's new tokens.
    pub fn blocks(&self, window: usize, block_size: usize) -> usize {
        (self.max_seqs * (window - 1) + self.max_batched_tokens).div_ceil(block_size)
            + 2 * self.max_seqs
    }
}

pub struct KvCache {
    layers: Layers,
    /// The DeltaNet layers' states, by their index among them (`Layer::delta_net`).
    states: Vec<StateLayer>,
    layout: KvLayout,
    /// Each group's own pool (empty: every layer in the full pool), in [`cache_groups`] order.
    groups: Vec<(CacheKind, KvLayout)>,
    /// Per layer, the group whose pool holds it; `None`: the full pool.
    layer_group: Vec<Option<usize>>,
    dtype: KvDtype,
}

impl KvCache {
    /// `dtype` is f32 or f16 (f16 halves the bytes that attention reads at every decode
    /// step), bf16 on a GPU (the CPU attention kernel does not read it), or q8_0 on the CPU
    /// for a head dimension that is a multiple of 32.
    pub fn new(
        config: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
        device: &Device,
    ) -> Result<Self> {
        Self::with_pools(config, KvPools::one(num_blocks), block_size, dtype, device)
    }

    /// [`KvCache::new`] with a pool of its own for each group of [`cache_groups`] when `pools`
    /// has them (host caches only: the CUDA forward has no sliding-window attention).
    pub fn with_pools(
        config: &ModelConfig,
        pools: KvPools,
        block_size: usize,
        dtype: KvDtype,
        device: &Device,
    ) -> Result<Self> {
        let num_blocks = pools.num_blocks;
        match dtype {
            KvDtype::Bf16 if device.is_cpu() => {
                return Err(ModelError::KvCache(
                    "a bf16 KV cache needs a GPU: the CPU attention kernel reads f32, f16 or q8_0"
                        .into(),
                ))
            }
            KvDtype::Q8_0 if !device.is_cpu() => {
                return Err(ModelError::KvCache(
                    "a q8_0 KV cache is read by the CPU attention kernel only: use f16 or bf16 on a GPU"
                        .into(),
                ))
            }
            KvDtype::Q8_0 if !config.head_dim.is_multiple_of(Q8_GROUP) => {
                return Err(ModelError::KvCache(format!(
                    "a q8_0 KV cache needs a head dimension that is a multiple of {Q8_GROUP} (this model's is {})",
                    config.head_dim
                )))
            }
            _ => {}
        }
        if num_blocks == 0 || block_size == 0 {
            return Err(ModelError::KvCache(format!(
                "a KV cache needs at least one block of at least one token (got {num_blocks} x {block_size})"
            )));
        }
        let layout = KvLayout {
            num_blocks,
            block_size,
            num_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
        };
        let mut layer_group = vec![None; config.num_layers];
        let mut groups = Vec::new();
        let declared = cache_groups(config);
        if pools.group_blocks.is_empty() && declared.iter().any(|g| g.kind == CacheKind::Recurrent)
        {
            return Err(ModelError::KvCache(
                "a model with Gated DeltaNet layers needs a pool of states beside its KV blocks"
                    .into(),
            ));
        }
        if !pools.group_blocks.is_empty() {
            if declared.len() != pools.group_blocks.len() {
                return Err(ModelError::KvCache(format!(
                    "pools for {} layer groups; the model has {} beside its full-attention layers",
                    pools.group_blocks.len(),
                    declared.len()
                )));
            }
            if !device.is_cpu() {
                return Err(ModelError::KvCache(
                    "a layer group's pool (sliding-window K/V, recurrent states) is read by the CPU forward only"
                        .into(),
                ));
            }
            for (g, (group, &blocks)) in declared.iter().zip(&pools.group_blocks).enumerate() {
                if blocks == 0 {
                    return Err(ModelError::KvCache(
                        "a layer group's pool needs at least one block".into(),
                    ));
                }
                for &layer in &group.layers {
                    layer_group[layer] = Some(g);
                }
                let group_layout = KvLayout {
                    num_blocks: blocks,
                    ..layout
                };
                groups.push((group.kind, group_layout));
            }
        }
        let paged = groups
            .iter()
            .filter(|(kind, _)| *kind != CacheKind::Recurrent);
        for l in std::iter::once(&layout).chain(paged.map(|(_, l)| l)) {
            if l.values_per_layer() > u32::MAX as usize {
                return Err(ModelError::KvCache(format!(
                    "{} blocks of {block_size} tokens exceed the 2^32 values per layer a cache can address",
                    l.num_blocks
                )));
            }
        }
        let layout_of = |i: usize| match layer_group[i] {
            Some(g) => &groups[g].1,
            None => &layout,
        };
        // A DeltaNet layer keeps no K/V.
        let values = |i: usize| {
            if config.is_recurrent(i) {
                0
            } else {
                layout_of(i).values_per_layer()
            }
        };
        let states = match (
            &config.delta_net,
            groups.iter().find(|(k, _)| *k == CacheKind::Recurrent),
        ) {
            (Some(dn), Some((_, l))) => {
                let shape = dn.shape();
                (0..dn.layers().len())
                    .map(|_| StateLayer {
                        conv: vec![0.0; l.num_blocks * shape.conv_state_len()],
                        ssm: vec![0.0; l.num_blocks * dn.v_heads * shape.head_state_len()],
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        let num_layers = config.num_layers;
        let layers = match (dtype, device.is_cpu()) {
            (KvDtype::F32, true) => Layers::F32(
                (0..num_layers)
                    .map(|i| HostLayer {
                        k: vec![0.0; values(i)],
                        v: vec![0.0; values(i)],
                    })
                    .collect(),
            ),
            (KvDtype::F16, true) => Layers::F16(
                (0..num_layers)
                    .map(|i| HostLayer {
                        k: f16_zeros(values(i)),
                        v: f16_zeros(values(i)),
                    })
                    .collect(),
            ),
            (KvDtype::Q8_0, _) => Layers::Q8(
                (0..num_layers)
                    .map(|i| {
                        let (n, l) = (values(i), layout_of(i));
                        let scales = Q8Cache::scales_per_layer(l);
                        Q8Layer {
                            k: vec![0; n],
                            k_scales: vec![0.0; scales],
                            v: vec![0; n],
                            v_scales: vec![0.0; scales],
                        }
                    })
                    .collect(),
            ),
            (float, _) => {
                let dtype = float.float().expect("q8_0 is matched above");
                let n = layout.values_per_layer();
                Layers::Device(
                    (0..num_layers)
                        .map(|_| {
                            let kv = Tensor::zeros(2 * n, dtype, device)?;
                            Ok(DeviceLayer {
                                k: kv.narrow(0, 0, n)?,
                                v: kv.narrow(0, n, n)?,
                                kv,
                            })
                        })
                        .collect::<Result<Vec<_>>>()?,
                )
            }
        };
        Ok(Self {
            layers,
            states,
            layout,
            groups,
            layer_group,
            dtype,
        })
    }

    /// The states of the `index`-th DeltaNet layer, for the CPU forward.
    pub(crate) fn delta_net_states(
        &mut self,
        index: usize,
    ) -> Option<sluice_kernels::cpu::delta_net::DeltaNetStates<'_>> {
        self.states
            .get_mut(index)
            .map(|l| sluice_kernels::cpu::delta_net::DeltaNetStates {
                conv: &mut l.conv,
                ssm: &mut l.ssm,
            })
    }

    /// A step's empty tables for each group with a pool of its own, in order: what
    /// [`crate::StepBatch::groups`] starts from.
    pub fn step_groups(&self) -> Vec<crate::batch::GroupTables> {
        self.groups
            .iter()
            .map(|(kind, _)| match kind {
                CacheKind::Recurrent => crate::batch::GroupTables::recurrent(),
                CacheKind::SlidingWindow(_) => crate::batch::GroupTables::paged(),
            })
            .collect()
    }

    /// The index of the recurrent group among [`Self::groups`], if the cache has one.
    pub fn recurrent_group(&self) -> Option<usize> {
        self.groups
            .iter()
            .position(|(kind, _)| *kind == CacheKind::Recurrent)
    }

    /// States in the recurrent group (0 for a model without).
    pub fn num_states(&self) -> usize {
        self.groups
            .iter()
            .find(|(k, _)| *k == CacheKind::Recurrent)
            .map_or(0, |(_, l)| l.num_blocks)
    }

    /// How to split `budget_bytes` between the pools: for a model with full-attention layers
    /// and further groups ([`cache_groups`]), each group's pool gets what `demand` can use at
    /// most ([`WindowDemand::blocks`]) and the full pool the rest, when that leaves the full
    /// pool at least as many blocks as the largest group's; otherwise (or for a model without
    /// groups) one pool for all.
    pub fn pools_for_budget(
        config: &ModelConfig,
        budget_bytes: usize,
        block_size: usize,
        dtype: KvDtype,
        demand: WindowDemand,
    ) -> KvPools {
        let groups = cache_groups(config);
        // The recurrent states first: one a sequence that can run and as many for prefix
        // checkpoints (the scheduler keeps those beyond its running sequences for them), in at
        // most half the budget (at least one: a budget too small for any KV block refuses the
        // model anyway).
        let (states, budget_bytes) = match &config.delta_net {
            Some(dn) if groups.iter().any(|g| g.kind == CacheKind::Recurrent) => {
                let state = dn.state_bytes().max(1);
                let states = (2 * demand.max_seqs).min(budget_bytes / 2 / state).max(1);
                (Some(states), budget_bytes.saturating_sub(states * state))
            }
            _ => (None, budget_bytes),
        };
        let one_pool = KvPools {
            num_blocks: Self::num_blocks_for_budget(config, budget_bytes, block_size, dtype),
            group_blocks: states.into_iter().collect(),
        };
        let windows: Vec<&CacheGroup> = groups
            .iter()
            .filter(|g| g.kind != CacheKind::Recurrent)
            .collect();
        let windowed: usize = windows.iter().map(|g| g.layers.len()).sum();
        let no_window = groups.iter().any(|g| g.kind == CacheKind::SlidingWindow(0));
        let attention_layers = config.num_attention_layers();
        if windows.is_empty() || windowed == attention_layers || no_window || states.is_some() {
            // A model with recurrent layers and sliding windows: no family has both.
            return one_pool;
        }
        // Bytes of one block in one layer.
        let layer_block = dtype.bytes_per_token(config) * block_size / attention_layers;
        let group_blocks: Vec<usize> = windows
            .iter()
            .map(|g| match g.kind {
                CacheKind::SlidingWindow(window) => demand.blocks(window, block_size),
                CacheKind::Recurrent => unreachable!("filtered out above"),
            })
            .collect();
        let group_bytes: usize = windows
            .iter()
            .zip(&group_blocks)
            .map(|(g, &blocks)| blocks * g.layers.len() * layer_block)
            .sum();
        let full_layers = attention_layers - windowed;
        let num_blocks = budget_bytes.saturating_sub(group_bytes) / (full_layers * layer_block);
        if num_blocks < group_blocks.iter().copied().max().unwrap_or(0) {
            return one_pool;
        }
        KvPools {
            num_blocks,
            group_blocks,
        }
    }

    /// The pools' sizes.
    pub fn pools(&self) -> KvPools {
        KvPools {
            num_blocks: self.layout.num_blocks,
            group_blocks: self.groups.iter().map(|(_, l)| l.num_blocks).collect(),
        }
    }

    /// The groups with a pool of their own, in [`cache_groups`] order: what each keeps and
    /// its pool's layout. Empty when every layer lives in the full pool.
    pub fn groups(&self) -> &[(CacheKind, KvLayout)] {
        &self.groups
    }

    /// The group whose pool holds layer `layer` (and whose tables the step addresses it
    /// through, `StepBatch::tables`); `None`: the full pool.
    pub fn group_of_layer(&self, layer: usize) -> Option<usize> {
        self.layer_group[layer]
    }

    /// The layout of layer `layer`'s pool.
    pub fn layer_layout(&self, layer: usize) -> &KvLayout {
        match self.layer_group[layer] {
            Some(g) => &self.groups[g].1,
            None => &self.layout,
        }
    }

    /// Bytes of K and V the cache holds, every layer and pool, and of the recurrent states.
    pub fn bytes(&self, config: &ModelConfig) -> usize {
        let layer_token = self.dtype.bytes_per_token(config) / config.num_attention_layers();
        let kv: usize = (0..config.num_layers)
            .filter(|&i| !config.is_recurrent(i))
            .map(|i| self.layer_layout(i).num_slots() * layer_token)
            .sum();
        let states: usize = self
            .states
            .iter()
            .map(|l| 4 * (l.conv.len() + l.ssm.len()))
            .sum();
        kv + states
    }

    /// Blocks that fit in `budget_bytes` of K/V held as `dtype`.
    pub fn num_blocks_for_budget(
        config: &ModelConfig,
        budget_bytes: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> usize {
        budget_bytes / (dtype.bytes_per_token(config) * block_size)
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    pub fn num_blocks(&self) -> usize {
        self.layout.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.layout.block_size
    }

    pub fn num_slots(&self) -> usize {
        self.layout.num_slots()
    }

    /// `(k, v)` of one layer of a GPU cache, flat, in [`KvLayout`] order.
    pub fn layer(&self, layer: usize) -> Result<(&Tensor, &Tensor)> {
        let l = &self.device_layers()?[layer];
        Ok((&l.k, &l.v))
    }

    /// One layer's K then V as one flat tensor (`2 * values_per_layer`), what the CUDA
    /// kernels take.
    pub fn layer_kv(&self, layer: usize) -> Result<&Tensor> {
        Ok(&self.device_layers()?[layer].kv)
    }

    /// One layer of a host cache (`None` on a GPU).
    pub fn host_layer(&self, layer: usize) -> Option<HostKv<'_>> {
        Some(match &self.layers {
            Layers::F32(layers) => HostKv::F32 {
                k: &layers[layer].k,
                v: &layers[layer].v,
            },
            Layers::F16(layers) => HostKv::F16 {
                k: &layers[layer].k,
                v: &layers[layer].v,
            },
            Layers::Q8(layers) => {
                let l = &layers[layer];
                HostKv::Q8(Q8Cache {
                    k: &l.k,
                    k_scales: &l.k_scales,
                    v: &l.v,
                    v_scales: &l.v_scales,
                })
            }
            Layers::Device(_) => return None,
        })
    }

    fn device_layers(&self) -> Result<&[DeviceLayer]> {
        match &self.layers {
            Layers::Device(layers) => Ok(layers),
            _ => Err(ModelError::KvCache(
                "this KV cache is host memory, read by the CPU attention kernels".into(),
            )),
        }
    }

    /// Writes one layer's new keys and values, host rows `k, v: [T, num_kv_heads * head_dim]`,
    /// into the slots `slots` of a host cache (the CPU forward): in place, converted to the
    /// cache's type (an 8-bit cache quantizes them).
    pub fn write_rows(&mut self, layer: usize, k: &[f32], v: &[f32], slots: &[u32]) -> Result<()> {
        let l = *self.layer_layout(layer);
        match &mut self.layers {
            Layers::F32(layers) => {
                let h = &mut layers[layer];
                write_kv(&l, slots, k, v, &mut h.k, &mut h.v)?;
            }
            Layers::F16(layers) => {
                let h = &mut layers[layer];
                write_kv(&l, slots, k, v, &mut h.k, &mut h.v)?;
            }
            Layers::Q8(layers) => {
                let q = &mut layers[layer];
                let cache = Q8CacheMut {
                    k: &mut q.k,
                    k_scales: &mut q.k_scales,
                    v: &mut q.v,
                    v_scales: &mut q.v_scales,
                };
                write_q8(&l, slots, k, v, cache)?;
            }
            Layers::Device(_) => {
                return Err(ModelError::KvCache(
                    "a GPU cache is written by the CUDA forward".into(),
                ))
            }
        }
        Ok(())
    }
}

/// `n` f16 zeros made from zeroed u16 bits, which the allocator takes from the OS as zero
/// pages: a 1 GiB cache costs nothing at start, and its pages become resident as sequences
/// fill them (writing every f16 zero took about a second at startup).
fn f16_zeros(n: usize) -> Vec<f16> {
    use half::vec::HalfBitsVecExt;
    vec![0u16; n].reinterpret_into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Architecture, SlidingWindow};

    /// gpt-oss-20b's attention: 24 layers of 8 KV heads of 64, every other one a window of
    /// 128 keys.
    fn gpt_oss_20b_shape() -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Gemma3,
            hidden_size: 2880,
            intermediate_size: 2880,
            num_layers: 24,
            num_heads: 64,
            num_kv_heads: 8,
            head_dim: 64,
            vocab_size: 201_088,
            rms_norm_eps: 1e-5,
            rope_theta: 150_000.0,
            rope_scaling: None,
            max_position_embeddings: 131_072,
            tie_word_embeddings: false,
            pooling: None,
            moe: None,
            sliding_window: Some(SlidingWindow {
                window: 128,
                local: (0..24).map(|i| i % 2 == 0).collect(),
                local_rope_theta: 150_000.0,
            }),
            attention_scale: None,
            final_logit_softcap: None,
            layers_without_rope: Vec::new(),
            rotary_dim: None,
            delta_net: None,
        }
    }

    const DEMAND: WindowDemand = WindowDemand {
        max_seqs: 16,
        max_batched_tokens: 2048,
    };

    #[test]
    fn the_window_pool_gets_what_the_windows_need_and_the_full_pool_the_rest() {
        let config = gpt_oss_20b_shape();
        let budget = 4 << 30;
        let pools = KvCache::pools_for_budget(&config, budget, 16, KvDtype::F16, DEMAND);
        // (16 * 127 + 2048) / 16 + 2 * 16 blocks for the windows.
        assert_eq!(pools.group_blocks, vec![287]);
        // A block of 16 tokens in one layer: 2 (K, V) * 8 * 64 * 2 bytes * 16 = 32 KiB; the
        // full pool's 12 layers share the budget that the window pool's 12 leave.
        let layer_block = 32 << 10;
        assert_eq!(
            pools.num_blocks,
            (budget - 287 * 12 * layer_block) / (12 * layer_block)
        );
        // One pool for every layer holds about half as many tokens.
        let one = KvCache::num_blocks_for_budget(&config, budget, 16, KvDtype::F16);
        assert_eq!(one, budget / (24 * layer_block));
        assert!(
            pools.num_blocks > 2 * one - 300,
            "{} vs {one}",
            pools.num_blocks
        );
        let cache =
            KvCache::with_pools(&config, pools.clone(), 16, KvDtype::F16, &Device::Cpu).unwrap();
        assert!(cache.bytes(&config) <= budget);
        assert_eq!(cache.group_of_layer(0), Some(0));
        assert_eq!(cache.group_of_layer(1), None);
        assert_eq!(cache.layer_layout(0).num_blocks, 287);
        assert_eq!(cache.layer_layout(1).num_blocks, pools.num_blocks);
    }

    #[test]
    fn a_budget_too_small_for_the_windows_keeps_one_pool() {
        let config = gpt_oss_20b_shape();
        // 287 window blocks take 107 MiB; what is left would give the full pool fewer blocks.
        let pools = KvCache::pools_for_budget(&config, 200 << 20, 16, KvDtype::F16, DEMAND);
        assert_eq!(pools.group_blocks, Vec::<usize>::new());
        let plain = ModelConfig {
            sliding_window: None,
            ..config
        };
        let pools = KvCache::pools_for_budget(&plain, 4 << 30, 16, KvDtype::F16, DEMAND);
        assert_eq!(pools.group_blocks, Vec::<usize>::new());
    }

    #[test]
    fn a_window_pool_is_refused_where_it_cannot_work() {
        let config = gpt_oss_20b_shape();
        let pools = KvPools {
            num_blocks: 4,
            group_blocks: vec![0],
        };
        assert!(KvCache::with_pools(&config, pools, 16, KvDtype::F16, &Device::Cpu).is_err());
        let plain = ModelConfig {
            sliding_window: None,
            ..config
        };
        let pools = KvPools {
            num_blocks: 4,
            group_blocks: vec![4],
        };
        assert!(KvCache::with_pools(&plain, pools, 16, KvDtype::F16, &Device::Cpu).is_err());
    }
}
