//! Quantized panels dequantized to f32 on AVX-512: the forms of a
//! [`PanelLayout`](crate::quant_format::PanelLayout)'s parts, its f16 scales, its i8 sub-block
//! scales, the scale and minimum of a sub-block, and a weight from its integer, each with the
//! reference dequantizer's arithmetic. The AVX-512 panel kernels (`gemm::avx512`) and the AMX
//! tile dequantizer (`amx`) both form weights with these, so their weights are the same
//! floats. (The int8 kernels of `int8_matmul` never dequantize: they multiply integers.)

use std::arch::x86_64::*;

use crate::quant_format::{MinKind, PanelLayout, ScaleKind, E2M1_VALUES};

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

/// 16 E8M0 bytes at `p` as f32 halves, bit for bit [`e8m0_half`](crate::quant_format::e8m0_half):
/// `(e - 1) << 23`, or `0x0020_0000 << e` for the subnormal `e < 2`.
///
/// # Safety
/// AVX-512F; `p` holds 16 readable bytes.
#[inline(always)]
pub(crate) unsafe fn e8m0x16(p: *const u8) -> __m512 {
    // SAFETY: the caller's promise; register operations after the load.
    unsafe {
        let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
        let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
        let subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
        let small = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2));
        _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, subnormal))
    }
}

/// The 16 scales `d` a panel-block of layout `l` starts with, as f32.
///
/// # Safety
/// AVX-512F; `blk` is a panel-block of layout `l`.
#[inline(always)]
pub(crate) unsafe fn d16(l: PanelLayout, blk: *const u8) -> __m512 {
    // SAFETY: the caller's promise: the scales are the block's first bytes.
    unsafe {
        match l.scale {
            ScaleKind::F16 => f16x16(blk),
            ScaleKind::E8M0 => e8m0x16(blk),
        }
    }
}

/// The integers of two k-rows of 16 columns from their 16 bytes of nibbles at `p` (the even
/// row in the low nibbles): each nibble less the layout's offset, or for E2M1 codes its
/// [`E2M1_VALUES`] entry (one byte shuffle before widening).
///
/// # Safety
/// AVX-512F; `p` holds 16 readable bytes; `l` has nibbles.
#[inline(always)]
pub(crate) unsafe fn nibble_rows(l: PanelLayout, p: *const u8) -> (__m512i, __m512i) {
    // SAFETY: the caller's promise; register operations after the load.
    unsafe {
        let raw = _mm_loadu_si128(p as *const __m128i);
        if l.e2m1 {
            let low = _mm_set1_epi8(0x0F);
            let table = _mm_loadu_si128(E2M1_VALUES.as_ptr() as *const __m128i);
            let even = _mm_shuffle_epi8(table, _mm_and_si128(raw, low));
            let odd = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(raw), low));
            return (_mm512_cvtepi8_epi32(even), _mm512_cvtepi8_epi32(odd));
        }
        let q = _mm512_cvtepu8_epi32(raw);
        let mut lo = _mm512_and_si512(q, _mm512_set1_epi32(0x0F));
        let mut hi = _mm512_srli_epi32::<4>(q);
        if l.nibble_offset != 0 {
            let offset = _mm512_set1_epi32(l.nibble_offset);
            lo = _mm512_sub_epi32(lo, offset);
            hi = _mm512_sub_epi32(hi, offset);
        }
        (lo, hi)
    }
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
