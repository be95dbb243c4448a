//! Launches into buffers the caller owns: the decode step that a CUDA graph captures once and
//! replays (`sluice-model`'s `cuda_graph.rs`) allocates nothing, so each kernel here writes a
//! given output instead of a new tensor, and the matmuls call cuBLAS on those buffers directly
//! (candle's matmul allocates its output). The kernels are the ones the tensor launchers run.
//!
//! Operands are [`View`]s: of a candle tensor's storage (weights, the KV cache) through
//! [`tensor_view`], or of a [`StepBuffer`]. An output is written through its view's pointer:
//! the stream orders that write after every earlier launch that reads the buffer and before
//! every later one, and nothing reads device memory off the stream.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::cublas::{result as cublas, sys as cublas_sys, CudaBlas};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, CudaStorageSlice, WrapErr};
use candle_core::{CudaStorage, DType, Layout, Result, Storage, Tensor};

use super::launch::{config, require, suffix, Module, View};
use crate::cuda_plan::{
    swiglu_dims, AttentionPlan, LaunchDims, NORM_THREADS, ROPE_THREADS, SWIGLU_THREADS,
    WRITE_KV_THREADS,
};
use crate::paged::KvLayout;

/// Runs `f` on a view of `t`'s device memory from its layout's start (`t` contiguous from
/// there: weights, norms, the KV cache, the RoPE tables).
pub fn tensor_view<R>(t: &Tensor, f: impl FnOnce(View<'_>) -> Result<R>) -> Result<R> {
    let (guard, layout) = t.storage_and_layout();
    let Storage::Cuda(storage) = &*guard else {
        candle_core::bail!("a tensor of a CUDA step is not on the GPU");
    };
    f(View::new(storage, layout)?)
}

/// A device buffer a step writes and reads in place, allocated once (zeroed: a padding row
/// reads finite values).
pub struct StepBuffer {
    storage: CudaStorage,
    len: usize,
}

impl StepBuffer {
    pub fn zeros(dev: &CudaDevice, dtype: DType, len: usize) -> Result<Self> {
        let n = len.max(1);
        let slice = match dtype {
            DType::F32 => CudaStorageSlice::F32(dev.alloc_zeros::<f32>(n)?),
            DType::F16 => CudaStorageSlice::F16(dev.alloc_zeros::<half::f16>(n)?),
            DType::BF16 => CudaStorageSlice::BF16(dev.alloc_zeros::<half::bf16>(n)?),
            DType::U32 => CudaStorageSlice::U32(dev.alloc_zeros::<u32>(n)?),
            other => candle_core::bail!("no step buffer of {other:?}"),
        };
        Ok(Self {
            storage: CudaStorage {
                slice,
                device: dev.clone(),
            },
            len,
        })
    }

    pub fn dtype(&self) -> DType {
        candle_core::backend::BackendStorage::dtype(&self.storage)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> usize {
        self.len * self.dtype().size_in_bytes()
    }

    /// The buffer from element `offset` on.
    pub fn at(&self, offset: usize) -> Result<View<'_>> {
        if offset > self.len {
            candle_core::bail!("offset {offset} past a step buffer of {}", self.len);
        }
        View::new(
            &self.storage,
            &Layout::contiguous_with_offset(self.len, offset),
        )
    }

    /// Copies `data` to the start of a u32 buffer: one host-to-device copy on the stream,
    /// ordered before the launches that read it.
    pub fn upload_u32(&mut self, data: &[u32]) -> Result<()> {
        if data.len() > self.len {
            candle_core::bail!("{} words for a step buffer of {}", data.len(), self.len);
        }
        let dev = self.storage.device.clone();
        let CudaStorageSlice::U32(slice) = &mut self.storage.slice else {
            candle_core::bail!("upload_u32 into a buffer of {:?}", self.dtype());
        };
        let mut prefix = slice.slice_mut(..data.len());
        dev.cuda_stream().memcpy_htod(data, &mut prefix).w()?;
        Ok(())
    }

    /// Copies the first `len` words of a u32 buffer into `host` (resized to `len`): the copy
    /// waits for every launch before it on the stream.
    pub fn download_u32(&self, len: usize, host: &mut Vec<u32>) -> Result<()> {
        if len > self.len {
            candle_core::bail!("{len} words from a step buffer of {}", self.len);
        }
        let CudaStorageSlice::U32(slice) = &self.storage.slice else {
            candle_core::bail!("download_u32 from a buffer of {:?}", self.dtype());
        };
        host.resize(len, 0);
        self.storage
            .device
            .cuda_stream()
            .memcpy_dtoh(&slice.slice(..len), host.as_mut_slice())
            .w()?;
        Ok(())
    }
}

/// `out[0] = x (+ delta)`, `out[1] = rms_norm(out[0]) * weight`: `out` holds `2 * rows *
/// hidden` values, the new residual stream then the normed rows.
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm_into(
    dev: &CudaDevice,
    x: &View<'_>,
    delta: Option<&View<'_>>,
    weight: &View<'_>,
    out: &View<'_>,
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<()> {
    require("add_rms_norm x", x.len(), rows * hidden)?;
    require("add_rms_norm weight", weight.len(), hidden)?;
    require("add_rms_norm out", out.len(), 2 * rows * hidden)?;
    if let Some(d) = delta {
        require("add_rms_norm delta", d.len(), rows * hidden)?;
    }
    same_dtype("add_rms_norm", &[x, weight, out])?;
    if rows == 0 {
        return Ok(());
    }
    let func = Module::Fused.function(dev, &format!("add_rms_norm_{}", x.suffix()?))?;
    let scalars = (i32::from(delta.is_some()), rows as i32, hidden as i32, eps);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    x.push(&mut b);
    delta.unwrap_or(x).push(&mut b);
    b.arg(&scalars.0);
    weight.push(&mut b);
    out.push(&mut b);
    b.arg(&scalars.1);
    b.arg(&scalars.2);
    b.arg(&scalars.3);
    let dims = LaunchDims::linear(rows, NORM_THREADS);
    // SAFETY: `add_rms_norm_*`'s arguments in order and of its types (one dtype, checked);
    // one block per row reads `hidden` values of x, delta and weight and writes its row of both
    // halves of `out` (sizes checked above). Without a delta the kernel never reads it.
    unsafe { b.launch(config(dims)) }.w()?;
    Ok(())
}

/// RoPE (and QK-norm) on the Q and K heads of `qkv` rows (`qkv_row_stride` apart) into `out:
/// [rows, (num_heads + num_kv_heads) * head_dim]`; as [`super::rope_qk`].
#[allow(clippy::too_many_arguments)]
pub fn rope_qk_into(
    dev: &CudaDevice,
    qkv: &View<'_>,
    qkv_row_stride: usize,
    (cos, sin): (&View<'_>, &View<'_>),
    max_positions: usize,
    positions: &View<'_>,
    qk_norm: Option<(&View<'_>, &View<'_>, f32)>,
    out: &View<'_>,
    rows: usize,
    (num_heads, num_kv_heads, head_dim): (usize, usize, usize),
) -> Result<()> {
    let (h, kvh, d) = (num_heads, num_kv_heads, head_dim);
    if !matches!(
        (cos, sin, positions),
        (View::F32(_), View::F32(_), View::U32(_))
    ) {
        candle_core::bail!("rope_qk: cos and sin must be f32 and positions u32");
    }
    require(
        "rope tables",
        cos.len().min(sin.len()),
        max_positions * d / 2,
    )?;
    require("positions", positions.len(), rows)?;
    require(
        "rope qkv",
        qkv.len(),
        rows.saturating_sub(1) * qkv_row_stride + (h + 2 * kvh) * d,
    )?;
    require("rope out", out.len(), rows * (h + kvh) * d)?;
    same_dtype("rope_qk", &[qkv, out])?;
    if let Some((q, k, _)) = qk_norm {
        same_dtype("rope_qk norm", &[qkv, q, k])?;
        require("qk norm weights", q.len().min(k.len()), d)?;
    }
    if rows == 0 {
        return Ok(());
    }
    let func = Module::Fused.function(dev, &format!("rope_qk_{}", qkv.suffix()?))?;
    let scalars = (
        qkv_row_stride as i64,
        i32::from(qk_norm.is_some()),
        qk_norm.map_or(0.0, |n| n.2),
        h as i32,
        kvh as i32,
        d as i32,
    );
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    qkv.push(&mut b);
    b.arg(&scalars.0);
    cos.push(&mut b);
    sin.push(&mut b);
    positions.push(&mut b);
    // Never read with has_qk_norm 0: the tables stand in.
    let (q_norm, k_norm) = qk_norm.map_or((cos, sin), |(q, k, _)| (q, k));
    q_norm.push(&mut b);
    k_norm.push(&mut b);
    b.arg(&scalars.1);
    b.arg(&scalars.2);
    out.push(&mut b);
    b.arg(&scalars.3);
    b.arg(&scalars.4);
    b.arg(&scalars.5);
    let warps = (ROPE_THREADS / 32) as usize;
    let dims = LaunchDims {
        grid: (rows as u32, (h + kvh).div_ceil(warps) as u32, 1),
        block: (ROPE_THREADS, 1, 1),
        dynamic_shared_bytes: 0,
    };
    // SAFETY: `rope_qk_*`'s arguments in order and of its types (qkv, norms and out of one
    // dtype, tables f32, positions u32: checked). A warp per (row, head) reads that head of its
    // qkv row and the table row of its position (positions are validated below max_positions
    // before a step; a padding row's is 0) and writes that head of `out` (sizes checked).
    unsafe { b.launch(config(dims)) }.w()?;
    Ok(())
}

/// `k` and `v` rows (strides apart) into one layer of the cache (`kv_layer`: K then V) at
/// `slots` (u32; [`crate::cuda_plan::PAD_SLOT`] rows are skipped); as [`super::write_kv`].
#[allow(clippy::too_many_arguments)]
pub fn write_kv_into(
    dev: &CudaDevice,
    kv_layer: &View<'_>,
    (k, k_row_stride): (&View<'_>, usize),
    (v, v_row_stride): (&View<'_>, usize),
    slots: &View<'_>,
    rows: usize,
    layout: &KvLayout,
) -> Result<()> {
    let width = layout.num_kv_heads * layout.head_dim;
    let last_row = |stride: usize| rows.saturating_sub(1) * stride + width;
    require("write_kv k", k.len(), last_row(k_row_stride))?;
    require("write_kv v", v.len(), last_row(v_row_stride))?;
    require("write_kv slots", slots.len(), rows)?;
    require(
        "write_kv cache",
        kv_layer.len(),
        2 * layout.values_per_layer(),
    )?;
    same_dtype("write_kv", &[k, v])?;
    if !matches!(slots, View::U32(_)) {
        candle_core::bail!("write_kv: slots must be u32");
    }
    if rows == 0 {
        return Ok(());
    }
    let name = format!("write_kv_{}_{}", k.suffix()?, kv_layer.suffix()?);
    let func = Module::CacheWrite.function(dev, &name)?;
    let args = (
        k_row_stride as i64,
        v_row_stride as i64,
        layout.values_per_layer() as i64,
        layout.num_kv_heads as i32,
        layout.head_dim as i32,
        layout.block_size as i32,
    );
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    k.push(&mut b);
    v.push(&mut b);
    b.arg(&args.0);
    b.arg(&args.1);
    kv_layer.push(&mut b);
    b.arg(&args.2);
    slots.push(&mut b);
    b.arg(&args.3);
    b.arg(&args.4);
    b.arg(&args.5);
    let dims = LaunchDims::linear(rows, WRITE_KV_THREADS);
    // SAFETY: `write_kv_*`'s arguments in order and of its types. Rows stay inside k and v
    // (checked against the strides); every slot is below the cache's slots (validated before
    // a step) or PAD_SLOT, which the kernel skips, so writes stay inside the layer.
    unsafe { b.launch(config(dims)) }.w()?;
    Ok(())
}

/// The attention launches of `plan` (two with split-K, into `workspace`: partial accumulators
/// and `(max, sum)` pairs of [`AttentionPlan::workspace_floats`]) from `q` rows into `out`,
/// reading the plan's metadata from `metadata` (its words on the device).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_into(
    dev: &CudaDevice,
    plan: &AttentionPlan,
    metadata: &View<'_>,
    (q, q_token_stride): (&View<'_>, usize),
    kv_layer: &View<'_>,
    layout: &KvLayout,
    out: &View<'_>,
    workspace: Option<(&View<'_>, &View<'_>)>,
) -> Result<()> {
    let (t, h, d) = (plan.num_tokens, plan.num_heads, plan.head_dim);
    let View::U32(md) = metadata else {
        candle_core::bail!("attention metadata must be u32");
    };
    require("attention metadata", md.len(), plan.metadata.len())?;
    let fits_cache = layout.head_dim == d
        && layout.num_kv_heads == plan.num_kv_heads
        && layout.block_size == plan.block_size
        && (plan.max_block() as usize) < layout.num_blocks;
    if !fits_cache {
        candle_core::bail!("paged_attention: the plan does not fit a cache of {layout:?}");
    }
    require(
        "attention cache",
        kv_layer.len(),
        2 * layout.values_per_layer(),
    )?;
    require(
        "attention q",
        q.len(),
        t.saturating_sub(1) * q_token_stride + h * d,
    )?;
    require("attention out", out.len(), t * h * d)?;
    same_dtype("paged_attention", &[q, out])?;
    if t == 0 {
        return Ok(());
    }
    let o = plan.offsets;
    let (tiles, seqs, tables, token_splits) = (
        md.slice(o.tiles..),
        md.slice(o.seqs..),
        md.slice(o.block_tables..),
        md.slice(o.token_splits..),
    );
    let (q_type, cache_type) = (q.suffix()?, kv_layer.suffix()?);
    let scalars = (
        q_token_stride as i64,
        layout.values_per_layer() as i64,
        h as i32,
        plan.num_kv_heads as i32,
        plan.block_size as i32,
        plan.scale_log2,
    );
    let stream = dev.cuda_stream();
    match (plan.split, plan.combine, workspace) {
        (None, _, _) => {
            // Tiles of several partitions walked by one block each, or of one partition.
            let walk = if plan.partitions > 1 { "walk_" } else { "" };
            let func = Module::PagedAttention.function(
                dev,
                &format!("paged_attention_{walk}{q_type}_{cache_type}_d{d}"),
            )?;
            let mut b = stream.launch_builder(&func);
            q.push(&mut b);
            b.arg(&scalars.0);
            kv_layer.push(&mut b);
            b.arg(&scalars.1);
            out.push(&mut b);
            b.arg(&tiles);
            b.arg(&seqs);
            b.arg(&tables);
            b.arg(&scalars.2);
            b.arg(&scalars.3);
            b.arg(&scalars.4);
            b.arg(&scalars.5);
            // SAFETY: `paged_attention_*`'s (and `paged_attention_walk_*`'s, the same)
            // arguments in order and of its types. The plan's tiles cover each (token, head)
            // row of `out` once; q rows and the cache hold what the metadata indexes (checked
            // above and by `AttentionPlan`).
            unsafe { b.launch(config(plan.attention)) }.w()?;
        }
        (Some(split), Some(combine), Some((acc, ml))) => {
            let (acc_n, ml_n) = plan.workspace_floats();
            require("split-K accumulators", acc.len(), acc_n)?;
            require("split-K maxima", ml.len(), ml_n)?;
            if !matches!((acc, ml), (View::F32(_), View::F32(_))) {
                candle_core::bail!("the split-K workspace must be f32");
            }
            let max_splits = split.max_splits as i32;
            let func = Module::PagedAttention.function(
                dev,
                &format!("paged_attention_split_{q_type}_{cache_type}_d{d}"),
            )?;
            let mut b = stream.launch_builder(&func);
            q.push(&mut b);
            b.arg(&scalars.0);
            kv_layer.push(&mut b);
            b.arg(&scalars.1);
            b.arg(&tiles);
            b.arg(&seqs);
            b.arg(&tables);
            b.arg(&scalars.2);
            b.arg(&scalars.3);
            b.arg(&scalars.4);
            b.arg(&scalars.5);
            b.arg(&max_splits);
            acc.push(&mut b);
            ml.push(&mut b);
            // SAFETY: as the unsplit kernel; partials are indexed by (token, head, split) below
            // `workspace_floats`, which the workspace holds (checked).
            unsafe { b.launch(config(plan.attention)) }.w()?;
            let combine_args = (h as i32, d as i32, split.max_splits as i32);
            let func =
                Module::PagedAttention.function(dev, &format!("attention_combine_{q_type}"))?;
            let mut b = stream.launch_builder(&func);
            acc.push(&mut b);
            ml.push(&mut b);
            b.arg(&token_splits);
            out.push(&mut b);
            b.arg(&combine_args.0);
            b.arg(&combine_args.1);
            b.arg(&combine_args.2);
            // SAFETY: `attention_combine_*`'s arguments in order; one block per (token, head)
            // row of `out`, reading the partials of its row's splits that the kernel above
            // wrote.
            unsafe { b.launch(config(combine)) }.w()?;
        }
        _ => candle_core::bail!("a split-K plan needs its combine launch and workspace"),
    }
    Ok(())
}

/// `silu(gate) * up` of `gate_up: [rows, 2 * inter]` into `out: [rows, inter]`.
pub fn swiglu_into(
    dev: &CudaDevice,
    gate_up: &View<'_>,
    out: &View<'_>,
    rows: usize,
    inter: usize,
) -> Result<()> {
    require("swiglu gate_up", gate_up.len(), rows * 2 * inter)?;
    require("swiglu out", out.len(), rows * inter)?;
    same_dtype("swiglu", &[gate_up, out])?;
    if rows * inter == 0 {
        return Ok(());
    }
    let func = Module::Fused.function(dev, &format!("swiglu_{}", gate_up.suffix()?))?;
    let scalars = (rows as i32, inter as i32);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    gate_up.push(&mut b);
    out.push(&mut b);
    b.arg(&scalars.0);
    b.arg(&scalars.1);
    // SAFETY: `swiglu_*`'s arguments in order and of its types; the grid-stride loop writes
    // each of the rows * inter outputs once, reading inside gate_up (sizes checked).
    unsafe { b.launch(config(swiglu_dims(rows, inter))) }.w()?;
    Ok(())
}

/// Rows `ids` (u32, each below the table's rows) of `table: [vocab, hidden]` into `out`.
pub fn gather_rows_into(
    dev: &CudaDevice,
    table: &View<'_>,
    ids: &View<'_>,
    out: &View<'_>,
    rows: usize,
    hidden: usize,
) -> Result<()> {
    require("gather ids", ids.len(), rows)?;
    require("gather out", out.len(), rows * hidden)?;
    same_dtype("gather_rows", &[table, out])?;
    if !matches!(ids, View::U32(_)) {
        candle_core::bail!("gather_rows: ids must be u32");
    }
    if rows == 0 {
        return Ok(());
    }
    let func = Module::Fused.function(dev, &format!("gather_rows_{}", table.suffix()?))?;
    let hidden_arg = hidden as i32;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    table.push(&mut b);
    ids.push(&mut b);
    out.push(&mut b);
    b.arg(&hidden_arg);
    // SAFETY: `gather_rows_*`'s arguments in order and of its types; one block per row copies
    // `hidden` values of the table row its id names (ids are validated below the vocabulary
    // before a step; padding rows' are 0) into its row of `out` (sizes checked).
    unsafe { b.launch(config(LaunchDims::linear(rows, SWIGLU_THREADS))) }.w()?;
    Ok(())
}

/// `y[r] += bias` for `y: [rows, cols]`.
pub fn add_bias_into(
    dev: &CudaDevice,
    y: &View<'_>,
    bias: &View<'_>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    require("bias", bias.len(), cols)?;
    require("bias rows", y.len(), rows * cols)?;
    same_dtype("add_bias", &[y, bias])?;
    if rows * cols == 0 {
        return Ok(());
    }
    let func = Module::Fused.function(dev, &format!("add_bias_{}", y.suffix()?))?;
    let scalars = (rows as i32, cols as i32);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    y.push(&mut b);
    bias.push(&mut b);
    b.arg(&scalars.0);
    b.arg(&scalars.1);
    // SAFETY: `add_bias_*`'s arguments in order and of its types; the grid-stride loop updates
    // each of the rows * cols values of `y` once (sizes checked).
    unsafe { b.launch(config(swiglu_dims(rows, cols))) }.w()?;
    Ok(())
}

/// cuBLAS on step buffers: its own handle on the device's stream with a workspace of its own,
/// so that a captured step allocates nothing inside cuBLAS either.
pub struct Matmul {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
    _workspace: CudaSlice<u8>,
}

/// cuBLAS's workspace for the step's GEMMs (what cuBLAS recommends on Hopper).
const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

impl Matmul {
    pub fn new(dev: &CudaDevice) -> Result<Self> {
        let stream: Arc<_> = dev.cuda_stream();
        let blas = CudaBlas::new(stream.clone()).w()?;
        let workspace = stream.alloc_zeros::<u8>(CUBLAS_WORKSPACE_BYTES).w()?;
        {
            let (ptr, _sync) = workspace.device_ptr(&stream);
            // SAFETY: the workspace lives as long as the handle (both fields of `Matmul`,
            // the handle dropped first) and is used by no one else.
            unsafe {
                cublas_sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut std::ffi::c_void,
                    CUBLAS_WORKSPACE_BYTES,
                )
            }
            .result()
            .map_err(|e| candle_core::Error::Msg(format!("cublasSetWorkspace: {e:?}")))?;
        }
        Ok(Self {
            blas,
            stream,
            _workspace: workspace,
        })
    }

    /// `out = x w^T` for rows `x: [rows, k]` and `w: [n, k]` (row-major, one dtype), `out:
    /// [rows, n]` of that dtype or f32, accumulated in f32.
    pub fn rows_times_transposed(
        &self,
        x: &View<'_>,
        w: &View<'_>,
        out: &View<'_>,
        (rows, n, k): (usize, usize, usize),
    ) -> Result<()> {
        require("matmul x", x.len(), rows * k)?;
        require("matmul w", w.len(), n * k)?;
        require("matmul out", out.len(), rows * n)?;
        same_dtype("matmul", &[x, w])?;
        let ab_type = match x {
            View::F32(_) => cublas_sys::cudaDataType_t::CUDA_R_32F,
            View::F16(_) => cublas_sys::cudaDataType_t::CUDA_R_16F,
            View::BF16(_) => cublas_sys::cudaDataType_t::CUDA_R_16BF,
            View::U32(_) => candle_core::bail!("matmul of u32"),
        };
        let c_type = match out {
            View::F32(_) => cublas_sys::cudaDataType_t::CUDA_R_32F,
            other if other.suffix()? == x.suffix()? => ab_type,
            _ => candle_core::bail!("matmul out must be f32 or the inputs' dtype"),
        };
        if rows == 0 || n == 0 {
            return Ok(());
        }
        let stream = &self.stream;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (w_ptr, _w) = w.device_ptr(stream);
        let (x_ptr, _x) = x.device_ptr(stream);
        let (o_ptr, _o) = out.device_ptr(stream);
        // Row-major out[rows, n] = x[rows, k] w[n, k]^T is, column-major, out^T[n, rows] =
        // w^T... : cuBLAS's A = w (k x n, transposed), B = x (k x rows), C = out (n x rows).
        // SAFETY: the pointers hold the sizes checked above, of the types passed; alpha and
        // beta are f32 as the f32 compute type requires; the workspace was set at creation.
        unsafe {
            cublas::gemm_ex(
                *self.blas.handle(),
                cublas_sys::cublasOperation_t::CUBLAS_OP_T,
                cublas_sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                rows as i32,
                k as i32,
                (&alpha) as *const f32 as *const std::ffi::c_void,
                w_ptr as *const std::ffi::c_void,
                ab_type,
                k as i32,
                x_ptr as *const std::ffi::c_void,
                ab_type,
                k as i32,
                (&beta) as *const f32 as *const std::ffi::c_void,
                o_ptr as *mut std::ffi::c_void,
                c_type,
                n as i32,
                cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| candle_core::Error::Msg(format!("cublasGemmEx: {e:?}")))?;
        Ok(())
    }
}

fn same_dtype(what: &str, views: &[&View<'_>]) -> Result<()> {
    let first = views[0].suffix()?;
    for v in &views[1..] {
        if v.suffix()? != first {
            candle_core::bail!("{what}: operands of different dtypes");
        }
    }
    Ok(())
}

/// The element type of a view by the suffix of our kernel names.
impl View<'_> {
    pub(crate) fn suffix(&self) -> Result<&'static str> {
        suffix(match self {
            View::F32(_) => DType::F32,
            View::F16(_) => DType::F16,
            View::BF16(_) => DType::BF16,
            View::U32(_) => DType::U32,
        })
    }
}
