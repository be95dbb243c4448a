//! The legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and MXFP4) from weight panels: 16 weight rows
//! interleaved so that 4 weights of each row sit side by side, 64 bytes a step of 4 weights.
//! On AVX-512 VNNI one `vpdpbusd` multiplies a step's 64 bytes by the same 4 activations,
//! broadcast; on AVX2 each half of 8 rows takes `vpmaddubsw` and `vpmaddwd`. Either way a
//! 32-bit lane belongs to one weight row for the whole product: no horizontal sums, and the
//! float epilogue runs on 16 (8) outputs at once. The unpacked weights serve up to
//! [`act_rows`] activation rows.
//!
//! The arithmetic is the legacy formats' one (module docs of `int8_matmul`): per block of 32
//! the exact integer `isum = sum((q - offset) * xq)`, then
//! [`legacy_block`](super::legacy_block)'s fused multiply-adds, lane by lane, and
//! [`legacy_total`](super::legacy_total). Each output is the scalar oracle's float, bit for
//! bit, on both instruction sets.
//!
//! The panels hold every weight unsigned, `u = q + offset` (Q4_0's nibble as it is, offset 8;
//! Q5_0's five bits, 16; Q8_0's byte plus 128; Q4_1's and Q5_1's as they are, offset 0), since
//! `vpdpbusd` multiplies unsigned bytes by signed ones. MXFP4's panels hold its E2M1 codes,
//! which the kernels turn into `u = E2M1_VALUES[code] + 12` (0..=24, offset 12) by one byte
//! shuffle of the nibbles against [`FP4_UNSIGNED`]. How the integers stay exact:
//! - AVX-512 VNNI: `isum = dot(u, xq) - offset * sum(xq)`, the second term the row's integer
//!   sum of the block's activations; `|isum| <= 32 * 128 * 127`.
//! - AVX2: `vpmaddubsw` adds two products into 16 bits, at most 2 * 31 * 127 for the nibble
//!   formats; Q8_0's `u` would reach 2 * 255 * 127, past 16 bits, so Q8_0 takes the signed
//!   `q = u - 128` as `|q|` with its sign moved onto the activation (at most 2 * 128 * 127),
//!   which needs no offset.
//!
//! The layout ([`put`]) keeps a panel's blocks in order, each a whole number of cache lines.
//! Step `j` (weights `4j..4j + 4` of the block) is 64 bytes `[row][e]`:
//! - Q4_0, Q4_1, 320 bytes: 256 bytes of nibbles, byte `[row][e]` of step `j < 4` holding
//!   weight `4j + e` low and weight `16 + 4j + e` (step `j + 4`) high, as GGUF byte `4j + e`
//!   does; the 16 rows' `d` (f16) at 256; Q4_1's minimums `m` at 288.
//! - Q5_0, Q5_1, 384 bytes: Q4's nibbles, then at 256 64 bytes `[row][e]` whose bit `j` is the
//!   fifth bit of step `j`'s weight; `d` at 320; Q5_1's `m` at 352.
//! - Q8_0, 576 bytes: 8 steps of 64 bytes `u`, then `d` at 512 (and 32 bytes of padding).
//! - MXFP4, 320 bytes: Q4_0's nibbles (the E2M1 codes), then at 256 the 16 rows' scales
//!   `e8m0_half(e)` as f32 (an E8M0 scale is no f16: 2^-128 .. 2^127), which the epilogue
//!   multiplies as the other formats' `d`: llama.cpp's `ggml_vec_dot_mxfp4_q8_0` is
//!   `sum(E2M1_VALUES[code] * xq)` times `xd * e8m0_half(e)` per block, as
//!   [`legacy_block`](super::legacy_block) computes it.

use std::arch::x86_64::*;

use super::panels::{self, PANEL_ROWS};
use super::x86::{for_rows, four, or_masked, prefetch_ahead, store_panel};
use super::{QuantFormat, BLOCK};
use crate::quant_format::{DecodedBlock, E2M1_VALUES};

