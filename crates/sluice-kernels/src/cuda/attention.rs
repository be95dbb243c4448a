//! Varlen paged attention for a whole step on the GPU: `paged_attention_*` in
//! `paged_attention.cu`, with the split-K variant and its merge when the plan splits keys.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, Device, Layout, Result, Shape, Tensor};

use super::launch::{alloc_output, config, cuda_storage, require, Module, View};
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
        let md = cuda_storage(&md_guard, "the step's attention metadata")?;
        let md_slice = md.as_cuda_slice::<u32>()?;
        let at = md_l.start_offset();
        require(
            "attention metadata",
            md_slice.len() - at,
            plan.metadata.len(),
        )?;
        let o = plan.offsets;
        let (tiles, seqs) = (
            md_slice.slice(at + o.tiles..),
            md_slice.slice(at + o.seqs..),
        );
        let tables = md_slice.slice(at + o.block_tables..);
        let token_splits = md_slice.slice(at + o.token_splits..);

        let q_view = View::new(q, q_l)?;
        let kv_view = View::new(kv, kv_l)?;
        require(
            "attention q",
            q_view.len(),
            t.saturating_sub(1) * self.q_token_stride + h * d,
        )?;
        require(
            "attention cache",
            kv_view.len(),
            2 * self.layout.values_per_layer(),
        )?;
        let out = alloc_output(&dev, q.dtype(), t * h * d)?;
        if t == 0 {
            return Ok((out, Shape::from((0, h * d))));
        }
        self.launch(
            &dev,
            q_view,
            kv_view,
            &out,
            [tiles, seqs, tables, token_splits],
        )?;
        Ok((out, Shape::from((t, h * d))))
    }
}

impl Attention<'_> {
    /// The attention launch (two with split-K) writing every row of `out`.
    fn launch(
        &self,
        dev: &candle_core::cuda_backend::CudaDevice,
        q_view: View<'_>,
        kv_view: View<'_>,
        out: &CudaStorage,
        [tiles, seqs, tables, token_splits]: [CudaView<'_, u32>; 4],
    ) -> Result<()> {
        let plan = &self.step.plan;
        let (t, h, d) = (plan.num_tokens, plan.num_heads, plan.head_dim);
        let (q_type, cache_type) = match (&q_view, &kv_view) {
            (View::F32(_), View::F16(_)) => ("f32", "f16"),
            (View::F32(_), View::BF16(_)) => ("f32", "bf16"),
            (View::F32(_), View::F32(_)) => ("f32", "f32"),
            (View::F16(_), View::F16(_)) => ("f16", "f16"),
            (View::BF16(_), View::BF16(_)) => ("bf16", "bf16"),
            _ => candle_core::bail!("no paged attention kernel for these query and cache types"),
        };
        let out_view = View::new(out, &Layout::contiguous(t * h * d))?;
        let scalars = (
            self.q_token_stride as i64,
            self.layout.values_per_layer() as i64,
            h as i32,
            plan.num_kv_heads as i32,
            plan.block_size as i32,
            plan.scale_log2,
        );
        match (plan.split, plan.combine) {
            (None, _) => {
                let func = Module::PagedAttention
                    .function(dev, &format!("paged_attention_{q_type}_{cache_type}_d{d}"))?;
                let stream = dev.cuda_stream();
                let mut b = stream.launch_builder(&func);
                q_view.push(&mut b);
                b.arg(&scalars.0);
                kv_view.push(&mut b);
                b.arg(&scalars.1);
                out_view.push(&mut b);
                b.arg(&tiles);
                b.arg(&seqs);
                b.arg(&tables);
                b.arg(&scalars.2);
                b.arg(&scalars.3);
                b.arg(&scalars.4);
                b.arg(&scalars.5);
                // SAFETY: the arguments are `paged_attention_*`'s in paged_attention.cu, in
                // order and of its types (i64 for `long`, i32 for `int`). The plan's tiles
                // cover each (token, head) row of `out` exactly once; q rows and the cache were
                // checked above to hold what the metadata indexes (sequences tile the step, block
                // tables hold blocks below the cache's count: `AttentionPlan::new` and the
                // check in `paged_attention`).
                unsafe { b.launch(config(plan.attention)) }.w()?;
            }
            (Some(split), Some(combine)) => {
                let (acc_n, ml_n) = plan.workspace_floats();
                // SAFETY: the split kernel writes every (row, split) partial that the combine
                // reads: splits below each tile's count, for every row of the tile.
                let (partial_acc, partial_ml) =
                    unsafe { (dev.alloc::<f32>(acc_n)?, dev.alloc::<f32>(ml_n)?) };
                let split_args = (split.partition_keys as i32, split.max_splits as i32);
                let func = Module::PagedAttention.function(
                    dev,
                    &format!("paged_attention_split_{q_type}_{cache_type}_d{d}"),
                )?;
                let stream = dev.cuda_stream();
                let mut b = stream.launch_builder(&func);
                q_view.push(&mut b);
                b.arg(&scalars.0);
                kv_view.push(&mut b);
                b.arg(&scalars.1);
                b.arg(&tiles);
                b.arg(&seqs);
                b.arg(&tables);
                b.arg(&scalars.2);
                b.arg(&scalars.3);
                b.arg(&scalars.4);
                b.arg(&scalars.5);
                b.arg(&split_args.0);
                b.arg(&split_args.1);
                b.arg(&partial_acc);
                b.arg(&partial_ml);
                // SAFETY: as for the unsplit kernel; partials are indexed by (token, head,
                // split) below `workspace_floats`, which sized them.
                unsafe { b.launch(config(plan.attention)) }.w()?;

                let combine_args = (h as i32, d as i32, split.max_splits as i32);
                let func =
                    Module::PagedAttention.function(dev, &format!("attention_combine_{q_type}"))?;
                let stream = dev.cuda_stream();
                let mut b = stream.launch_builder(&func);
                b.arg(&partial_acc);
                b.arg(&partial_ml);
                b.arg(&token_splits);
                out_view.push(&mut b);
                b.arg(&combine_args.0);
                b.arg(&combine_args.1);
                b.arg(&combine_args.2);
                // SAFETY: `attention_combine_*`'s arguments in order; one block per (token,
                // head) row of `out` (the combine grid is `T * H`), reading the `token_splits`
                // partials of its row that the split kernel wrote.
                unsafe { b.launch(config(combine)) }.w()?;
            }
            (Some(_), None) => candle_core::bail!("a split-K plan without its combine launch"),
        }
        Ok(())
    }
}
