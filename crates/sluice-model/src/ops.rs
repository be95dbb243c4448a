//! Element-wise steps of the forward: fused kernels on CPU tensors, candle's ops elsewhere.

use candle_core::{DType, Device, Storage, Tensor};
use sluice_kernels::cpu::swiglu::{self, GatedActivation};

use crate::error::Result;

/// `silu(gate) * up` for `gate_up: [T, 2 * inter]` holding gate then up per row; `[T, inter]`.
/// On AVX-512 or AVX2 CPUs one fused pass (`sluice_kernels::cpu::swiglu`); elsewhere candle's ops.
pub fn swiglu(gate_up: &Tensor, inter: usize) -> Result<Tensor> {
    if gate_up.device().is_cpu() && gate_up.dtype() == DType::F32 && swiglu::available() {
        let t = gate_up.dim(0)?;
        let gate_up = gate_up.contiguous()?;
        let (storage, layout) = gate_up.storage_and_layout();
        if let Storage::Cpu(cpu) = &*storage {
            let data = &cpu.as_slice::<f32>()?[layout.start_offset()..][..t * 2 * inter];
            let mut out = vec![0f32; t * inter];
            swiglu::swiglu_rows(data, inter, &mut out);
            return Ok(Tensor::from_vec(out, (t, inter), &Device::Cpu)?);
        }
    }
    let gate = gate_up.narrow(1, 0, inter)?;
    let up = gate_up.narrow(1, inter, inter)?;
    Ok((candle_nn::ops::silu(&gate)? * up)?)
}

/// [`swiglu`] on plain rows, for the CPU forward's buffers: `gate_up: [T, 2 * inter]` into
/// `act: [T, inter]`, the fused pass where the CPU has it, candle's ops through a tensor
/// elsewhere. Dense MLPs and a mixture's experts both call it.
pub(crate) fn swiglu_rows_into(gate_up: &[f32], inter: usize, act: &mut [f32]) -> Result<()> {
    if swiglu::available() {
        swiglu::swiglu_rows(gate_up, inter, act);
        return Ok(());
    }
    let rows = gate_up.len() / (2 * inter);
    let g = Tensor::from_slice(gate_up, (rows, 2 * inter), &Device::Cpu)?;
    act.copy_from_slice(&swiglu(&g, inter)?.flatten_all()?.to_vec1::<f32>()?);
    Ok(())
}

/// gpt-oss's clamped SwiGLU on rows `gate_up: [T, 2 * inter]` (gate then up) into `act: [T,
/// inter]`: `g / (1 + e^(-1.702 g)) * (u + 1)` with `g = min(gate, 7)` and `u` the up value
/// clamped to `[-7, 7]`, in f32 in ggml's order (`ggml_swiglu_oai`). Each value depends on its
/// own gate and up alone, so batching cannot show.
pub(crate) fn clamped_swiglu_rows_into(gate_up: &[f32], inter: usize, act: &mut [f32]) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for (row, out) in gate_up
        .chunks_exact(2 * inter)
        .zip(act.chunks_exact_mut(inter))
    {
        let (gate, up) = row.split_at(inter);
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            let g = g.min(LIMIT);
            // min then max, as ggml does: a NaN up value becomes the limit, where clamp
            // would keep the NaN.
            #[allow(clippy::manual_clamp)]
            let u = u.min(LIMIT).max(-LIMIT);
            *o = g / (1.0 + (ALPHA * -g).exp()) * (u + 1.0);
        }
    }
}

/// A gated MLP's activation on plain rows: [`swiglu_rows_into`] for SiLU; GeGLU (Gemma's
/// `gelu_tanh(gate) * up`) by the fused pass where the CPU has it, else in scalar code with the
/// same formula (`gate * up / (1 + e^-z)`, `sluice_kernels::cpu::swiglu::sigmoid_argument`).
pub(crate) fn glu_rows_into(
    activation: GatedActivation,
    gate_up: &[f32],
    inter: usize,
    act: &mut [f32],
) -> Result<()> {
    if activation == GatedActivation::Silu {
        return swiglu_rows_into(gate_up, inter, act);
    }
    if swiglu::available() {
        swiglu::glu_rows(activation, gate_up, inter, act);
        return Ok(());
    }
    for (row, out) in gate_up
        .chunks_exact(2 * inter)
        .zip(act.chunks_exact_mut(inter))
    {
        let (gate, up) = row.split_at(inter);
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            let z = swiglu::sigmoid_argument(activation, g);
            *o = g * u / (1.0 + (-z).exp());
        }
    }
    Ok(())
}

/// Sets `buf` to `len` values, keeping its allocation (the CPU forward's buffers live across
/// steps). Every value is overwritten before it is read, so old values may stay.
pub(crate) fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_swiglu_equals_candle_ops() {
        let (t, inter) = (5, 37);
        let data: Vec<f32> = (0..t * 2 * inter)
            .map(|i| ((i * 7919) % 2001) as f32 / 100.0 - 10.0)
            .collect();
        let gate_up = Tensor::from_vec(data, (t, 2 * inter), &Device::Cpu).unwrap();
        let fused = swiglu(&gate_up, inter).unwrap();
        let gate = gate_up.narrow(1, 0, inter).unwrap();
        let up = gate_up.narrow(1, inter, inter).unwrap();
        let reference = (candle_nn::ops::silu(&gate).unwrap() * up).unwrap();
        let a = fused.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let b = reference.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }
}