/// [`E2M1_VALUES`] plus 12, the unsigned weights `u` of MXFP4's codes in a panel kernel.
const FP4_UNSIGNED: [i8; 16] = {
    let mut u = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        u[i] = E2M1_VALUES[i] + FP4_OFFSET as i8;
        i += 1;
    }
    u
};

/// The offset of MXFP4's `u`: the most negative E2M1 value's magnitude.
const FP4_OFFSET: i32 = 12;

/// Activation rows one pass over a panel serves: 8 on AVX-512 (32 registers), 4 on AVX2 (16).
pub(super) fn act_rows(vnni: bool) -> usize {
    if vnni {
        8
    } else {
        4
    }
}

/// Whether [`put`] and [`rows_dot`] take `format`: every legacy format.
pub(super) fn supports(format: QuantFormat) -> bool {
    !format.is_k_quant()
}

/// Bytes of one panel block of `format`.
pub(super) fn block_bytes(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Mxfp4 => 320,
        QuantFormat::Q5_0 | QuantFormat::Q5_1 => 384,
        _ => 576,
    }
}

/// Where a panel block of `format` keeps its 16 scales `d`; the minimums follow, 32 bytes on.
fn scales_at(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Mxfp4 => 256,
        QuantFormat::Q5_0 | QuantFormat::Q5_1 => 320,
        _ => 512,
    }
}

/// The bytes of the fifth bits in a Q5_0 or Q5_1 panel block.
const FIFTH_BITS: usize = 256;

/// `offset` of the module docs: what the panels add to the signed weight `q`.
fn offset(format: QuantFormat) -> i32 {
    match format {
        QuantFormat::Q4_0 => 8,
        QuantFormat::Q5_0 => 16,
        QuantFormat::Q8_0 => 128,
        QuantFormat::Mxfp4 => FP4_OFFSET,
        _ => 0,
    }
}

/// Row `r` of the panel block `dst` of `format` (one [`supports`]): what [`panels::repack`]
/// writes each block with.
pub(super) fn put(format: QuantFormat, blk: &DecodedBlock, r: usize, dst: &mut [u8]) {
    // The decoded `q` is Q4_0's nibble, Q5_0's and Q8_0's signed value, Q4_1's and Q5_1's
    // unsigned one: `u` adds what `offset` takes away. MXFP4's is its code, kept as it is
    // (the kernels look its `u` up).
    let add = match format {
        QuantFormat::Q5_0 => 16,
        QuantFormat::Q8_0 => 128,
        _ => 0,
    };
    let u: [u8; BLOCK] = std::array::from_fn(|i| (blk.q[i] as i32 + add) as u8);
    if format == QuantFormat::Q8_0 {
        for j in 0..8 {
            dst[64 * j + 4 * r..][..4].copy_from_slice(&u[4 * j..][..4]);
        }
    } else {
        for j in 0..4 {
            for e in 0..4 {
                dst[64 * j + 4 * r + e] = (u[4 * j + e] & 0x0F) | (u[16 + 4 * j + e] & 0x0F) << 4;
            }
        }
        if matches!(format, QuantFormat::Q5_0 | QuantFormat::Q5_1) {
            for e in 0..4 {
                dst[FIFTH_BITS + 4 * r + e] =
                    (0..8).fold(0u8, |byte, j| byte | ((u[4 * j + e] >> 4) & 1) << j);
            }
        }
    }
    let s = scales_at(format);
    if format == QuantFormat::Mxfp4 {
        dst[s + 4 * r..][..4].copy_from_slice(&format.scale(blk).to_le_bytes());
        return;
    }
    dst[s + 2 * r..][..2].copy_from_slice(&blk.d.to_le_bytes());
    if super::legacy_has_min(format) {
        dst[s + 32 + 2 * r..][..2].copy_from_slice(&blk.m.to_le_bytes());
    }
}

