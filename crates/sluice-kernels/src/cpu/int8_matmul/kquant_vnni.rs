//! The K-quants (Q4_K, Q5_K, Q6_K) on AVX-512 VNNI from weight panels: 16 weight rows interleaved so that one
//! `vpdpbusd` multiplies 4 weights of each of the 16 rows by the same 4 activations, broadcast.
//! Each 32-bit lane then belongs to one weight row for the whole product: no horizontal sums,
//! no permutes of the activations, and the float epilogue runs on 16 outputs at once. The
//! unpacked weights serve up to [`PANEL_ACT_ROWS`] activation rows.
//!
//! The arithmetic is the K-quants' one (module docs of `int8_matmul`): per super-block the
//! exact integers `isum` and `imin`, then [`k_super_block`](super::k_super_block)'s two fused
//! multiply-adds, here as a vector `fmadd` by `d * xd` and an `fnmadd` by `dmin * xd` (which
//! round as `fma` by `-(dmin * xd)`). Each output is the scalar oracle's float, bit for bit.
//!
//! How the integers stay exact:
//! - Q4_K: four `vpdpbusd`s sum 16 weights (0..15) against 16 activations (|x| <= 127) of one
//!   sub-block into a lane, at most 16 * 15 * 127 = 30480, so the lane's low 16 bits hold it
//!   and its high 16 bits its sign. `vpdpwssd` against the sub-block's scale in the low 16 bits
//!   (zero above) adds exactly `scale * sum`. `imin` is four `vpdpwssd`s of the minimums, by
//!   pairs of sub-blocks, against the row's sums of each 32, broadcast.
//! - Q5_K: as Q4_K, with the scale applied after every two `vpdpbusd`s: 8 weights (0..31),
//!   at most 8 * 31 * 127 = 31496.
//! - Q6_K: four `vpdpbusd`s sum a group of 16 weights (0..63) into a lane (at most 128016),
//!   `vpmulld` by the group's signed scale. `q - 32` is eight `vpdpwssd`s of the scales, by
//!   pairs of groups, against the row's sums of each 16, times 32, subtracted.
//!
//! The layout ([`put`]) keeps a panel's super-blocks in order, each one cache-line aligned:
//! - Q4_K, 2368 bytes: `d` and `dmin` (f16, one per row), the 8 scales (`[j][row]`), the 8
//!   minimums by pairs (`[k][row][e]` for sub-block `2k + e`), then 2048 bytes of nibbles:
//!   per pair of sub-blocks `p` and 4-weight step `j`, 64 bytes `[row][e]` whose low nibble is
//!   weight `4j + e` of sub-block `2p` and high nibble the same weight of sub-block `2p + 1`.
//! - Q5_K, 2880 bytes: Q4_K's, then 512 bytes of fifth bits: per `p` and half `h` (steps
//!   `4h..4h + 4`), 64 bytes `[row][e]` whose bit `2i` is the fifth bit of step `4h + i`'s
//!   weight of sub-block `2p` and bit `2i + 1` of sub-block `2p + 1`.
//! - Q6_K, 3392 bytes (3360 in GGUF, and 32 of padding): 2048 bytes of low nibbles as Q4_K's
//!   (sub-blocks of 32 weights, each two groups of 16), 1024 of high bit pairs (per `p` and
//!   pair of steps `2i, 2i + 1`, bits 0-1, 2-3, 4-5, 6-7 of byte `[row][e]` above the nibbles
//!   of step `2i`'s low, its high, step `2i + 1`'s low and its high), `d` (f16, one per row),
//!   then the 16 scales by pairs (`[k][row][e]` for group `2k + e`).

use std::arch::x86_64::*;

use super::panels;
use super::x86::{for_rows, four, or_masked, prefetch_ahead, store_panel};
use super::{QuantFormat, SUPER};
use crate::quant_format::DecodedBlock;

