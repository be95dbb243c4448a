//! The paged KV cache: per layer, K and V for `num_blocks * block_size` token slots. Which slots
//! a sequence owns is the block manager's business; the cache only stores and reads slots.
//!
//! Its layout is the kernels' ([`KvLayout`]): block-major, K dimension-major within a block.

use candle_core::{DType, Device, Tensor};

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

/// One layer: K and V in one allocation (so a CUDA kernel writes both in one launch), and
/// each as a view of its half.
struct LayerKv {
    kv: Tensor,
    k: Tensor,
    v: Tensor,
}

pub struct KvCache {
    layers: Vec<LayerKv>,
    layout: KvLayout,
    dtype: DType,
}

impl KvCache {
    /// `dtype` is F32 or F16: f16 halves the bytes that attention reads at every decode step.
    /// On a GPU it may also be BF16 (the CPU attention kernel does not read bf16).
    pub fn new(
        config: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let bf16_on_gpu = dtype == DType::BF16 && !device.is_cpu();
        if !matches!(dtype, DType::F32 | DType::F16) && !bf16_on_gpu {
            return Err(ModelError::KvCache(format!(
                "a KV cache holds f32 or f16 (or bf16 on a GPU), not {dtype:?}"
            )));
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
        let layers = (0..config.num_layers)
            .map(|_| {
                let kv = zeros(2 * n, dtype, device)?;
                Ok(LayerKv {
                    k: kv.narrow(0, 0, n)?,
                    v: kv.narrow(0, n, n)?,
                    kv,
                })
            })
            .collect::<Result<Vec<_>>>()?;
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
        dtype: DType,
    ) -> usize {
        budget_bytes / (config.kv_bytes_per_token(dtype.size_in_bytes()) * block_size)
    }

    pub fn dtype(&self) -> DType {
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

    /// `(k, v)` of one layer, flat, in [`KvLayout`] order.
    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let l = &self.layers[layer];
        (&l.k, &l.v)
    }

    /// One layer's K then V as one flat tensor (`2 * values_per_layer`), what the CUDA
    /// kernels take.
    pub fn layer_kv(&self, layer: usize) -> &Tensor {
        &self.layers[layer].kv
    }

    pub fn write_indices(&self, batch: &StepBatch) -> Result<WriteIndices> {
        let l = &self.layout;
        let n = batch.num_tokens() * l.num_kv_heads * l.head_dim;
        let (mut k, mut v) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for &slot in &batch.slot_mapping {
            for h in 0..l.num_kv_heads {
                for d in 0..l.head_dim {
                    k.push(l.k_offset(slot as usize, h, d) as u32);
                    v.push(l.v_offset(slot as usize, h, d) as u32);
                }
            }
        }
        let device = self.layers[0].kv.device();
        Ok(WriteIndices {
            k: Tensor::from_vec(k, n, device)?,
            v: Tensor::from_vec(v, n, device)?,
        })
    }

    /// Writes `k, v: [T, num_kv_heads, head_dim]` of one layer into the step's slots.
    pub fn write(&mut self, layer: usize, k: &Tensor, v: &Tensor, at: &WriteIndices) -> Result<()> {
        let LayerKv { k: kc, v: vc, .. } = &self.layers[layer];
        kc.scatter_set(&at.k, &k.flatten_all()?.to_dtype(self.dtype)?, 0)?;
        vc.scatter_set(&at.v, &v.flatten_all()?.to_dtype(self.dtype)?, 0)?;
        Ok(())
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
