//! `silu(gate) * up`, the SwiGLU activation of the MLP, in one pass with a vector exp (candle's
//! silu calls scalar `expf` per element and then multiplies in a second pass).

/// Whether [`swiglu_rows`] runs on this CPU: it needs AVX-512F, or AVX2 with FMA.
pub fn available() -> bool {
    path().is_some()
}

/// Which vector width this CPU runs: `Some(true)` for AVX-512, `Some(false)` for AVX2.
fn path() -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static PATH: OnceLock<Option<bool>> = OnceLock::new();
        let path = *PATH.get_or_init(|| {
            if is_x86_feature_detected!("avx512f") {
                Some(true)
            } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                Some(false)
            } else {
                None
            }
        });
        path.map(|wide| wide && super::allows(super::KernelTier::Avx512))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// `out[t] = silu(gate[t]) * up[t]` for rows `gate_up: [T, 2 * inter]` holding gate then up,
/// into `out: [T, inter]`. Panics if the sizes disagree or [`available`] is false.
pub fn swiglu_rows(gate_up: &[f32], inter: usize, out: &mut [f32]) {
    let avx512 = path().expect("the fused SwiGLU needs AVX-512, or AVX2 and FMA");
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
        // SAFETY: the CPU features were checked above; `gate`, `up` and `dst` are `inter` long.
        unsafe {
            if avx512 {
                x86::swiglu_row(gate, up, dst)
            } else {
                x86::swiglu_row_avx2(gate, up, dst)
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (gate, up, dst, avx512);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::cpu::simd::x86::{exp, exp8};

    /// [`swiglu_row`] eight lanes at a time; the tail past a multiple of 8 in scalar code with
    /// the same vector exp.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `gate` and `up` hold at least `out.len()` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn swiglu_row_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len();
        let one = _mm256_set1_ps(1.0);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: lanes `i..i + 8` are inside all three slices (the caller's promise for
            // `gate` and `up`); AVX2 and FMA are the caller's promise too.
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                // g / (1 + e^-g) * u
                let denom = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)));
                let y = _mm256_div_ps(_mm256_mul_ps(g, u), denom);
                _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
            }
            i += 8;
        }
        for j in i..n {
            let (g, u) = (gate[j], up[j]);
            // SAFETY: AVX2 and FMA are the caller's promise.
            let e = unsafe { _mm256_cvtss_f32(exp8(_mm256_set1_ps(-g))) };
            out[j] = g * u / (1.0 + e);
        }
    }

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
            eprintln!("skipped: neither AVX-512 nor AVX2 on this CPU, the fused kernel is never used here");
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

    /// The AVX2 row kernel on CPUs that would otherwise run the AVX-512 one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_row_equals_the_formula() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        for n in [1usize, 7, 8, 9, 37, 64] {
            let gate: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 2001) as f32 / 100.0 - 10.0)
                .collect();
            let up: Vec<f32> = (0..n)
                .map(|i| ((i * 104_729) % 1999) as f32 / 200.0 - 5.0)
                .collect();
            let mut out = vec![0f32; n];
            // SAFETY: AVX2 and FMA checked above; all three slices are `n` long.
            unsafe { x86::swiglu_row_avx2(&gate, &up, &mut out) };
            for i in 0..n {
                let (g, u) = (gate[i] as f64, up[i] as f64);
                let want = (g / (1.0 + (-g).exp()) * u) as f32;
                assert!(
                    (out[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{n} {i}: {} vs {want}",
                    out[i]
                );
            }
        }
    }
}
