//! The AVX-512 VNNI row dot of the legacy formats (Q4_0, Q4_1, Q8_0): `vpdpbusd` over a block's
//! 32 bytes. Unverified on the project's AVX2-only CI host; the AVX2 kernels (`avx2.rs`) cover
//! every format elsewhere.

use std::arch::x86_64::*;

use super::avx2::hsum;
use super::{f16_at, ActRow, QuantFormat, BLOCK};

/// One weight row against one activation row. Per block: the 32 weight quants as unsigned
/// bytes (nibbles, or |q| for Q8_0 with the sign moved onto the activations), `vpdpbusd`
/// against the activation bytes, and the 8 partial sums scaled into a float accumulator;
/// the horizontal sum happens once per row.
///
/// # Safety
/// The CPU has the features enabled below (see `simd_available`); `w` is one weight row of
/// `format` blocks and `a` an activation row of the same number of blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma,avx2")]
pub(super) unsafe fn row_dot(format: QuantFormat, w: &[u8], a: &ActRow<'_>) -> f32 {
    // SAFETY: the CPU features and the matching sizes of `w` and `a` are the caller's promise; each
    // block's loads read inside its block (and the prefetch never faults).
    unsafe {
        let bb = format.block_bytes();
        let nb = w.len() / bb;
        let mut acc = _mm256_setzero_ps();
        let mut extra = 0f32;
        let low = _mm_set1_epi8(0x0F);
        let wp = w.as_ptr();
        let xp = a.quants.as_ptr();
        for b in 0..nb {
            // Stream ahead of the loads: rows are consecutive, so this reaches into the next.
            _mm_prefetch::<_MM_HINT_T0>(wp.add(b * bb + 512) as *const i8);
            let blk = std::slice::from_raw_parts(wp.add(b * bb), bb);
            let x = _mm256_loadu_si256(xp.add(b * BLOCK) as *const __m256i);
            let d = f16_at(blk, 0) * *a.scales.get_unchecked(b);
            let dot = match format {
                QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                    let off = if format == QuantFormat::Q4_1 { 4 } else { 2 };
                    let qs = _mm_loadu_si128(blk.as_ptr().add(off) as *const __m128i);
                    let lo = _mm_and_si128(qs, low);
                    let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low);
                    let q = _mm256_set_m128i(hi, lo);
                    if format == QuantFormat::Q4_1 {
                        extra += f16_at(blk, 2) * *a.sums.get_unchecked(b);
                    } else {
                        extra -= d * (8 * *a.int_sums.get_unchecked(b)) as f32;
                    }
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, x)
                }
                // Q8_0: `new` admits the legacy layouts only.
                _ => {
                    let q = _mm256_loadu_si256(blk.as_ptr().add(2) as *const __m256i);
                    _mm256_dpbusd_epi32(
                        _mm256_setzero_si256(),
                        _mm256_sign_epi8(q, q),
                        _mm256_sign_epi8(x, q),
                    )
                }
            };
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d), acc);
        }
        hsum(acc) + extra
    }
}
