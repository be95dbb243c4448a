//! `silu(gate) * up`, the SwiGLU activation of the MLP, and Gemma's GeGLU, `gelu_tanh(gate) *
//! up`, each in one pass with a vector exp (candle's silu calls scalar `expf` per element and
//! then multiplies in a second pass). Both are `gate * up / (1 + e^-z)`: `z = gate` for SiLU,
//! `z = 2 * sqrt(2 / pi) * (gate + 0.044715 * gate^3)` for GELU's tanh approximation (as
//! `0.5 * (1 + tanh(u)) = 1 / (1 + e^(-2u))`).

/// The gate's activation of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedActivation {
    /// SwiGLU (llama, qwen, mixtures of experts).
    Silu,
    /// GeGLU with GELU's tanh approximation (Gemma: `gelu_pytorch_tanh`).
    GeluTanh,
}

/// `2 * sqrt(2 / pi)`: GELU-tanh's argument doubled, for the sigmoid form.
const GELU_TANH_SCALE: f32 = 1.595_769_2;
/// The cubic term's coefficient of GELU's tanh approximation.
const GELU_TANH_CUBIC: f32 = 0.044_715;

/// The sigmoid's argument `z` of [`GatedActivation`] for a gate value, in scalar code (the
/// kernels compute the same operations in the same order on vectors).
pub fn sigmoid_argument(activation: GatedActivation, g: f32) -> f32 {
    match activation {
        GatedActivation::Silu => g,
        GatedActivation::GeluTanh => GELU_TANH_SCALE * (g + GELU_TANH_CUBIC * (g * g * g)),
    }
}

/// Whether [`swiglu_rows`] runs on this CPU: it needs AVX-512F, or AVX2 with FMA.
pub fn available() -> bool {
    super::vector_path().is_some()
}

/// `out[t] = silu(gate[t]) * up[t]` for rows `gate_up: [T, 2 * inter]` holding gate then up,
/// into `out: [T, inter]`. Panics if the sizes disagree or [`available`] is false.
pub fn swiglu_rows(gate_up: &[f32], inter: usize, out: &mut [f32]) {
    glu_rows(GatedActivation::Silu, gate_up, inter, out)
}

/// `out[t] = act(gate[t]) * up[t]` for rows `gate_up: [T, 2 * inter]` holding gate then up,
/// into `out: [T, inter]`. Panics if the sizes disagree or [`available`] is false.
pub fn glu_rows(activation: GatedActivation, gate_up: &[f32], inter: usize, out: &mut [f32]) {
    let avx512 =
        super::vector_path().expect("the fused gated activation needs AVX-512, or AVX2 and FMA");
    let gelu = activation == GatedActivation::GeluTanh;
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
            match (avx512, gelu) {
                (true, false) => x86::glu_row::<false>(gate, up, dst),
                (true, true) => x86::glu_row::<true>(gate, up, dst),
                (false, false) => x86::glu_row_avx2::<false>(gate, up, dst),
                (false, true) => x86::glu_row_avx2::<true>(gate, up, dst),
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (gate, up, dst, avx512, gelu);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{GELU_TANH_CUBIC, GELU_TANH_SCALE};
    use crate::cpu::simd::x86::{exp, exp8};

    /// The sigmoid's argument on eight lanes: the gate itself, or GELU-tanh's (`GELU`), with
    /// the operations of [`super::sigmoid_argument`] in its order (no FMA, so that the scalar
    /// tail and both widths round alike).
    #[target_feature(enable = "avx2,fma")]
    fn argument8<const GELU: bool>(g: __m256) -> __m256 {
        if GELU {
            let cube = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
            let inner = _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(GELU_TANH_CUBIC), cube));
            _mm256_mul_ps(_mm256_set1_ps(GELU_TANH_SCALE), inner)
        } else {
            g
        }
    }

    /// [`argument8`] on sixteen lanes.
    #[target_feature(enable = "avx512f")]
    fn argument16<const GELU: bool>(g: __m512) -> __m512 {
        if GELU {
            let cube = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
            let inner = _mm512_add_ps(g, _mm512_mul_ps(_mm512_set1_ps(GELU_TANH_CUBIC), cube));
            _mm512_mul_ps(_mm512_set1_ps(GELU_TANH_SCALE), inner)
        } else {
            g
        }
    }

    /// [`glu_row`] eight lanes at a time; the tail past a multiple of 8 in scalar code with
    /// the same vector exp.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `gate` and `up` hold at least `out.len()` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn glu_row_avx2<const GELU: bool>(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len();
        let one = _mm256_set1_ps(1.0);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: lanes `i..i + 8` are inside all three slices (the caller's promise for
            // `gate` and `up`); AVX2 and FMA are the caller's promise too.
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                // g / (1 + e^-z) * u
                let z = argument8::<GELU>(g);
                let denom = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), z)));
                let y = _mm256_div_ps(_mm256_mul_ps(g, u), denom);
                _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
            }
            i += 8;
        }
        for j in i..n {
            let (g, u) = (gate[j], up[j]);
            let z = argument8::<GELU>(_mm256_set1_ps(g));
            // SAFETY: AVX2 and FMA are the caller's promise.
            let e = unsafe { _mm256_cvtss_f32(exp8(_mm256_sub_ps(_mm256_setzero_ps(), z))) };
            out[j] = g * u / (1.0 + e);
        }
    }

    /// # Safety
    /// The CPU has AVX-512F; `gate` and `up` hold at least `out.len()` values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn glu_row<const GELU: bool>(gate: &[f32], up: &[f32], out: &mut [f32]) {
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
                // g / (1 + e^-z) * u
                let z = argument16::<GELU>(g);
                let denom = _mm512_add_ps(
                    _mm512_set1_ps(1.0),
                    exp(_mm512_sub_ps(_mm512_setzero_ps(), z)),
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
            unsafe { x86::glu_row_avx2::<false>(&gate, &up, &mut out) };
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

    /// GeGLU against GELU's tanh formula in f64, on both widths where the CPU has them.
    #[test]
    fn fused_geglu_equals_the_tanh_formula() {
        if !available() {
            eprintln!("skipped: neither AVX-512 nor AVX2 on this CPU, the fused kernel is never used here");
            return;
        }
        let (t, inter) = (3, 45);
        let data: Vec<f32> = (0..t * 2 * inter)
            .map(|i| ((i * 7919) % 2001) as f32 / 100.0 - 10.0)
            .collect();
        let mut out = vec![0f32; t * inter];
        glu_rows(GatedActivation::GeluTanh, &data, inter, &mut out);
        for r in 0..t {
            for i in 0..inter {
                let g = data[r * 2 * inter + i] as f64;
                let u = data[r * 2 * inter + inter + i] as f64;
                let c = (2.0 / std::f64::consts::PI).sqrt();
                let want = (0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()) * u) as f32;
                let got = out[r * inter + i];
                assert!(
                    (got - want).abs() <= 2e-5 * (1.0 + want.abs()),
                    "{g} {u}: {got} vs {want}"
                );
            }
        }
    }
}
