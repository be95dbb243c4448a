//! Element-wise steps of the forward fused into single passes on CPU.

use candle_core::{DType, Device, Storage, Tensor};

use crate::error::Result;

/// `silu(gate) * up` for `gate_up: [T, 2 * inter]` holding gate then up per row; `[T, inter]`.
/// On AVX-512 CPUs one pass with a vector exp (candle's silu calls scalar `expf` per element and
/// then multiplies in a second pass); elsewhere candle's ops.
pub fn swiglu(gate_up: &Tensor, inter: usize) -> Result<Tensor> {
    #[cfg(target_arch = "x86_64")]
    if gate_up.device().is_cpu()
        && gate_up.dtype() == DType::F32
        && is_x86_feature_detected!("avx512f")
    {
        let t = gate_up.dim(0)?;
        let gate_up = gate_up.contiguous()?;
        let (storage, layout) = gate_up.storage_and_layout();
        if let Storage::Cpu(cpu) = &*storage {
            let data = &cpu.as_slice::<f32>()?[layout.start_offset()..][..t * 2 * inter];
            let mut out = vec![0f32; t * inter];
            for (row, dst) in data
                .chunks_exact(2 * inter)
                .zip(out.chunks_exact_mut(inter))
            {
                let (gate, up) = row.split_at(inter);
                // SAFETY: AVX-512 checked above.
                unsafe { x86::swiglu_row(gate, up, dst) };
            }
            return Ok(Tensor::from_vec(out, (t, inter), &Device::Cpu)?);
        }
    }
    let gate = gate_up.narrow(1, 0, inter)?;
    let up = gate_up.narrow(1, inter, inter)?;
    Ok((candle_nn::ops::silu(&gate)? * up)?)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::simd::x86::exp;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn swiglu_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len();
        let mut i = 0;
        while i < n {
            let mask: u16 = if n - i >= 16 {
                u16::MAX
            } else {
                (1u16 << (n - i)) - 1
            };
            let g = _mm512_maskz_loadu_ps(mask, gate.as_ptr().add(i));
            let u = _mm512_maskz_loadu_ps(mask, up.as_ptr().add(i));
            // g / (1 + e^-g) * u
            let denom = _mm512_add_ps(
                _mm512_set1_ps(1.0),
                exp(_mm512_sub_ps(_mm512_setzero_ps(), g)),
            );
            let y = _mm512_div_ps(_mm512_mul_ps(g, u), denom);
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), mask, y);
            i += 16;
        }
    }
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