/// Every activation row of a product, quantized in blocks of 32 (`Blocks32`): row `r`'s
/// quants at `r * cols`, its scales and sums at `r * cols / 32`.
pub(super) struct PanelActs<'a> {
    pub quants: &'a [i8],
    pub scales: &'a [f32],
    pub isums: &'a [i32],
    pub sums: &'a [f32],
    pub cols: usize,
}

/// One activation row's values, where the kernels read them.
#[derive(Clone, Copy)]
struct RowAt {
    quants: *const i8,
    scales: *const f32,
    isums: *const i32,
    sums: *const f32,
}

impl PanelActs<'_> {
    /// Rows `first..first + M`.
    ///
    /// # Safety
    /// `self` holds rows `first..first + M`, each of `cols` quants with a scale and two sums
    /// per 32.
    #[inline(always)]
    unsafe fn rows<const M: usize>(&self, first: usize) -> [RowAt; M] {
        let cols = self.cols;
        debug_assert!((first + M) * cols <= self.quants.len());
        debug_assert!((first + M) * cols / BLOCK <= self.scales.len());
        debug_assert!((first + M) * cols / BLOCK <= self.isums.len());
        debug_assert!((first + M) * cols / BLOCK <= self.sums.len());
        // SAFETY: inside the slices for rows `first..first + M` (the caller's promise).
        std::array::from_fn(|m| unsafe {
            let r = first + m;
            RowAt {
                quants: self.quants.as_ptr().add(r * cols),
                scales: self.scales.as_ptr().add(r * cols / BLOCK),
                isums: self.isums.as_ptr().add(r * cols / BLOCK),
                sums: self.sums.as_ptr().add(r * cols / BLOCK),
            }
        })
    }
}

/// Each weight row of `panels` (whole panels of `format`, [`panel_bytes`] each, 64-byte
/// aligned, holding `weight_rows` rows) against activation rows `rows` of `acts`:
/// `dots[a * weight_rows + i]` is weight row `i` times activation row `rows.start + a`. On
/// AVX-512 VNNI when `vnni`, else on AVX2.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and AVX-512 F, BW, VL and VNNI if `vnni`; `format`
/// [`supports`]; `panels` are [`panels::repack`]'s by [`put`], of `acts.cols` weights; `acts` holds every row of
/// `rows`; `rows` has 1 to [`act_rows`]`(vnni)` rows and `dots` holds `rows.len()` per weight
/// row.
pub(super) unsafe fn rows_dot(
    format: QuantFormat,
    panels: &[u8],
    weight_rows: usize,
    acts: &PanelActs<'_>,
    rows: std::ops::Range<usize>,
    dots: &mut [f32],
    vnni: bool,
) {
    debug_assert_eq!(weight_rows * rows.len(), dots.len());
    debug_assert!(rows.len() <= act_rows(vnni));
    let (first, n) = (rows.start, rows.len());
    // SAFETY: forwarded from the caller, with `M` the length of `rows`.
    unsafe {
        let args = (format, panels, weight_rows, acts, first, dots);
        if vnni {
            for_rows!(n, by_format_vnni, [1, 2, 3, 4, 5, 6, 7], 8, args)
        } else {
            for_rows!(n, by_format_avx2, [1, 2, 3], 4, args)
        }
    }
}

/// The constants of a format's kernel: whether its weights have a fifth bit, a minimum, are
/// whole bytes (Q8_0), or are E2M1 codes with f32 scales (MXFP4).
macro_rules! by_format {
    ($format:expr, $kernel:ident, $($args:expr),*) => {
        match $format {
            QuantFormat::Q4_0 => $kernel::<M, false, false, false, false>($($args),*),
            QuantFormat::Q4_1 => $kernel::<M, false, true, false, false>($($args),*),
            QuantFormat::Q5_0 => $kernel::<M, true, false, false, false>($($args),*),
            QuantFormat::Q5_1 => $kernel::<M, true, true, false, false>($($args),*),
            QuantFormat::Mxfp4 => $kernel::<M, false, false, false, true>($($args),*),
            _ => $kernel::<M, false, false, true, false>($($args),*),
        }
    };
}

