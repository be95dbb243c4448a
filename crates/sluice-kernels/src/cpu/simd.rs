//! Vector math shared by the CPU kernels.

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// `e^x` to about 2 ulp for `x` in [-87, 88] (clamped outside): Cephes' expf polynomial
    /// after range reduction by powers of two, and `vscalefps` to apply the power.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    pub(crate) unsafe fn exp(x: __m512) -> __m512 {
        // SAFETY: AVX-512F is the caller's promise; the intrinsics only compute on registers.
        unsafe {
            let x = _mm512_min_ps(
                _mm512_max_ps(x, _mm512_set1_ps(-87.0)),
                _mm512_set1_ps(88.0),
            );
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(
                _mm512_fmadd_ps(
                    x,
                    _mm512_set1_ps(std::f32::consts::LOG2_E),
                    _mm512_set1_ps(0.5),
                ),
            );
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
            let mut p = _mm512_set1_ps(1.987_569_1e-4);
            for coef in [
                1.398_199_9e-3,
                8.333_452e-3,
                4.166_579_6e-2,
                1.666_666_5e-1,
                0.5,
            ] {
                p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(coef));
            }
            let y = _mm512_add_ps(
                _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r),
                _mm512_set1_ps(1.0),
            );
            _mm512_scalef_ps(y, n)
        }
    }

    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    pub(crate) unsafe fn exp_scalar(x: f32) -> f32 {
        // SAFETY: AVX-512F is the caller's promise.
        unsafe { _mm512_cvtss_f32(exp(_mm512_set1_ps(x))) }
    }

    #[cfg(test)]
    #[test]
    fn vector_exp_is_accurate_over_its_range() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut worst = 0f32;
        for i in 0..=400_000 {
            let x = -87.0 + 175.0 * i as f32 / 400_000.0;
            // SAFETY: AVX-512 checked above.
            let got = unsafe { exp_scalar(x) };
            worst = worst.max(((got - x.exp()) / x.exp()).abs());
        }
        assert!(worst < 1e-6, "relative error {worst}");
        // SAFETY: as above.
        unsafe {
            assert_eq!(exp_scalar(0.0), 1.0);
            assert!(exp_scalar(f32::NEG_INFINITY) < 1e-37);
        }
    }
}
