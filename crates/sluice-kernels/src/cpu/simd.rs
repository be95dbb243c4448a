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

    /// [`exp`] on 8 lanes with AVX2 and FMA: the same polynomial, with the power of two built
    /// in the exponent bits (no `vscalefps`). The clamp keeps the power a normal float.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[inline(always)]
    pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
        // SAFETY: AVX2 and FMA are the caller's promise; the intrinsics only compute on
        // registers.
        unsafe {
            let x = _mm256_min_ps(
                _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
                _mm256_set1_ps(88.0),
            );
            let n = _mm256_floor_ps(_mm256_fmadd_ps(
                x,
                _mm256_set1_ps(std::f32::consts::LOG2_E),
                _mm256_set1_ps(0.5),
            ));
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
            let mut p = _mm256_set1_ps(1.987_569_1e-4);
            for coef in [
                1.398_199_9e-3,
                8.333_452e-3,
                4.166_579_6e-2,
                1.666_666_5e-1,
                0.5,
            ] {
                p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(coef));
            }
            let y = _mm256_add_ps(
                _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r),
                _mm256_set1_ps(1.0),
            );
            // n is in [-126, 127]: 2^n is the float with biased exponent n + 127.
            let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            )));
            _mm256_mul_ps(y, pow2)
        }
    }

    /// The largest of 8 lanes.
    ///
    /// # Safety
    /// The CPU has AVX.
    #[inline(always)]
    pub(crate) unsafe fn hmax8(v: __m256) -> f32 {
        // SAFETY: AVX is the caller's promise; register-only intrinsics.
        unsafe {
            let x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let x = _mm_max_ps(x, _mm_movehl_ps(x, x));
            _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps::<1>(x, x)))
        }
    }

    /// The sum of 8 lanes, as (0+4, 1+5, 2+6, 3+7) then pairs: a fixed order.
    ///
    /// # Safety
    /// The CPU has AVX.
    #[inline(always)]
    pub(crate) unsafe fn hsum8(v: __m256) -> f32 {
        // SAFETY: AVX is the caller's promise; register-only intrinsics.
        unsafe {
            let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
            _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps::<1>(x, x)))
        }
    }

    #[cfg(test)]
    #[test]
    fn avx2_exp_is_accurate_over_its_range() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        let mut worst = 0f32;
        for i in 0..=400_000 {
            let x = -87.0 + 175.0 * i as f32 / 400_000.0;
            // SAFETY: AVX2 and FMA checked above.
            let got = unsafe { _mm256_cvtss_f32(exp8(_mm256_set1_ps(x))) };
            worst = worst.max(((got - x.exp()) / x.exp()).abs());
        }
        assert!(worst < 1e-6, "relative error {worst}");
        // SAFETY: as above.
        unsafe {
            assert_eq!(_mm256_cvtss_f32(exp8(_mm256_setzero_ps())), 1.0);
            assert!(_mm256_cvtss_f32(exp8(_mm256_set1_ps(f32::NEG_INFINITY))) < 1e-37);
            let v = _mm256_setr_ps(1.0, -2.0, 7.5, 3.0, -9.0, 0.25, 6.0, 2.0);
            assert_eq!(hmax8(v), 7.5);
            assert_eq!(hsum8(v), 8.75);
        }
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