/// Activation rows one pass over a panel serves (at most 8: [`rows_dot`] instantiates its
/// kernels for 1 to 8). Measured with `benches/gemm.rs`: 12 and 16 were no faster.
pub(super) const PANEL_ACT_ROWS: usize = 8;

const Q4K_BYTES: usize = 2368;
const Q5K_BYTES: usize = 2880;
const Q5K_HIGH: usize = 2368;
const Q4K_SCALES: usize = 64;
const Q4K_MINS: usize = 192;
const Q4K_NIBBLES: usize = 320;

const Q6K_BYTES: usize = 3392;
const Q6K_HIGH: usize = 2048;
const Q6K_D: usize = 3072;
const Q6K_SCALES: usize = 3104;

/// Whether [`put`] and [`rows_dot`] take `format`.
pub(super) fn supports(format: QuantFormat) -> bool {
    matches!(
        format,
        QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K
    )
}

/// Bytes of one panel's super-block of `format` (one [`supports`]).
pub(super) fn block_bytes(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Q4K => Q4K_BYTES,
        QuantFormat::Q5K => Q5K_BYTES,
        _ => Q6K_BYTES,
    }
}

/// Row `r` of the panel super-block `dst` of `format` (one [`supports`]): what
/// [`panels::repack`] writes each block with.
pub(super) fn put(format: QuantFormat, blk: &DecodedBlock, r: usize, dst: &mut [u8]) {
    debug_assert!(supports(format));
    match format {
        QuantFormat::Q4K | QuantFormat::Q5K => put_q4_k(blk, r, dst),
        _ => put_q6_k(blk, r, dst),
    }
}

/// Row `r` of a Q4_K (or Q5_K, by the length of `dst`) panel super-block `dst`.
fn put_q4_k(blk: &DecodedBlock, r: usize, dst: &mut [u8]) {
    dst[2 * r..][..2].copy_from_slice(&blk.d.to_le_bytes());
    dst[32 + 2 * r..][..2].copy_from_slice(&blk.m.to_le_bytes());
    for j in 0..8 {
        dst[Q4K_SCALES + 16 * j + r] = blk.sc[j] as u8;
        dst[Q4K_MINS + 32 * (j / 2) + 2 * r + j % 2] = blk.mn[j] as u8;
    }
    let low: [i8; SUPER] = std::array::from_fn(|i| blk.q[i] & 0x0F);
    put_nibbles(&low, r, &mut dst[Q4K_NIBBLES..][..2048]);
    if dst.len() == Q5K_BYTES {
        for p in 0..4 {
            for h in 0..2 {
                for e in 0..4 {
                    let mut byte = 0u8;
                    for i in 0..4 {
                        // Step 4h + i of sub-blocks 2p (bit 2i) and 2p + 1 (bit 2i + 1).
                        let at = |s: usize| (blk.q[32 * s + 4 * (4 * h + i) + e] as u8 >> 4) & 1;
                        byte |= at(2 * p) << (2 * i) | at(2 * p + 1) << (2 * i + 1);
                    }
                    dst[Q5K_HIGH + 128 * p + 64 * h + 4 * r + e] = byte;
                }
            }
        }
    }
}

/// Row `r` of a Q6_K panel super-block `dst` (the decoded `q` is `q - 32`).
fn put_q6_k(blk: &DecodedBlock, r: usize, dst: &mut [u8]) {
    let q: [u8; SUPER] = std::array::from_fn(|i| (blk.q[i] + 32) as u8);
    let low: [i8; SUPER] = std::array::from_fn(|i| (q[i] & 0x0F) as i8);
    put_nibbles(&low, r, &mut dst[..Q6K_HIGH]);
    for p in 0..4 {
        for i in 0..4 {
            let mut byte = [0u8; 4];
            for (e, byte) in byte.iter_mut().enumerate() {
                // Steps 2i and 2i + 1 of sub-blocks 2p (low nibble) and 2p + 1 (high).
                let at = |s: usize, j: usize| q[32 * s + 4 * j + e] >> 4;
                *byte = at(2 * p, 2 * i)
                    | at(2 * p + 1, 2 * i) << 2
                    | at(2 * p, 2 * i + 1) << 4
                    | at(2 * p + 1, 2 * i + 1) << 6;
            }
            dst[Q6K_HIGH + 256 * p + 64 * i + 4 * r..][..4].copy_from_slice(&byte);
        }
    }
    dst[Q6K_D + 2 * r..][..2].copy_from_slice(&blk.d.to_le_bytes());
    for g in 0..16 {
        dst[Q6K_SCALES + 32 * (g / 2) + 2 * r + g % 2] = blk.sc[g] as u8;
    }
}

