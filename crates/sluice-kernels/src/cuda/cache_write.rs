//! The step's K and V into one layer of the paged cache, through `slot_mapping`: one launch
//! (`write_kv_*` in `cache_write.cu`) writes both, for every token of the step.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CpuStorage, CudaStorage, InplaceOp3, Layout, Result, Storage, Tensor};

use super::launch::{config, require, suffix, Module, View, ViewMut};
use crate::cuda_plan::{LaunchDims, WRITE_KV_THREADS};
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
        let slots = View::new(slots_storage, slots_l)?;
        if !matches!(slots, View::U32(_)) {
            candle_core::bail!("write_kv: slot_mapping must be u32");
        }
        let l = self.layout;
        let t = self.slot_mapping.elem_count();
        let (k_view, v_view) = (View::new(k, k_l)?, View::new(v, v_l)?);
        let width = l.num_kv_heads * l.head_dim;
        let last_row = |stride: usize| t.saturating_sub(1) * stride + width;
        require("write_kv k", k_view.len(), last_row(self.k_row_stride))?;
        require("write_kv v", v_view.len(), last_row(self.v_row_stride))?;
        require("write_kv slot_mapping", slots.len(), t)?;
        let name = format!("write_kv_{}_{}", suffix(k.dtype())?, suffix(cache.dtype())?);
        if k.dtype() != v.dtype() {
            candle_core::bail!("write_kv: k is {:?} and v {:?}", k.dtype(), v.dtype());
        }
        let dev = cache.device().clone();
        let func = Module::CacheWrite.function(&dev, &name)?;
        let mut cache_view = ViewMut::new(cache, cache_l)?;
        require("write_kv cache", cache_view.len(), 2 * l.values_per_layer())?;
        let args = (
            self.k_row_stride as i64,
            self.v_row_stride as i64,
            l.values_per_layer() as i64,
            l.num_kv_heads as i32,
            l.head_dim as i32,
            l.block_size as i32,
        );
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        k_view.push(&mut b);
        v_view.push(&mut b);
        b.arg(&args.0);
        b.arg(&args.1);
        cache_view.push(&mut b);
        b.arg(&args.2);
        slots.push(&mut b);
        b.arg(&args.3);
        b.arg(&args.4);
        b.arg(&args.5);
        let dims = LaunchDims {
            grid: (t as u32, 1, 1),
            block: (WRITE_KV_THREADS, 1, 1),
            dynamic_shared_bytes: 0,
        };
        if t == 0 {
            return Ok(());
        }
        // SAFETY: the arguments are those of `write_kv` in cache_write.cu, in order and of its
        // types (pointers of the element types the kernel name says; i64 for `long`, i32 for
        // `int`). Token rows stay inside k and v (checked above against the strides), and every
        // slot is below the cache's slots (sluice-model validates slot_mapping against the
        // cache before a step), so the writes stay inside the layer's K and V.
        unsafe { b.launch(config(dims)) }.w()?;
        Ok(())
    }
}
