//! `silu(gate) * up`, the SwiGLU activation of the MLP, in one pass with a vector exp (candle's
//! silu calls scalar `expf` per element and then multiplies in a second pass).

/// Whether [`swiglu_rows`] runs on this CPU.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| is_x86_feature_detected!("avx512f"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `out[t] = silu(gate[t]) * up[t]` for rows `gate_up: [T, 2 * inter]` holding gate then up,
/// into `out: [T, inter]`. Panics if the sizes disagree or [`available`] is false.
pub fn swiglu_rows(gate_up: &[f32], inter: usize, out: &mut [f32]) {
    assert!(available(), "the fused SwiGLU needs AVX-512");
    assert_eq!(
        gate_up.len(),
        2 * out.len(),
        "gate_up is [T, 2 * inter], out [T, inter]"
    );
    if inter == 0 {
        return;
    }
    for (row, dst) in gate_up
        .chunks_exact(2 * inter)
        .zip(out.chunks_exact_mut(inter))
    {
        let (gate, up) = row.split_at(inter);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 checked above; `gate`, `up` and `dst` are `inter` long.
        unsafe {
            x86::swiglu_row(gate, up, dst)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (gate, up, dst);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::cpu::simd::x86::exp;

    /// # Safety
    /// The CPU has AVX-512F; `gate` and `up` hold at least `out.len()` values.
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
            // SAFETY: the masked lanes are `i..n`, inside all three slices (the caller's
            // promise for `gate` and `up`); AVX-512F is the caller's promise too.
            unsafe {
                let g = _mm512_maskz_loadu_ps(mask, gate.as_ptr().add(i));
                let u = _mm512_maskz_loadu_ps(mask, up.as_ptr().add(i));
                // g / (1 + e^-g) * u
                let denom = _mm512_add_ps(
                    _mm512_set1_ps(1.0),
                    exp(_mm512_sub_ps(_mm512_setzero_ps(), g)),
                );
                let y = _mm512_div_ps(_mm512_mul_ps(g, u), denom);
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), mask, y);
            }
            i += 16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_swiglu_equals_the_formula() {
        if !available() {
            eprintln!("skipped: no AVX-512 on this CPU, the fused kernel is never used here");
            return;
        }
        let (t, inter) = (5, 37);
        let data: Vec<f32> = (0..t * 2 * inter)
            .map(|i| ((i * 7919) % 2001) as f32 / 100.0 - 10.0)
            .collect();
        let mut out = vec![0f32; t * inter];
        swiglu_rows(&data, inter, &mut out);
        for r in 0..t {
            for i in 0..inter {
                let g = data[r * 2 * inter + i] as f64;
                let u = data[r * 2 * inter + inter + i] as f64;
                let want = (g / (1.0 + (-g).exp()) * u) as f32;
                let got = out[r * inter + i];
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{got} vs {want}"
                );
            }
        }
    }
}
