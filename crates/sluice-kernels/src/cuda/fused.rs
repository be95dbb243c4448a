//! Fused element-wise steps (`fused.cu`): the residual add with the next RMSNorm, QK-norm and
//! RoPE over a fused QKV row, and SwiGLU. Each is one launch where candle's ops take several.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
};

use super::launch::{alloc_output, config, cuda_storage, require, suffix, Module, View};
use crate::cuda_plan::{swiglu_dims, LaunchDims, NORM_THREADS, ROPE_THREADS};

/// `(x + delta, rms_norm(x + delta) * weight)` for `x, delta: [rows, hidden]` (contiguous, one
/// dtype) and `weight: [hidden]` of that dtype; without `delta`, `(x, rms_norm(x) * weight)`.
/// Both outputs are views of one `[2, rows, hidden]` tensor.
pub fn add_rms_norm(
    x: &Tensor,
    delta: Option<&Tensor>,
    weight: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    let (rows, hidden) = x.dims2()?;
    if weight.dims1()? != hidden || weight.dtype() != x.dtype() {
        candle_core::bail!(
            "add_rms_norm: weight {:?} {:?} for rows of {hidden} {:?}",
            weight.dims(),
            weight.dtype(),
            x.dtype()
        );
    }
    let x = x.contiguous()?;
    let weight = weight.contiguous()?;
    let op = AddRmsNorm { rows, hidden, eps };
    let out = match delta {
        Some(delta) => {
            if delta.dims() != x.dims() || delta.dtype() != x.dtype() {
                candle_core::bail!(
                    "add_rms_norm: delta {:?} for x {:?}",
                    delta.dims(),
                    x.dims()
                );
            }
            x.apply_op3_no_bwd(&delta.contiguous()?, &weight, &op)?
        }
        None => x.apply_op2_no_bwd(&weight, &op)?,
    };
    Ok((out.get(0)?, out.get(1)?))
}

struct AddRmsNorm {
    rows: usize,
    hidden: usize,
    eps: f32,
}

impl AddRmsNorm {
    fn launch(
        &self,
        x: (&CudaStorage, &Layout),
        delta: Option<(&CudaStorage, &Layout)>,
        weight: (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, Shape)> {
        let (rows, hidden) = (self.rows, self.hidden);
        let dev = x.0.device().clone();
        let x_view = View::new(x.0, x.1)?;
        let w_view = View::new(weight.0, weight.1)?;
        require("add_rms_norm x", x_view.len(), rows * hidden)?;
        require("add_rms_norm weight", w_view.len(), hidden)?;
        // Without a delta the kernel never reads it (has_delta 0): x stands in.
        let delta_view = match delta {
            Some((s, l)) => View::new(s, l)?,
            None => View::new(x.0, x.1)?,
        };
        require("add_rms_norm delta", delta_view.len(), rows * hidden)?;
        let out = alloc_output(&dev, x.0.dtype(), 2 * rows * hidden)?;
        if rows > 0 {
            let out_view = View::new(&out, &Layout::contiguous(2 * rows * hidden))?;
            let func =
                Module::Fused.function(&dev, &format!("add_rms_norm_{}", suffix(x.0.dtype())?))?;
            let scalars = (
                i32::from(delta.is_some()),
                rows as i32,
                hidden as i32,
                self.eps,
            );
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&func);
            x_view.push(&mut b);
            delta_view.push(&mut b);
            b.arg(&scalars.0);
            w_view.push(&mut b);
            out_view.push(&mut b);
            b.arg(&scalars.1);
            b.arg(&scalars.2);
            b.arg(&scalars.3);
            let dims = LaunchDims {
                grid: (rows as u32, 1, 1),
                block: (NORM_THREADS, 1, 1),
                dynamic_shared_bytes: 0,
            };
            // SAFETY: `add_rms_norm_*`'s arguments in order and of its types; one block per row
            // reads `hidden` values of x, delta and weight (sizes checked above) and writes its
            // row of both halves of `out` (2 * rows * hidden elements, allocated above).
            unsafe { b.launch(config(dims)) }.w()?;
        }
        Ok((out, Shape::from((2, rows, hidden))))
    }
}

impl CustomOp2 for AddRmsNorm {
    fn name(&self) -> &'static str {
        "sluice-rms-norm"
    }
    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("sluice's fused RMSNorm runs on CUDA tensors")
    }
    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        x_l: &Layout,
        w: &CudaStorage,
        w_l: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.launch((x, x_l), None, (w, w_l))
    }
}