/// # Safety
/// As [`rows_dot`] with `vnni`, for rows `first..first + M`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn by_format_vnni<const M: usize>(
    format: QuantFormat,
    panels: &[u8],
    weight_rows: usize,
    acts: &PanelActs<'_>,
    first: usize,
    dots: &mut [f32],
) {
    // SAFETY: rows `first..first + M` are in `acts` (the caller's promise).
    let rows = unsafe { acts.rows::<M>(first) };
    let bytes = panels::panel_bytes(format, acts.cols, block_bytes(format));
    let (off, s_at, bb) = (offset(format), scales_at(format), block_bytes(format));
    for (p, panel) in panels.chunks_exact(bytes).enumerate() {
        // SAFETY: forwarded from the caller; the features are enabled on this function.
        let acc = unsafe { by_format!(format, vnni_panel, panel, &rows, off, s_at, bb) };
        // SAFETY: AVX-512 F is enabled on this function.
        unsafe { store_panel(&acc, p, weight_rows, dots) };
    }
}

/// # Safety
/// As [`rows_dot`] without `vnni`, for rows `first..first + M`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn by_format_avx2<const M: usize>(
    format: QuantFormat,
    panels: &[u8],
    weight_rows: usize,
    acts: &PanelActs<'_>,
    first: usize,
    dots: &mut [f32],
) {
    // SAFETY: rows `first..first + M` are in `acts` (the caller's promise).
    let rows = unsafe { acts.rows::<M>(first) };
    let bytes = panels::panel_bytes(format, acts.cols, block_bytes(format));
    let (off, s_at, bb) = (offset(format), scales_at(format), block_bytes(format));
    for (p, panel) in panels.chunks_exact(bytes).enumerate() {
        let first = p * PANEL_ROWS;
        let valid = PANEL_ROWS.min(weight_rows - first);
        let mut out = [[0f32; PANEL_ROWS]; M];
        for half in 0..2 {
            // SAFETY: forwarded from the caller; the features are enabled on this function.
            let acc = unsafe { by_format!(format, avx2_half, panel, &rows, off, s_at, bb, half) };
            for (out, acc) in out.iter_mut().zip(acc) {
                // SAFETY: AVX is enabled on this function; 8 floats from `8 * half`, inside 16.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * half), acc) };
            }
        }
        for (m, out) in out.iter().enumerate() {
            dots[m * weight_rows + first..][..valid].copy_from_slice(&out[..valid]);
        }
    }
}

/// As [`four`], in every 32-bit lane of 256 bits.
///
/// # Safety
/// The CPU has AVX; `at + 4` is within the row's quants.
#[inline(always)]
unsafe fn four8(row: &RowAt, at: usize) -> __m256i {
    // SAFETY: the caller's promise; unaligned read of 4 bytes.
    unsafe { _mm256_set1_epi32((row.quants.add(at) as *const i32).read_unaligned()) }
}

/// One panel against `M` rows on AVX-512 VNNI: per row, the 16 weight rows' results. `FIVE`:
/// the weights have a fifth bit; `MIN`: a minimum; `EIGHT`: they are Q8_0's bytes; `FP4`:
/// MXFP4's codes and f32 scales. `off` is the format's [`offset`], `s_at` its [`scales_at`],
/// `bb` its [`block_bytes`].
///
/// # Safety
/// As [`rows_dot`] with `vnni`, for one panel.
#[inline(always)]
unsafe fn vnni_panel<
    const M: usize,
    const FIVE: bool,
    const MIN: bool,
    const EIGHT: bool,
    const FP4: bool,
