//! The paged KV cache: per layer, K and V for `num_blocks * block_size` token slots. Which slots
//! a sequence owns is the block manager's business; the cache only stores and reads slots.
//!
//! Its layout is the kernels' ([`KvLayout`]): block-major, K dimension-major within a block.
//! An 8-bit cache ([`KvDtype::Q8_0`]) holds the same layout as int8 with a scale per 32 values
//! (`sluice_kernels::cpu::attention::Q8Cache`), on the CPU only.

use candle_core::{DType, Device, Tensor};
use sluice_kernels::cpu::attention::{write_q8, Q8Cache, Q8CacheMut, Q8_GROUP};

use crate::batch::StepBatch;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

pub use sluice_kernels::KvLayout;

/// Flat cache positions that a step's new K and V values go to, in the order of the
/// `[T, num_kv_heads, head_dim]` K/V tensors. Built once per step, shared by all layers.
pub struct WriteIndices {
    k: Tensor,
    v: Tensor,
}

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

/// One layer: K and V in one allocation (so a CUDA kernel writes both in one launch), and
/// each as a view of its half.
struct LayerKv {
    kv: Tensor,
    k: Tensor,
    v: Tensor,
}

/// One layer of an 8-bit cache, host memory (zero pages until written).
struct Q8Layer {
    k: Vec<i8>,
    k_scales: Vec<f32>,
    v: Vec<i8>,
    v_scales: Vec<f32>,
}

enum Layers {
    Float(Vec<LayerKv>),
    Q8(Vec<Q8Layer>),
}

pub struct KvCache {
    layers: Layers,
    layout: KvLayout,
    dtype: KvDtype,
    device: Device,
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
        let n = layout.values_per_layer();
        if n > u32::MAX as usize {
            return Err(ModelError::KvCache(format!(
                "{num_blocks} blocks of {block_size} tokens exceed the 2^32 values per layer a cache can address"
            )));
        }
        let layers = match dtype.float() {
            Some(float) => Layers::Float(
                (0..config.num_layers)
                    .map(|_| {
                        let kv = zeros(2 * n, float, device)?;
                        Ok(LayerKv {
                            k: kv.narrow(0, 0, n)?,
                            v: kv.narrow(0, n, n)?,
                            kv,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?,
            ),
            None => {
                let scales = Q8Cache::scales_per_layer(&layout);
                Layers::Q8(
                    (0..config.num_layers)
                        .map(|_| Q8Layer {
                            k: vec![0; n],
                            k_scales: vec![0.0; scales],
                            v: vec![0; n],
                            v_scales: vec![0.0; scales],
                        })
                        .collect(),
                )
            }
        };
        Ok(Self {
            layers,
            layout,
            dtype,
            device: device.clone(),
        })
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

    /// `(k, v)` of one layer of a float cache, flat, in [`KvLayout`] order.
    pub fn layer(&self, layer: usize) -> Result<(&Tensor, &Tensor)> {
        let l = &self.float_layers()?[layer];
        Ok((&l.k, &l.v))
    }

    /// One layer's K then V as one flat tensor (`2 * values_per_layer`), what the CUDA
    /// kernels take.
    pub fn layer_kv(&self, layer: usize) -> Result<&Tensor> {
        Ok(&self.float_layers()?[layer].kv)
    }

    /// One layer of an 8-bit cache (`None` for a float one).
    pub fn q8_layer(&self, layer: usize) -> Option<Q8Cache<'_>> {
        match &self.layers {
            Layers::Q8(layers) => {
                let l = &layers[layer];
                Some(Q8Cache {
                    k: &l.k,
                    k_scales: &l.k_scales,
                    v: &l.v,
                    v_scales: &l.v_scales,
                })
            }
            Layers::Float(_) => None,
        }
    }

    fn float_layers(&self) -> Result<&[LayerKv]> {
        match &self.layers {
            Layers::Float(layers) => Ok(layers),
            Layers::Q8(_) => Err(ModelError::KvCache(
                "a q8_0 KV cache is read only by the CPU attention kernel (attention backend cpu)"
                    .into(),
            )),
        }
    }

    pub fn write_indices(&self, batch: &StepBatch) -> Result<WriteIndices> {
        let l = &self.layout;
        // An 8-bit cache is written from the slots themselves ([`KvCache::write_rows`]).
        let n = match self.layers {
            Layers::Float(_) => batch.num_tokens() * l.num_kv_heads * l.head_dim,
            Layers::Q8(_) => 0,
        };
        let (mut k, mut v) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for &slot in batch
            .slot_mapping
            .iter()
            .take(if n == 0 { 0 } else { usize::MAX })
        {
            for h in 0..l.num_kv_heads {
                for d in 0..l.head_dim {
                    k.push(l.k_offset(slot as usize, h, d) as u32);
                    v.push(l.v_offset(slot as usize, h, d) as u32);
                }
            }
        }
        Ok(WriteIndices {
            k: Tensor::from_vec(k, n, &self.device)?,
            v: Tensor::from_vec(v, n, &self.device)?,
        })
    }

    /// Writes `k, v: [T, num_kv_heads, head_dim]` of one layer into the step's slots.
    pub fn write(&mut self, layer: usize, k: &Tensor, v: &Tensor, at: &WriteIndices) -> Result<()> {
        let LayerKv { k: kc, v: vc, .. } = &self.float_layers()?[layer];
        let dtype = kc.dtype();
        kc.scatter_set(&at.k, &k.flatten_all()?.to_dtype(dtype)?, 0)?;
        vc.scatter_set(&at.v, &v.flatten_all()?.to_dtype(dtype)?, 0)?;
        Ok(())
    }

    /// [`KvCache::write`] from host rows `k, v: [T, num_kv_heads * head_dim]` into the slots
    /// `slots` (the CPU forward): an 8-bit cache quantizes them in place.
    pub fn write_rows(
        &mut self,
        layer: usize,
        k: &[f32],
        v: &[f32],
        slots: &[u32],
        at: &WriteIndices,
    ) -> Result<()> {
        let layout = self.layout;
        match &mut self.layers {
            Layers::Q8(layers) => {
                let l = &mut layers[layer];
                let cache = Q8CacheMut {
                    k: &mut l.k,
                    k_scales: &mut l.k_scales,
                    v: &mut l.v,
                    v_scales: &mut l.v_scales,
                };
                Ok(write_q8(&layout, slots, k, v, cache)?)
            }
            Layers::Float(_) => {
                let (t, width) = (slots.len(), layout.num_kv_heads * layout.head_dim);
                let k = Tensor::from_slice(k, (t, width), &self.device)?;
                let v = Tensor::from_slice(v, (t, width), &self.device)?;
                self.write(layer, &k, &v, at)
            }
        }
    }
}

/// `n` zeros of `dtype` on `device`. On the CPU an f16 cache is made from zeroed u16 bits, which
/// the allocator takes from the OS as zero pages: a 1 GiB cache costs nothing at start, and
/// its pages become resident as sequences fill them (candle writes every f16 zero, which took
/// about a second at startup).
fn zeros(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    if dtype == DType::F16 && device.is_cpu() {
        use half::vec::HalfBitsVecExt;
        let bits: Vec<half::f16> = vec![0u16; n].reinterpret_into();
        return Ok(Tensor::from_vec(bits, n, device)?);
    }
    Ok(Tensor::zeros(n, dtype, device)?)
}