/// Row `r`'s 256 values (each below 16) as the panel's nibbles: per sub-block pair `p` and
/// step `j`, byte `[r][e]` of 64 holds weight `4j + e` of sub-block `2p` low, of `2p + 1` high.
fn put_nibbles(q: &[i8; SUPER], r: usize, dst: &mut [u8]) {
    for p in 0..4 {
        for j in 0..8 {
            for e in 0..4 {
                let lo = q[64 * p + 4 * j + e] as u8;
                let hi = q[64 * p + 32 + 4 * j + e] as u8;
                dst[512 * p + 64 * j + 4 * r + e] = lo | hi << 4;
            }
        }
    }
}

/// Every activation row of a product, quantized in super-blocks (`Blocks256`): row `r`'s
/// quants at `r * cols`, its scales at `r * cols / 256`, its sums of 16 and of 32 at
/// `r * cols / 16` and `r * cols / 32`.
pub(super) struct PanelActs<'a> {
    pub quants: &'a [i8],
    pub scales: &'a [f32],
    pub sums16: &'a [i16],
    pub sums32: &'a [i16],
    pub cols: usize,
}

/// One activation row's values, where the kernels read them.
#[derive(Clone, Copy)]
struct RowAt {
    quants: *const i8,
    scales: *const f32,
    sums16: *const i16,
    sums32: *const i16,
}

/// Each weight row of `panels` (whole panels of `format`, [`panel_bytes`] each, 64-byte
/// aligned, holding `weight_rows` rows) against activation rows `rows` of `acts`:
/// `dots[a * weight_rows + i]` is weight row `i` times activation row `rows.start + a`.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI; `format` [`supports`];
/// `panels` are [`panels::repack`]'s by [`put`], of `acts.cols` weights; `acts` holds every row of `rows`, each of
/// `acts.cols` quants with their scales and sums; `rows` has 1 to [`PANEL_ACT_ROWS`] rows and
/// `dots` holds `rows.len()` per weight row.
pub(super) unsafe fn rows_dot(
    format: QuantFormat,
    panels: &[u8],
    weight_rows: usize,
    acts: &PanelActs<'_>,
    rows: std::ops::Range<usize>,
    dots: &mut [f32],
) {
    debug_assert_eq!(weight_rows * rows.len(), dots.len());
    // SAFETY: forwarded from the caller, with `M` the length of `rows`.
    unsafe {
        let args = (format, panels, weight_rows, acts, rows.start, dots);
        for_rows!(rows.len(), by_format, [1, 2, 3, 4, 5, 6, 7], 8, args)
    }
}