>(
    panel: &[u8],
    rows: &[RowAt; M],
    off: i32,
    s_at: usize,
    bb: usize,
) -> [__m512; M] {
    // SAFETY: reads inside block `b` of the panel at the layout's offsets (module docs) and
    // inside block `b` of each row; the rest is the caller's promise.
    unsafe {
        let low = _mm512_set1_epi8(0x0F);
        let bit4 = _mm512_set1_epi8(0x10);
        let zero = _mm512_setzero_si512();
        let fp4 = _mm512_broadcast_i32x4(_mm_loadu_si128(FP4_UNSIGNED.as_ptr() as *const __m128i));
        let load = |p: *const u8, at: usize| _mm512_loadu_si512(p.add(at) as *const __m512i);
        let mut main = [_mm512_setzero_ps(); M];
        let mut mins = [_mm512_setzero_ps(); M];
        for (b, blk) in panel.chunks_exact(bb).enumerate() {
            prefetch_ahead(blk);
            let p = blk.as_ptr();
            let w: [__m512i; 8] = if EIGHT {
                std::array::from_fn(|j| load(p, 64 * j))
            } else {
                let nib = [load(p, 0), load(p, 64), load(p, 128), load(p, 192)];
                let mut w = [zero; 8];
                for j in 0..4 {
                    w[j] = _mm512_and_si512(nib[j], low);
                    w[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(nib[j]), low);
                }
                if FIVE {
                    // Bit j of each byte to bit 4 of step j's weight.
                    let h = load(p, FIFTH_BITS);
                    w[0] = or_masked(w[0], _mm512_slli_epi16::<4>(h), bit4);
                    w[1] = or_masked(w[1], _mm512_slli_epi16::<3>(h), bit4);
                    w[2] = or_masked(w[2], _mm512_slli_epi16::<2>(h), bit4);
                    w[3] = or_masked(w[3], _mm512_slli_epi16::<1>(h), bit4);
                    w[4] = or_masked(w[4], h, bit4);
                    w[5] = or_masked(w[5], _mm512_srli_epi16::<1>(h), bit4);
                    w[6] = or_masked(w[6], _mm512_srli_epi16::<2>(h), bit4);
                    w[7] = or_masked(w[7], _mm512_srli_epi16::<3>(h), bit4);
                }
                if FP4 {
                    // Each code's `u`, looked up within its 128-bit lane.
                    for w in &mut w {
                        *w = _mm512_shuffle_epi8(fp4, *w);
                    }
                }
                w
            };
            let x0 = b * BLOCK;
            // `- offset * sum(xq)` first, then the 8 steps, row after row at each step so
            // that neighbouring instructions are independent.
            let mut t: [__m512i; M] = std::array::from_fn(|m| {
                if off == 0 {
                    zero
                } else {
                    _mm512_set1_epi32(-off * *rows[m].isums.add(b))
                }
            });
            for (j, w) in w.iter().enumerate() {
                for (row, t) in rows.iter().zip(t.iter_mut()) {
                    *t = _mm512_dpbusd_epi32(*t, *w, four(row.quants, x0 + 4 * j));
                }
            }
            let d = if FP4 {
                _mm512_loadu_ps(p.add(s_at) as *const f32)
            } else {
                _mm512_cvtph_ps(_mm256_loadu_si256(p.add(s_at) as *const __m256i))
            };
            for ((row, t), main) in rows.iter().zip(t).zip(main.iter_mut()) {
                let xd = _mm512_set1_ps(*row.scales.add(b));
                *main = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(d, xd), *main);
            }
            if MIN {
                let m = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(s_at + 32) as *const __m256i));
                for (row, mins) in rows.iter().zip(mins.iter_mut()) {
                    *mins = _mm512_fmadd_ps(m, _mm512_set1_ps(*row.sums.add(b)), *mins);
                }
            }
        }
        std::array::from_fn(|m| _mm512_add_ps(main[m], mins[m]))
    }
}

/// Half `half` of one panel (its rows `8 * half..8 * half + 8`) against `M` rows on AVX2, as
/// [`vnni_panel`] computes them.
///
/// # Safety
/// As [`rows_dot`] without `vnni`, for one panel; `half` is 0 or 1.
#[inline(always)]
unsafe fn avx2_half<
    const M: usize,
    const FIVE: bool,
    const MIN: bool,
    const EIGHT: bool,
    const FP4: bool,
