//! Varlen paged attention for a whole step on the GPU: `paged_attention_*` in
//! `paged_attention.cu`, with the split-K variant and its merge when the plan splits keys.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, Device, Layout, Result, Shape, Tensor};

use super::launch::{alloc_output, cuda_storage, View};
use crate::cuda_plan::AttentionPlan;
use crate::paged::KvLayout;

/// A step's [`AttentionPlan`] with its metadata on the device: uploaded once per step (one
/// copy), read by every layer's attention launch.
pub struct StepMetadata {
    plan: AttentionPlan,
    buffer: Tensor,
}

impl StepMetadata {
    pub fn upload(plan: AttentionPlan, device: &Device) -> Result<Self> {
        let buffer = Tensor::from_slice(&plan.metadata, plan.metadata.len(), device)?;
        Ok(Self { plan, buffer })
    }

    pub fn plan(&self) -> &AttentionPlan {
        &self.plan
    }
}

/// Attention of the step's queries over one layer of the cache. `q` holds `[T, num_heads *
/// head_dim]` rows (its row stride may be wider: a view of the RoPE output, whose rows hold Q
/// then K); `kv_layer` is the layer's K then V in [`KvLayout`] order. Returns `[T, num_heads *
/// head_dim]` of `q`'s dtype.
pub fn paged_attention(
    q: &Tensor,
    kv_layer: &Tensor,
    layout: &KvLayout,
    step: &StepMetadata,
) -> Result<Tensor> {
    let plan = &step.plan;
    let (t, width) = q.dims2()?;
    if t != plan.num_tokens || width != plan.num_heads * plan.head_dim || q.stride()[1] != 1 {
        candle_core::bail!(
            "paged_attention: q {:?} (strides {:?}) does not fit the plan's {} tokens of {} heads of {}",
            q.dims(),
            q.stride(),
            plan.num_tokens,
            plan.num_heads,
            plan.head_dim
        );
    }
    let fits_cache = layout.head_dim == plan.head_dim
        && layout.num_kv_heads == plan.num_kv_heads
        && layout.block_size == plan.block_size
        && (plan.max_block() as usize) < layout.num_blocks;
    if !fits_cache
        || kv_layer.elem_count() != 2 * layout.values_per_layer()
        || !kv_layer.is_contiguous()
    {
        candle_core::bail!("paged_attention: the plan does not fit a cache of {layout:?}");
    }
    let op = Attention {
        step,
        layout: *layout,
        q_token_stride: q.stride()[0],
    };
    q.apply_op2_no_bwd(kv_layer, &op)
}

struct Attention<'a> {
    step: &'a StepMetadata,
    layout: KvLayout,
    q_token_stride: usize,
}

impl CustomOp2 for Attention<'_> {
    fn name(&self) -> &'static str {
        "sluice-paged-attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("sluice's CUDA paged attention runs on CUDA tensors")
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        q_l: &Layout,
        kv: &CudaStorage,
        kv_l: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let plan = &self.step.plan;
        let (t, h, d) = (plan.num_tokens, plan.num_heads, plan.head_dim);
        let dev = q.device().clone();
        let (md_guard, md_l) = self.step.buffer.storage_and_layout();
        let metadata = View::new(
            cuda_storage(&md_guard, "the step's attention metadata")?,
            md_l,
        )?;
        let out = alloc_output(&dev, q.dtype(), t * h * d)?;
        let (acc_n, ml_n) = plan.workspace_floats();
        let partials = |n: usize| -> Result<CudaStorage> {
            // SAFETY: the split kernel writes every (row, split) partial that the combine
            // reads (splits below each tile's count, for every row of the tile) before it
            // reads them; nothing else reads this buffer.
            let slice = unsafe { dev.alloc::<f32>(n) }?;
            Ok(CudaStorage {
                slice: CudaStorageSlice::F32(slice),
                device: dev.clone(),
            })
        };
        let workspace = match plan.split {
            Some(_) => Some((partials(acc_n)?, partials(ml_n)?)),
            None => None,
        };
        let workspace_views = match &workspace {
            Some((acc, ml)) => Some((
                View::new(acc, &Layout::contiguous(acc_n))?,
                View::new(ml, &Layout::contiguous(ml_n))?,
            )),
            None => None,
        };
        super::direct::paged_attention_into(
            &dev,
            plan,
            &metadata,
            (&View::new(q, q_l)?, self.q_token_stride),
            &View::new(kv, kv_l)?,
            &self.layout,
            &View::new(&out, &Layout::contiguous(t * h * d))?,
            workspace_views.as_ref().map(|(a, m)| (a, m)),
        )?;
        Ok((out, Shape::from((t, h * d))))
    }
}