/// # Safety
/// As [`rows_dot`], for rows `first..first + M`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn by_format<const M: usize>(
    format: QuantFormat,
    panels: &[u8],
    weight_rows: usize,
    acts: &PanelActs<'_>,
    first: usize,
    dots: &mut [f32],
) {
    let cols = acts.cols;
    debug_assert!((first + M) * cols <= acts.quants.len());
    debug_assert!((first + M) * cols / 16 <= acts.sums16.len());
    debug_assert!((first + M) * cols / 32 <= acts.sums32.len());
    debug_assert!((first + M) * cols / SUPER <= acts.scales.len());
    // SAFETY: inside `acts` for rows `first..first + M` (the caller's promise).
    let rows: [RowAt; M] = std::array::from_fn(|m| unsafe {
        let r = first + m;
        RowAt {
            quants: acts.quants.as_ptr().add(r * cols),
            scales: acts.scales.as_ptr().add(r * cols / SUPER),
            sums16: acts.sums16.as_ptr().add(r * cols / 16),
            sums32: acts.sums32.as_ptr().add(r * cols / 32),
        }
    });
    let bytes = panels::panel_bytes(format, cols, block_bytes(format));
    for (p, panel) in panels.chunks_exact(bytes).enumerate() {
        // SAFETY: forwarded from the caller; the features are enabled on this function.
        let acc = unsafe {
            match format {
                QuantFormat::Q4K => q4_k::<M, false>(panel, &rows),
                QuantFormat::Q5K => q4_k::<M, true>(panel, &rows),
                _ => q6_k::<M>(panel, &rows),
            }
        };
        // SAFETY: AVX-512 F is enabled on this function.
        unsafe { store_panel(&acc, p, weight_rows, dots) };
    }
}

/// The prefetches of quarter `p` of a panel's super-block `blk`, asked for as the kernel
/// reaches it. A super-block is 37 to 53 cache lines; asked for all at once, at its start, they
/// left a one-row product (little arithmetic between the requests) slower than the AVX2
/// kernel's, which asks for 3 lines a GGUF block: on an AMD Zen 5 a decode step of the
/// Qwen3.6-35B-A3B shape took 21-23 ms against the AVX2 kernels' 18-20, and 13-18 ms after
/// (16 rows: 102-114 ms, then 92-94). By eighths was no faster (BENCHMARKS.md).
#[inline(always)]
fn prefetch_quarter(blk: &[u8], p: usize) {
    let quarter = blk.len() / 4;
    prefetch_ahead(&blk[p * quarter..][..quarter]);
}

/// The 16-bit values at `at` and `at + 1` of `sums` in every 32-bit lane.
///
/// # Safety
/// The CPU has AVX-512 F; `sums + at..sums + at + 2` is readable.
#[inline(always)]
unsafe fn pair(sums: *const i16, at: usize) -> __m512i {
    // SAFETY: the caller's promise; unaligned read of 4 bytes.
    unsafe { _mm512_set1_epi32((sums.add(at) as *const i32).read_unaligned()) }
}

/// The 64 bytes at `at` of `p`.
///
/// # Safety
/// The CPU has AVX-512 F; `p + at..p + at + 64` is readable.
#[inline(always)]
unsafe fn load(p: *const u8, at: usize) -> __m512i {
    // SAFETY: the caller's promise.
    unsafe { _mm512_loadu_si512(p.add(at) as *const __m512i) }
}

/// 16 f16 at `at` of `p` as floats.
///
/// # Safety
/// The CPU has AVX-512 F; `p + at..p + at + 32` is readable.
#[inline(always)]
unsafe fn halves(p: *const u8, at: usize) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.add(at) as *const __m256i)) }
}

/// `v` shifted left by `by` bits in each 16-bit lane (right for negative `by`), `by` in -3..=4:
/// what moves a packed fifth bit to bit 4 of its byte.
///
/// # Safety
/// The CPU has AVX-512 BW.
#[inline(always)]
unsafe fn shift(v: __m512i, by: i32) -> __m512i {
    // SAFETY: AVX-512 BW is the caller's promise; register operations only.
    unsafe {
        match by {
            4 => _mm512_slli_epi16::<4>(v),
            3 => _mm512_slli_epi16::<3>(v),
            2 => _mm512_slli_epi16::<2>(v),
            1 => _mm512_slli_epi16::<1>(v),
            0 => v,
            -1 => _mm512_srli_epi16::<1>(v),
            -2 => _mm512_srli_epi16::<2>(v),
            _ => _mm512_srli_epi16::<3>(v),
        }
    }
}

