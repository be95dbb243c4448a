//! The step's K and V into one layer of the paged cache, through `slot_mapping`: one launch
//! (`write_kv_*` in `cache_write.cu`) writes both, for every token of the step.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, InplaceOp3, Layout, Result, Storage, Tensor};

use super::launch::View;
use crate::paged::KvLayout;

/// Writes `k` and `v`, each `[T, num_kv_heads * head_dim]` rows (row strides may be wider:
/// views of a fused QKV or RoPE output), into `kv_layer`: one layer's K then V (V at
/// `layout.values_per_layer()`), in [`KvLayout`] order, at the token slots of `slot_mapping`
/// (`[T]` u32 on the device).
pub fn write_kv(
    kv_layer: &Tensor,
    k: &Tensor,
    v: &Tensor,
    slot_mapping: &Tensor,
    layout: &KvLayout,
) -> Result<()> {
    let t = slot_mapping.dims1()?;
    let width = layout.num_kv_heads * layout.head_dim;
    for (what, x) in [("k", k), ("v", v)] {
        let (rows, cols) = x.dims2()?;
        if rows != t || cols != width || x.stride()[1] != 1 {
            candle_core::bail!(
                "write_kv: {what} {:?} (strides {:?}) is not {t} rows of {width} contiguous values",
                x.dims(),
                x.stride()
            );
        }
    }
    if kv_layer.elem_count() != 2 * layout.values_per_layer() || !kv_layer.is_contiguous() {
        candle_core::bail!("write_kv: the layer tensor is not one layer's K and V");
    }
    let op = WriteKv {
        slot_mapping: slot_mapping.clone(),
        layout: *layout,
        k_row_stride: k.stride()[0],
        v_row_stride: v.stride()[0],
    };
    kv_layer.inplace_op3(k, v, &op)
}

struct WriteKv {
    slot_mapping: Tensor,
    layout: KvLayout,
    k_row_stride: usize,
    v_row_stride: usize,
}

impl InplaceOp3 for WriteKv {
    fn name(&self) -> &'static str {
        "sluice-write-kv"
    }

    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<()> {
        candle_core::bail!("write_kv runs on CUDA tensors; the CPU cache is host memory, written by KvCache::write_rows")
    }

    fn cuda_fwd(
        &self,
        cache: &mut CudaStorage,
        cache_l: &Layout,
        k: &CudaStorage,
        k_l: &Layout,
        v: &CudaStorage,
        v_l: &Layout,
    ) -> Result<()> {
        let (slots_storage, slots_l) = self.slot_mapping.storage_and_layout();
        let Storage::Cuda(slots_storage) = &*slots_storage else {
            candle_core::bail!("write_kv: slot_mapping is not on the GPU");
        };
        let dev = cache.device().clone();
        let t = self.slot_mapping.elem_count();
        super::direct::write_kv_into(
            &dev,
            &View::new(cache, cache_l)?,
            (&View::new(k, k_l)?, self.k_row_stride),
            (&View::new(v, v_l)?, self.v_row_stride),
            &View::new(slots_storage, slots_l)?,
            t,
            &self.layout,
        )
    }
}
