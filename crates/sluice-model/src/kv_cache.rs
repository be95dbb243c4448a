//! The paged KV cache: per layer, K and V for `num_blocks * block_size` token slots. Which slots
//! a sequence owns is the block manager's business; the cache only stores and reads slots.
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

pub struct KvCache {
    layers: Layers,
    layout: KvLayout,
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
        let num_layers = config.num_layers;
        let layers = match (dtype, device.is_cpu()) {
            (KvDtype::F32, true) => Layers::F32(
                (0..num_layers)
                    .map(|_| HostLayer {
                        k: vec![0.0; n],
                        v: vec![0.0; n],
                    })
                    .collect(),
            ),
            (KvDtype::F16, true) => Layers::F16(
                (0..num_layers)
                    .map(|_| HostLayer {
                        k: f16_zeros(n),
                        v: f16_zeros(n),
                    })
                    .collect(),
            ),
            (KvDtype::Q8_0, _) => {
                let scales = Q8Cache::scales_per_layer(&layout);
                Layers::Q8(
                    (0..num_layers)
                        .map(|_| Q8Layer {
                            k: vec![0; n],
                            k_scales: vec![0.0; scales],
                            v: vec![0; n],
                            v_scales: vec![0.0; scales],
                        })
                        .collect(),
                )
            }
            (float, _) => {
                let dtype = float.float().expect("q8_0 is matched above");
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
            layout,
            dtype,
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
        let l = self.layout;
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