/// One Q4_K panel (Q5_K when `FIVE`) against `M` rows: per row, the 16 weight rows' sums.
///
/// # Safety
/// As [`rows_dot`], for one panel.
#[inline(always)]
unsafe fn q4_k<const M: usize, const FIVE: bool>(panel: &[u8], rows: &[RowAt; M]) -> [__m512; M] {
    // SAFETY: reads inside super-block `sb` of the panel at the layout's offsets (module docs)
    // and inside super-block `sb` of each row; the rest is the caller's promise.
    unsafe {
        let low = _mm512_set1_epi8(0x0F);
        let bit4 = _mm512_set1_epi8(0x10);
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); M];
        let bytes = if FIVE { Q5K_BYTES } else { Q4K_BYTES };
        for (sb, blk) in panel.chunks_exact(bytes).enumerate() {
            let b = blk.as_ptr();
            let x0 = sb * SUPER;
            let mut isum = [zero; M];
            for p in 0..4 {
                prefetch_quarter(blk, p);
                let scale = |s: usize| {
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(Q4K_SCALES + 16 * s) as _))
                };
                let (sc_lo, sc_hi) = (scale(2 * p), scale(2 * p + 1));
                // Sub-blocks 2p (`lo`, the low nibbles) and 2p + 1 (`hi`) side by side: 2 * M
                // independent sums in flight.
                let mut lo_sum = [zero; M];
                let mut hi_sum = [zero; M];
                for h in 0..2 {
                    let q = if FIVE {
                        load(b, Q5K_HIGH + 128 * p + 64 * h)
                    } else {
                        zero
                    };
                    for i in 0..4 {
                        let n = load(b, Q4K_NIBBLES + 512 * p + 256 * h + 64 * i);
                        let mut lo = _mm512_and_si512(n, low);
                        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(n), low);
                        if FIVE {
                            // Bits 2i and 2i + 1 of each byte to bit 4 of step i's weights.
                            lo = or_masked(lo, shift(q, 4 - 2 * i as i32), bit4);
                            hi = or_masked(hi, shift(q, 3 - 2 * i as i32), bit4);
                        }
                        let at = x0 + 64 * p + 16 * h + 4 * i;
                        for ((row, l), u) in rows.iter().zip(&mut lo_sum).zip(&mut hi_sum) {
                            *l = _mm512_dpbusd_epi32(*l, lo, four(row.quants, at));
                            *u = _mm512_dpbusd_epi32(*u, hi, four(row.quants, at + 32));
                        }
                        // Q4_K sums 4 steps (16 weights) a lane before the scale, Q5_K 2:
                        // at most 16 * 15 * 127 = 30480 and 8 * 31 * 127 = 31496 in
                        // magnitude, the low 16 bits exactly.
                        if i == 3 || (FIVE && i == 1) {
                            let sums = isum.iter_mut().zip(&mut lo_sum).zip(&mut hi_sum);
                            for ((isum, l), u) in sums {
                                *isum = _mm512_dpwssd_epi32(*isum, *l, sc_lo);
                                *isum = _mm512_dpwssd_epi32(*isum, *u, sc_hi);
                                (*l, *u) = (zero, zero);
                            }
                        }
                    }
                }
            }
            let mins: [__m512i; 4] = std::array::from_fn(|k| {
                _mm512_cvtepu8_epi16(_mm256_loadu_si256(b.add(Q4K_MINS + 32 * k) as _))
            });
            let d = halves(b, 0);
            let dmin = halves(b, 32);
            for ((row, isum), acc) in rows.iter().zip(isum).zip(acc.iter_mut()) {
                let mut imin = zero;
                for (k, mins) in mins.iter().enumerate() {
                    imin = _mm512_dpwssd_epi32(imin, *mins, pair(row.sums32, 8 * sb + 2 * k));
                }
                let xd = _mm512_set1_ps(*row.scales.add(sb));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, xd), *acc);
                *acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(dmin, xd), *acc);
            }
        }
        acc
    }
}

