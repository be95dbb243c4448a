//! Quantized panels dequantized to f32 on AVX-512: the forms of a
//! [`PanelLayout`](crate::quant_format::PanelLayout)'s parts, its f16 scales, its i8 sub-block
//! scales, the scale and minimum of a sub-block, and a weight from its integer, each with the
//! reference dequantizer's arithmetic. The AVX-512 panel kernels (`gemm::avx512`) and the AMX
//! tile dequantizer (`amx`) both form weights with these, so their weights are the same
//! floats. (The int8 kernels of `int8_matmul` never dequantize: they multiply integers.)

use std::arch::x86_64::*;

use crate::quant_format::{MinKind, PanelLayout};

/// A weight from its integer `q` (as f32), scale `s` and minimum `m`: the reference's rounded
/// product then rounded add or subtract, in one fused instruction whose product is exact (see
/// `gemm::avx2::weight`, whose arithmetic this is lane for lane).
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
pub(crate) unsafe fn weight(min: MinKind, q: __m512, s: __m512, m: __m512) -> __m512 {
    // SAFETY: register arithmetic only; the callers run with AVX-512F enabled.
    unsafe {
        match min {
            MinKind::None => _mm512_mul_ps(q, s),
            MinKind::AddF16 => _mm512_fmadd_ps(q, s, m),
            MinKind::SubScaled => _mm512_fmsub_ps(q, s, m),
        }
    }
}

/// 16 f16 at `p` as f32.
///
/// # Safety
/// AVX-512F; `p` holds 32 readable bytes.
#[inline(always)]
pub(crate) unsafe fn f16x16(p: *const u8) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
}

/// 16 signed bytes at `p` as f32.
///
/// # Safety
/// AVX-512F; `p` holds 16 readable bytes.
#[inline(always)]
pub(crate) unsafe fn i8x16(p: *const u8) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))) }
}

/// The scales and minimums of one panel-block's sub-block `sub`, from its `d` and `m`.
///
/// # Safety
/// AVX-512F; `blk` is a panel-block of layout `l`.
#[inline(always)]
pub(crate) unsafe fn sub_scales(
    l: PanelLayout,
    blk: *const u8,
    sub: usize,
    d: __m512,
    m: __m512,
) -> (__m512, __m512) {
    // SAFETY: the offsets are inside the panel-block by its layout: the caller's promise.
    unsafe {
        if !l.sub_scales {
            return (d, m);
        }
        let s = _mm512_mul_ps(d, i8x16(blk.add(l.scales_at() + sub * 16)));
        let o = if l.min == MinKind::SubScaled {
            _mm512_mul_ps(m, i8x16(blk.add(l.mins_at() + sub * 16)))
        } else {
            m
        };
        (s, o)
    }
}