>(
    panel: &[u8],
    rows: &[RowAt; M],
    off: i32,
    s_at: usize,
    bb: usize,
    half: usize,
) -> [__m256; M] {
    // SAFETY: reads inside block `b` of the panel at the layout's offsets (module docs), the
    // half's 32 bytes of each 64, and inside block `b` of each row; the rest is the caller's
    // promise.
    unsafe {
        let low = _mm256_set1_epi8(0x0F);
        let bit4 = _mm256_set1_epi8(0x10);
        let flip = _mm256_set1_epi8(-128);
        let ones = _mm256_set1_epi16(1);
        let zero = _mm256_setzero_si256();
        let fp4 =
            _mm256_broadcastsi128_si256(_mm_loadu_si128(FP4_UNSIGNED.as_ptr() as *const __m128i));
        let h0 = 32 * half;
        let load = |p: *const u8, at: usize| _mm256_loadu_si256(p.add(at + h0) as *const __m256i);
        let mut main = [_mm256_setzero_ps(); M];
        let mut mins = [_mm256_setzero_ps(); M];
        for (b, blk) in panel.chunks_exact(bb).enumerate() {
            if half == 0 {
                prefetch_ahead(blk);
            }
            let p = blk.as_ptr();
            let x0 = b * BLOCK;
            // Q8_0 goes signed (no offset); the others `- offset * sum(xq)` first.
            let mut t: [__m256i; M] = std::array::from_fn(|m| {
                if EIGHT || off == 0 {
                    zero
                } else {
                    _mm256_set1_epi32(-off * *rows[m].isums.add(b))
                }
            });
            let fifth = if FIVE { load(p, FIFTH_BITS) } else { zero };
            for j in 0..8 {
                let w = if EIGHT {
                    _mm256_xor_si256(load(p, 64 * j), flip)
                } else {
                    let nib = load(p, 64 * (j % 4));
                    let mut w = if j < 4 {
                        _mm256_and_si256(nib, low)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16::<4>(nib), low)
                    };
                    if FIVE {
                        let bit = match j {
                            0 => _mm256_slli_epi16::<4>(fifth),
                            1 => _mm256_slli_epi16::<3>(fifth),
                            2 => _mm256_slli_epi16::<2>(fifth),
                            3 => _mm256_slli_epi16::<1>(fifth),
                            4 => fifth,
                            5 => _mm256_srli_epi16::<1>(fifth),
                            6 => _mm256_srli_epi16::<2>(fifth),
                            _ => _mm256_srli_epi16::<3>(fifth),
                        };
                        w = _mm256_or_si256(w, _mm256_and_si256(bit, bit4));
                    }
                    if FP4 {
                        w = _mm256_shuffle_epi8(fp4, w);
                    }
                    w
                };
                let magnitude = if EIGHT { _mm256_sign_epi8(w, w) } else { w };
                for (row, t) in rows.iter().zip(t.iter_mut()) {
                    let x = four8(row, x0 + 4 * j);
                    let x = if EIGHT { _mm256_sign_epi8(x, w) } else { x };
                    let pairs = _mm256_maddubs_epi16(magnitude, x);
                    *t = _mm256_add_epi32(*t, _mm256_madd_epi16(pairs, ones));
                }
            }
            let d = if FP4 {
                _mm256_loadu_ps(p.add(s_at + 32 * half) as *const f32)
            } else {
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(s_at + 16 * half) as *const __m128i))
            };
            for ((row, t), main) in rows.iter().zip(t).zip(main.iter_mut()) {
                let xd = _mm256_set1_ps(*row.scales.add(b));
                *main = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(d, xd), *main);
            }
            if MIN {
                let m = _mm256_cvtph_ps(_mm_loadu_si128(
                    p.add(s_at + 32 + 16 * half) as *const __m128i
                ));
                for (row, mins) in rows.iter().zip(mins.iter_mut()) {
                    *mins = _mm256_fmadd_ps(m, _mm256_set1_ps(*row.sums.add(b)), *mins);
                }
            }
        }
        std::array::from_fn(|m| _mm256_add_ps(main[m], mins[m]))
    }
}
