//! The softmax of rows of scores, `e^(s * scale - max) / sum`, in vectors: the vision towers'
//! attention, whose rows are thousands of scores long (Gemma 3's SigLIP: 4,096 patches), where
//! a scalar `expf` per score was half of a tower's time.
//!
//! One arithmetic on every path: the scale is one multiply a score, the maximum is exact in
//! any order, `e^x` is the same polynomial on AVX-512 and AVX2 (`simd::x86`), and the sum runs
//! in 16 lanes (one AVX-512 register, two AVX2 ones), score `16c + j` into lane `j`, reduced in
//! one fixed tree, the last `len % 16` scores added after it in order. So a row's bits do not
//! depend on the kernel tier, and not on the other rows.

/// Whether [`softmax_rows`] runs on this CPU: it needs AVX-512F, or AVX2 with FMA.
pub fn available() -> bool {
    super::vector_path().is_some()
}

/// Each `width`-long row of `scores` replaced by the softmax of its values times `scale`.
/// Panics if `scores` is not whole rows or [`available`] is false.
pub fn softmax_rows(scores: &mut [f32], width: usize, scale: f32) {
    let avx512 = super::vector_path().expect("the softmax kernel needs AVX-512, or AVX2 and FMA");
    if width == 0 {
        return;
    }
    assert!(
        scores.len().is_multiple_of(width),
        "{} scores are not rows of {width}",
        scores.len()
    );
    for row in scores.chunks_exact_mut(width) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU features were checked above; the kernels address only `row`.
        unsafe {
            if avx512 {
                x86::row_avx512(row, scale)
            } else {
                x86::row_avx2(row, scale)
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (row, scale, avx512);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::cpu::simd::x86::{exp, exp8, hsum8};

    /// 16 lanes' sum, as both paths reduce it: lane `j` plus lane `j + 8`, then [`hsum8`].
    ///
    /// # Safety
    /// The CPU has AVX.
    #[inline(always)]
    unsafe fn sum16(lo: __m256, hi: __m256) -> f32 {
        // SAFETY: AVX is the caller's promise; register-only intrinsics.
        unsafe { hsum8(_mm256_add_ps(lo, hi)) }
    }

    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn row_avx512(row: &mut [f32], scale: f32) {
        let n = row.len();
        let body = n - n % 16;
        let p = row.as_mut_ptr();
        // SAFETY: every load and store is of 16 values at `i < body`, inside `row`; the tail is
        // read and written through the slice.
        unsafe {
            let s = _mm512_set1_ps(scale);
            let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
            for i in (0..body).step_by(16) {
                let v = _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), s);
                _mm512_storeu_ps(p.add(i), v);
                max = _mm512_max_ps(max, v);
            }
            let mut m = _mm512_reduce_max_ps(max);
            for v in &mut row[body..] {
                *v *= scale;
                m = m.max(*v);
            }
            let mv = _mm512_set1_ps(m);
            let mut acc = _mm512_setzero_ps();
            let p = row.as_mut_ptr();
            for i in (0..body).step_by(16) {
                let e = exp(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), mv));
                _mm512_storeu_ps(p.add(i), e);
                acc = _mm512_add_ps(acc, e);
            }
            let mut sum = sum16(
                _mm512_castps512_ps256(acc),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc))),
            );
            for v in &mut row[body..] {
                *v = _mm512_cvtss_f32(exp(_mm512_set1_ps(*v - m)));
                sum += *v;
            }
            let inv = _mm512_set1_ps(1.0 / sum);
            let p = row.as_mut_ptr();
            for i in (0..body).step_by(16) {
                _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), inv));
            }
            let inv = 1.0 / sum;
            for v in &mut row[body..] {
                *v *= inv;
            }
        }
    }

    /// [`row_avx512`] on AVX2: each 16 scores as two halves of 8, the same lanes summed.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row_avx2(row: &mut [f32], scale: f32) {
        let n = row.len();
        let body = n - n % 16;
        let p = row.as_mut_ptr();
        // SAFETY: every load and store is of 8 values at `i + 8 <= body`, inside `row`; the
        // tail is read and written through the slice.
        unsafe {
            let s = _mm256_set1_ps(scale);
            let mut max = _mm256_set1_ps(f32::NEG_INFINITY);
            for i in (0..body).step_by(8) {
                let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), s);
                _mm256_storeu_ps(p.add(i), v);
                max = _mm256_max_ps(max, v);
            }
            let mut m = crate::cpu::simd::x86::hmax8(max);
            for v in &mut row[body..] {
                *v *= scale;
                m = m.max(*v);
            }
            let mv = _mm256_set1_ps(m);
            let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let p = row.as_mut_ptr();
            for i in (0..body).step_by(16) {
                let a = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv));
                let b = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), mv));
                _mm256_storeu_ps(p.add(i), a);
                _mm256_storeu_ps(p.add(i + 8), b);
                lo = _mm256_add_ps(lo, a);
                hi = _mm256_add_ps(hi, b);
            }
            let mut sum = sum16(lo, hi);
            for v in &mut row[body..] {
                *v = _mm256_cvtss_f32(exp8(_mm256_set1_ps(*v - m)));
                sum += *v;
            }
            let inv = _mm256_set1_ps(1.0 / sum);
            let p = row.as_mut_ptr();
            for i in (0..body).step_by(8) {
                _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv));
            }
            let inv = 1.0 / sum;
            for v in &mut row[body..] {
                *v *= inv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(width: usize, n: usize) -> Vec<f32> {
        (0..width * n)
            .map(|i| ((i * 7919 + 13) % 2003) as f32 / 100.0 - 10.0)
            .collect()
    }

    /// Against the definition in f64, and the same bits on AVX-512 and AVX2 where this CPU has
    /// both (each path called directly: capping the tier is process-wide, and other tests run
    /// beside this one), for widths with and without a tail of fewer than 16.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn rows_match_the_definition_and_both_paths() {
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let avx512 = is_x86_feature_detected!("avx512f");
        if !avx2 {
            eprintln!("skipped: no AVX2 with FMA");
            return;
        }
        for width in [1, 7, 16, 17, 40, 4096] {
            let input = rows(width, 3);
            let run = |wide: bool| {
                let mut got = input.clone();
                for row in got.chunks_exact_mut(width) {
                    // SAFETY: the features were checked above (AVX-512 only where `wide`).
                    unsafe {
                        if wide {
                            x86::row_avx512(row, 0.125)
                        } else {
                            x86::row_avx2(row, 0.125)
                        }
                    }
                }
                got
            };
            let got = run(false);
            for (row, src) in got.chunks_exact(width).zip(input.chunks_exact(width)) {
                let scaled = |v: f32| f64::from(v * 0.125);
                let max = src.iter().map(|&v| scaled(v)).fold(f64::MIN, f64::max);
                let total: f64 = src.iter().map(|&v| (scaled(v) - max).exp()).sum();
                for (&g, &v) in row.iter().zip(src) {
                    let want = (scaled(v) - max).exp() / total;
                    assert!(
                        (f64::from(g) - want).abs() < 1e-6 * want.max(1e-3),
                        "width {width}: {g} vs {want}"
                    );
                }
            }
            if avx512 {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&run(true)),
                    bits(&got),
                    "width {width}: the paths differ"
                );
            }
        }
    }
}