impl CustomOp3 for AddRmsNorm {
    fn name(&self) -> &'static str {
        "sluice-add-rms-norm"
    }
    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("sluice's fused add + RMSNorm runs on CUDA tensors")
    }
    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        x_l: &Layout,
        delta: &CudaStorage,
        delta_l: &Layout,
        w: &CudaStorage,
        w_l: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.launch((x, x_l), Some((delta, delta_l)), (w, w_l))
    }
}

/// qwen3's per-head RMSNorm weights (`[head_dim]` each, the activations' dtype), applied to
/// every Q and K head before RoPE.
pub struct QkNorm<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub eps: f32,
}

/// RoPE by per-token `positions` (`[T]` u32) on the Q and K heads of `qkv: [T, (H + 2 * KVH) *
/// D]` (Q heads, K heads, V heads per row; contiguous rows), with `qk_norm` first when given.
/// `tables`: `(cos, sin)`, each `[max_positions, D / 2]` f32. Returns `[T, (H + KVH) * D]`: the rotated Q
/// heads then the rotated K heads; V stays where it is in `qkv`.
pub fn rope_qk(
    qkv: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    positions: &Tensor,
    qk_norm: Option<QkNorm<'_>>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
) -> Result<Tensor> {
    let (t, width) = qkv.dims2()?;
    if width != (num_heads + 2 * num_kv_heads) * head_dim || !qkv.is_contiguous() {
        candle_core::bail!("rope_qk: qkv {:?} is not contiguous rows of {num_heads} + 2 x {num_kv_heads} heads of {head_dim}", qkv.dims());
    }
    let (max_positions, half) = cos.dims2()?;
    if sin.dims() != cos.dims() || half * 2 != head_dim || positions.dims1()? != t {
        candle_core::bail!(
            "rope_qk: tables {:?} and positions {:?} for {t} tokens of head_dim {head_dim}",
            cos.dims(),
            positions.dims()
        );
    }
    if let Some(n) = &qk_norm {
        if n.q.dtype() != qkv.dtype() || n.k.dtype() != qkv.dtype() {
            candle_core::bail!(
                "rope_qk: QK-norm weights must be {:?} like qkv",
                qkv.dtype()
            );
        }
    }
    let op = RopeQk {
        cos: cos.contiguous()?,
        sin: sin.contiguous()?,
        positions: positions.contiguous()?,
        norm: match qk_norm {
            Some(n) => Some((n.q.contiguous()?, n.k.contiguous()?, n.eps)),
            None => None,
        },
        max_positions,
        num_heads,
        num_kv_heads,
        head_dim,
    };
    qkv.apply_op1_no_bwd(&op)
}

struct RopeQk {
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    norm: Option<(Tensor, Tensor, f32)>,
    max_positions: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl CustomOp1 for RopeQk {
    fn name(&self) -> &'static str {
        "sluice-rope-qk"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("sluice's fused RoPE runs on CUDA tensors")
    }

