//! Fused element-wise steps (`fused.cu`): the residual add with the next RMSNorm, QK-norm and
//! RoPE over a fused QKV row, and SwiGLU. Each is one launch where candle's ops take several.

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
};

use super::launch::{alloc_output, cuda_storage, View};

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
        let out = alloc_output(&dev, x.0.dtype(), 2 * rows * hidden)?;
        let delta_view = delta.map(|(s, l)| View::new(s, l)).transpose()?;
        super::direct::add_rms_norm_into(
            &dev,
            &View::new(x.0, x.1)?,
            delta_view.as_ref(),
            &View::new(weight.0, weight.1)?,
            &View::new(&out, &Layout::contiguous(2 * rows * hidden))?,
            rows,
            hidden,
            self.eps,
        )?;
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
        let norm_guards = self
            .norm
            .as_ref()
            .map(|(q, k, eps)| (q.storage_and_layout(), k.storage_and_layout(), *eps));
        let norms = match &norm_guards {
            Some(((qg, ql), (kg, kl), eps)) => Some((
                View::new(cuda_storage(qg, "q_norm")?, ql)?,
                View::new(cuda_storage(kg, "k_norm")?, kl)?,
                *eps,
            )),
            None => None,
        };
        let out = alloc_output(&dev, qkv.dtype(), t * (h + kvh) * d)?;
        super::direct::rope_qk_into(
            &dev,
            &View::new(qkv, qkv_l)?,
            (h + 2 * kvh) * d,
            (&cos, &sin),
            self.max_positions,
            &pos,
            norms.as_ref().map(|(q, k, eps)| (q, k, *eps)),
            &View::new(&out, &Layout::contiguous(t * (h + kvh) * d))?,
            t,
            (h, kvh, d),
        )?;
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
        let out = alloc_output(&dev, gate_up.dtype(), rows * inter)?;
        super::direct::swiglu_into(
            &dev,
            &View::new(gate_up, l)?,
            &View::new(&out, &Layout::contiguous(rows * inter))?,
            rows,
            inter,
        )?;
        Ok((out, Shape::from((rows, inter))))
    }
}
