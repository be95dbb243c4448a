//! The one door to the CPU paged-attention kernel (`sluice_kernels::cpu::attention`):
//! [`attend`] runs it over a step's sequences on a layer's host cache (f32, f16 or 8-bit), as
//! the CPU forward calls it; [`paged_attention`] does the same on candle tensors (borrowing
//! their CPU storage), for the tests that hold it to the reference.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor, WithDType};
use half::f16;
use sluice_kernels::cpu::attention;
use sluice_kernels::{AttentionShape, KvElem};

use crate::batch::StepBatch;
use crate::error::{ModelError, Result};
use crate::kv_cache::{HostKv, KvLayout};

/// Whether the kernel runs on this CPU for heads of `head_dim` in groups of `group`.
pub fn supports(head_dim: usize, group: usize) -> bool {
    attention::supports(head_dim, group)
}

fn cpu_storage<'a>(
    t: &'a Tensor,
    what: &'static str,
) -> Result<(candle_core::StorageRef<'a>, usize)> {
    let (storage, layout) = t.storage_and_layout();
    if !layout.is_contiguous() {
        return Err(ModelError::InvalidStep(format!(
            "{what} must be contiguous for the CPU attention kernel"
        )));
    }
    if !matches!(&*storage, Storage::Cpu(_)) {
        return Err(ModelError::NotOnCpu(what));
    }
    Ok((storage, layout.start_offset()))
}

/// `q: [T, num_heads, head_dim]` attending over one layer's `k_cache`/`v_cache` (f32 or f16,
/// in [`KvLayout`] order) into `[T, num_heads * head_dim]`, through the sequences' tables
/// `block_tables` (indexed by their slices in `batch`).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    layout: &KvLayout,
    batch: &StepBatch,
    block_tables: &[u32],
    shape: &AttentionShape,
    sinks: Option<&[f32]>,
) -> Result<Tensor> {
    let q = q.to_dtype(DType::F32)?.contiguous()?;
    let (h, kvh, d) = (shape.num_heads, layout.num_kv_heads, layout.head_dim);
    let t = batch.num_tokens();
    if q.dims() != [t, h, d] || batch.block_size != layout.block_size {
        return Err(ModelError::InvalidStep(format!(
            "q {:?} does not fit [{t}, {h}, {d}] over a cache of {kvh} KV heads and blocks of {}",
            q.dims(),
            layout.block_size
        )));
    }
    let (q_store, q_off) = cpu_storage(&q, "q")?;
    let (k_store, k_off) = cpu_storage(k_cache, "the K cache")?;
    let (v_store, v_off) = cpu_storage(v_cache, "the V cache")?;
    let (Storage::Cpu(qc), Storage::Cpu(kc), Storage::Cpu(vc)) = (&*q_store, &*k_store, &*v_store)
    else {
        unreachable!("checked by cpu_storage")
    };
    let q = &qc.as_slice::<f32>()?[q_off..][..t * h * d];
    let mut out = vec![0f32; t * h * d];
    let caches = Caches {
        k: kc,
        v: vc,
        k_offset: k_off,
        v_offset: v_off,
    };
    match k_cache.dtype() {
        DType::F32 => {
            caches.attend::<f32>(q, layout, batch, block_tables, shape, sinks, &mut out)?
        }
        DType::F16 => {
            caches.attend::<f16>(q, layout, batch, block_tables, shape, sinks, &mut out)?
        }
        other => {
            return Err(ModelError::KvCache(format!(
                "a KV cache of {other:?} is not supported"
            )))
        }
    }
    Ok(Tensor::from_vec(out, (t, h * d), &Device::Cpu)?)
}

/// One layer's K and V storage and where the layer starts in it.
struct Caches<'a> {
    k: &'a CpuStorage,
    v: &'a CpuStorage,
    k_offset: usize,
    v_offset: usize,
}

impl Caches<'_> {
    #[allow(clippy::too_many_arguments)]
    fn attend<E: KvElem + WithDType>(
        &self,
        q: &[f32],
        layout: &KvLayout,
        batch: &StepBatch,
        block_tables: &[u32],
        shape: &AttentionShape,
        sinks: Option<&[f32]>,
        out: &mut [f32],
    ) -> Result<()> {
        let k = &self.k.as_slice::<E>()?[self.k_offset..];
        let v = &self.v.as_slice::<E>()?[self.v_offset..];
        attend_slices(q, k, v, layout, batch, block_tables, shape, sinks, out)
    }
}

/// The kernel over f32 or f16 caches in [`KvLayout`] order.
#[allow(clippy::too_many_arguments)]
fn attend_slices<E: KvElem>(
    q: &[f32],
    k: &[E],
    v: &[E],
    layout: &KvLayout,
    batch: &StepBatch,
    block_tables: &[u32],
    shape: &AttentionShape,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    attention::paged_attention(
        q,
        k,
        v,
        layout,
        &batch.sequences,
        &batch.key_ends,
        block_tables,
        shape,
        sinks,
        out,
    )?;
    Ok(())
}

/// `q: [T, num_heads, head_dim]` (flat) attending over one layer's host cache into `out:
/// [T, num_heads * head_dim]`, through the sequences' tables into that layer's pool: the CPU
/// forward's attention.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    q: &[f32],
    cache: &HostKv<'_>,
    layout: &KvLayout,
    batch: &StepBatch,
    block_tables: &[u32],
    shape: &AttentionShape,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    match cache {
        HostKv::F32 { k, v } => {
            attend_slices(q, k, v, layout, batch, block_tables, shape, sinks, out)
        }
        HostKv::F16 { k, v } => {
            attend_slices(q, k, v, layout, batch, block_tables, shape, sinks, out)
        }
        HostKv::Q8(c) => {
            attention::paged_attention_q8(
                q,
                c,
                layout,
                &batch.sequences,
                &batch.key_ends,
                block_tables,
                shape,
                sinks,
                out,
            )?;
            Ok(())
        }
    }
}