/// One Q6_K panel against `M` rows: per row, the 16 weight rows' sums.
///
/// # Safety
/// As [`rows_dot`], for one panel.
#[inline(always)]
unsafe fn q6_k<const M: usize>(panel: &[u8], rows: &[RowAt; M]) -> [__m512; M] {
    // SAFETY: reads inside super-block `sb` of the panel at the layout's offsets (module docs)
    // and inside super-block `sb` of each row; the rest is the caller's promise.
    unsafe {
        let low = _mm512_set1_epi8(0x0F);
        let high = _mm512_set1_epi8(0x30);
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); M];
        for (sb, blk) in panel.chunks_exact(Q6K_BYTES).enumerate() {
            let b = blk.as_ptr();
            let x0 = sb * SUPER;
            // Group pairs `(2k, 2k + 1)` as 16-bit lanes of each row's 32 bits.
            let pairs: [__m512i; 8] = std::array::from_fn(|k| {
                _mm512_cvtepi8_epi16(_mm256_loadu_si256(b.add(Q6K_SCALES + 32 * k) as _))
            });
            let mut isum = [zero; M];
            for p in 0..4 {
                prefetch_quarter(blk, p);
                for h in 0..2 {
                    // Steps 4h..4h + 4: groups 4p + h (sub-block 2p) and 4p + 2 + h (2p + 1).
                    let scale = |pair: __m512i| {
                        if h == 0 {
                            _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair))
                        } else {
                            _mm512_srai_epi32::<16>(pair)
                        }
                    };
                    let (sc_lo, sc_hi) = (scale(pairs[2 * p]), scale(pairs[2 * p + 1]));
                    let at = 512 * p + 256 * h;
                    let ql = [
                        load(b, at),
                        load(b, at + 64),
                        load(b, at + 128),
                        load(b, at + 192),
                    ];
                    let hat = Q6K_HIGH + 256 * p + 128 * h;
                    let qh = [load(b, hat), load(b, hat + 64)];
                    let mut lo = [zero; 4];
                    let mut hi = [zero; 4];
                    for i in 0..2 {
                        let (a, c) = (ql[2 * i], ql[2 * i + 1]);
                        let q = qh[i];
                        lo[2 * i] =
                            or_masked(_mm512_and_si512(a, low), _mm512_slli_epi16::<4>(q), high);
                        hi[2 * i] = or_masked(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(a), low),
                            _mm512_slli_epi16::<2>(q),
                            high,
                        );
                        lo[2 * i + 1] = or_masked(_mm512_and_si512(c, low), q, high);
                        hi[2 * i + 1] = or_masked(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(c), low),
                            _mm512_srli_epi16::<2>(q),
                            high,
                        );
                    }
                    for (row, isum) in rows.iter().zip(isum.iter_mut()) {
                        let x = x0 + 64 * p + 16 * h;
                        let mut t = zero;
                        let mut u = zero;
                        for i in 0..4 {
                            t = _mm512_dpbusd_epi32(t, lo[i], four(row.quants, x + 4 * i));
                            u = _mm512_dpbusd_epi32(u, hi[i], four(row.quants, x + 32 + 4 * i));
                        }
                        *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(t, sc_lo));
                        *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(u, sc_hi));
                    }
                }
            }
            let d = halves(b, Q6K_D);
            for ((row, isum), acc) in rows.iter().zip(isum).zip(acc.iter_mut()) {
                let mut offset = zero;
                for (k, pair_k) in pairs.iter().enumerate() {
                    offset =
                        _mm512_dpwssd_epi32(offset, *pair_k, pair(row.sums16, 16 * sb + 2 * k));
                }
                let isum = _mm512_sub_epi32(isum, _mm512_slli_epi32::<5>(offset));
                let xd = _mm512_set1_ps(*row.scales.add(sb));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, xd), *acc);
            }
        }
        acc
    }
}