    fn cuda_fwd(&self, qkv: &CudaStorage, qkv_l: &Layout) -> Result<(CudaStorage, Shape)> {
        let (h, kvh, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let t = qkv_l.dims()[0];
        let dev = qkv.device().clone();
        let (cos_g, cos_l) = self.cos.storage_and_layout();
        let (sin_g, sin_l) = self.sin.storage_and_layout();
        let (pos_g, pos_l) = self.positions.storage_and_layout();
        let cos = View::new(cuda_storage(&cos_g, "rope cos")?, cos_l)?;
        let sin = View::new(cuda_storage(&sin_g, "rope sin")?, sin_l)?;
        let pos = View::new(cuda_storage(&pos_g, "positions")?, pos_l)?;
        if !matches!(
            (&cos, &sin, &pos),
            (View::F32(_), View::F32(_), View::U32(_))
        ) {
            candle_core::bail!("rope_qk: cos and sin must be f32 and positions u32");
        }
        require(
            "rope tables",
            cos.len().min(sin.len()),
            self.max_positions * d / 2,
        )?;
        require("positions", pos.len(), t)?;
        let qkv_view = View::new(qkv, qkv_l)?;
        let row = (h + 2 * kvh) * d;
        require("rope qkv", qkv_view.len(), t * row)?;
        let norm_guards = self
            .norm
            .as_ref()
            .map(|(q, k, _)| (q.storage_and_layout(), k.storage_and_layout()));
        let (q_norm, k_norm) = match &norm_guards {
            Some(((qg, ql), (kg, kl))) => (
                View::new(cuda_storage(qg, "q_norm")?, ql)?,
                View::new(cuda_storage(kg, "k_norm")?, kl)?,
            ),
            // Never read with has_qk_norm 0: the tables stand in.
            None => (
                View::new(cuda_storage(&cos_g, "rope cos")?, cos_l)?,
                View::new(cuda_storage(&sin_g, "rope sin")?, sin_l)?,
            ),
        };
        if self.norm.is_some() {
            require("qk norm weights", q_norm.len().min(k_norm.len()), d)?;
        }
        let out = alloc_output(&dev, qkv.dtype(), t * (h + kvh) * d)?;
        if t > 0 {
            let out_view = View::new(&out, &Layout::contiguous(t * (h + kvh) * d))?;
            let func =
                Module::Fused.function(&dev, &format!("rope_qk_{}", suffix(qkv.dtype())?))?;
            let eps = self.norm.as_ref().map_or(0.0, |n| n.2);
            let scalars = (
                row as i64,
                i32::from(self.norm.is_some()),
                eps,
                h as i32,
                kvh as i32,
                d as i32,
            );
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&func);
            qkv_view.push(&mut b);
            b.arg(&scalars.0);
            cos.push(&mut b);
            sin.push(&mut b);
            pos.push(&mut b);
            q_norm.push(&mut b);
            k_norm.push(&mut b);
            b.arg(&scalars.1);
            b.arg(&scalars.2);
            out_view.push(&mut b);
            b.arg(&scalars.3);
            b.arg(&scalars.4);
            b.arg(&scalars.5);
            let warps = (ROPE_THREADS / 32) as usize;
            let dims = LaunchDims {
                grid: (t as u32, (h + kvh).div_ceil(warps) as u32, 1),
                block: (ROPE_THREADS, 1, 1),
                dynamic_shared_bytes: 0,
            };
            // SAFETY: `rope_qk_*`'s arguments in order and of its types (the norm weights and
            // qkv of one dtype: candle's storage of `qkv`'s dtype is what the kernel name
            // says, and the norm weights are checked to match by the caller's dtypes). A warp
            // per (token, head) reads that head of qkv (t rows of `row`, checked) and the
            // table row of the token's position (sluice-model validates positions below
            // max_positions), and writes that head of `out`.
            unsafe { b.launch(config(dims)) }.w()?;
        }
        Ok((out, Shape::from((t, (h + kvh) * d))))
    }
}

/// `silu(gate) * up` for `gate_up: [T, 2 * inter]` holding gate then up in each row; `[T, inter]`.
pub fn swiglu(gate_up: &Tensor, inter: usize) -> Result<Tensor> {
    let (t, width) = gate_up.dims2()?;
    if width != 2 * inter {
        candle_core::bail!("swiglu: rows of {width} are not gate and up of {inter}");
    }
    gate_up
        .contiguous()?
        .apply_op1_no_bwd(&Swiglu { rows: t, inter })
}

struct Swiglu {
    rows: usize,
    inter: usize,
}

impl CustomOp1 for Swiglu {
    fn name(&self) -> &'static str {
        "sluice-swiglu"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("sluice's CUDA SwiGLU runs on CUDA tensors")
    }

    fn cuda_fwd(&self, gate_up: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let (rows, inter) = (self.rows, self.inter);
        let dev = gate_up.device().clone();
        let input = View::new(gate_up, l)?;
        require("swiglu gate_up", input.len(), rows * 2 * inter)?;
        let out = alloc_output(&dev, gate_up.dtype(), rows * inter)?;
        if rows * inter > 0 {
            let out_view = View::new(&out, &Layout::contiguous(rows * inter))?;
            let func =
                Module::Fused.function(&dev, &format!("swiglu_{}", suffix(gate_up.dtype())?))?;
            let scalars = (rows as i32, inter as i32);
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&func);
            input.push(&mut b);
            out_view.push(&mut b);
            b.arg(&scalars.0);
            b.arg(&scalars.1);
            // SAFETY: `swiglu_*`'s arguments in order and of its types; the grid-stride loop
            // writes each of the rows * inter outputs once, reading inside gate_up (checked).
            unsafe { b.launch(config(swiglu_dims(rows, inter))) }.w()?;
        }
        Ok((out, Shape::from((rows, inter))))
    }
}
