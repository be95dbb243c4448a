//! The AVX2 kernels of the K-quants (Q4_K, Q5_K, Q6_K) against super-block activations: one
//! weight row against up to [`K_ACT_ROWS`](super::K_ACT_ROWS) activation rows.
//!
//! A super-block's weights are unpacked 32 at a time into bytes `q` (unsigned: nibbles, 5 and 6
//! bits) once for every activation row. Against a row's 32 int8 activations `x`,
//! `maddubs(q, x)` gives 16-bit pair sums and `madd` with the sub-block's integer scale in
//! every lane widens them to 32 bits already scaled, so the whole super-block is summed in
//! integers, its 8 lanes added into one `isum`. Q4_K's and Q5_K's minimums give `imin`, the
//! sub-blocks' integer minimums against the row's integer sums of each 32; Q6_K's `q - 32`
//! enters `isum` as 32 times its scales against the row's integer sums of each 16, exactly.
//! The two integers then go through [`k_super_block`], the float epilogue every kernel of the
//! K-quants shares. No sum overflows: a pair is at most 2 * 63 * 127 < 2^15, a super-block's
//! integer sum at most 256 * 63 * 127 * 128 < 2^31.
//!
//! Each output's float steps are the same whichever tile it is computed in (one to eight rows),
//! and the same as the scalar oracle's, so a row's result depends neither on the rows beside
//! it nor on the kernel.

use std::arch::x86_64::*;

use super::x86::{f16_at, prefetch_ahead};
use super::{k_super_block, QuantFormat, SuperRow, SUPER};

/// Each weight row of `weights` (rows of `row_bytes` bytes of `format`, a K-quant) against
/// each of `rows`: `dots[i * rows.len() + a]` is weight row `i` times activation row `a`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `format` is Q4_K, Q5_K or Q6_K; each weight row is whole
/// super-blocks; every row of `rows` holds a weight row's count of quants with their scales and
/// sums; `rows.len()` is 1 to 8 and `dots` holds `rows.len()` per weight row.
pub(super) unsafe fn rows_dot(
    format: QuantFormat,
    weights: &[u8],
    row_bytes: usize,
    rows: &[SuperRow<'_>],
    dots: &mut [f32],
) {
    debug_assert_eq!(weights.len() / row_bytes * rows.len(), dots.len());
    // SAFETY: forwarded from the caller.
    unsafe {
        match rows.len() {
            1 => by_format::<1>(format, weights, row_bytes, rows, dots),
            2 => by_format::<2>(format, weights, row_bytes, rows, dots),
            3 => by_format::<3>(format, weights, row_bytes, rows, dots),
            4 => by_format::<4>(format, weights, row_bytes, rows, dots),
            5 => by_format::<5>(format, weights, row_bytes, rows, dots),
            6 => by_format::<6>(format, weights, row_bytes, rows, dots),
            7 => by_format::<7>(format, weights, row_bytes, rows, dots),
            _ => by_format::<8>(format, weights, row_bytes, rows, dots),
        }
    }
}

/// # Safety
/// As [`rows_dot`], with `rows.len() == R`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn by_format<const R: usize>(
    format: QuantFormat,
    weights: &[u8],
    row_bytes: usize,
    rows: &[SuperRow<'_>],
    dots: &mut [f32],
) {
    let rows: &[SuperRow<'_>; R] = rows.try_into().expect("R activation rows");
    let each = weights
        .chunks_exact(row_bytes)
        .zip(dots.chunks_exact_mut(R));
    // SAFETY: forwarded from the caller; the features are enabled on this function. The
    // format is matched once per call, not per weight row.
    unsafe {
        match format {
            QuantFormat::Q4K => each.for_each(|(w, d)| k_nibbles::<R, false>(w, rows, d)),
            QuantFormat::Q5K => each.for_each(|(w, d)| k_nibbles::<R, true>(w, rows, d)),
            QuantFormat::Q6K => each.for_each(|(w, d)| q6_k::<R>(w, rows, d)),
            _ => unreachable!("{format:?} is not a K-quant"),
        }
    }
}

/// A `shuffle_epi8` control that fills every 16-bit lane of the low 128-bit half with lane
/// `low` of that half, and every lane of the high half with lane `high` of it.
const fn picks_of(low: usize, high: usize) -> [u8; 32] {
    let mut out = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        let lane = if i < 16 { low } else { high };
        out[i] = (2 * lane + i % 2) as u8;
        i += 1;
    }
    out
}

/// `LANE_PICKS[j]` broadcasts lane `j` (a Q4_K/Q5_K sub-block's scale) over both halves.
const fn lane_picks() -> [[u8; 32]; 8] {
    let mut out = [[0u8; 32]; 8];
    let mut j = 0;
    while j < 8 {
        out[j] = picks_of(j, j);
        j += 1;
    }
    out
}

/// `PAIR_PICKS[k]` takes lanes `2k` and `2k + 1` into the low and high halves: Q6_K's two
/// scales of a register of 32 weights.
const fn pair_picks() -> [[u8; 32]; 4] {
    let mut out = [[0u8; 32]; 4];
    let mut k = 0;
    while k < 4 {
        out[k] = picks_of(2 * k, 2 * k + 1);
        k += 1;
    }
    out
}

static LANE_PICKS: [[u8; 32]; 8] = lane_picks();
static PAIR_PICKS: [[u8; 32]; 4] = pair_picks();

/// A shuffle control of [`LANE_PICKS`] or [`PAIR_PICKS`] in a register.
///
/// # Safety
/// The CPU has AVX.
#[inline(always)]
unsafe fn picks(p: &[u8; 32]) -> __m256i {
    // SAFETY: AVX is the caller's promise; the load reads the array's 32 bytes.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// The 8 six-bit scales and 8 minimums of a Q4_K/Q5_K super-block's 12 scale bytes: bytes
/// 0..4 hold the low six bits of scales 0..3 (their top two bits are the high bits of scales
/// 4..7), bytes 4..8 likewise for the minimums, bytes 8..12 the low nibbles of scales 4..7 and
/// the low nibbles of minimums 4..7 in their high halves. Each comes as 8 bytes of a `u64`.
#[inline(always)]
pub(super) fn k_scales(p: &[u8; 12]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    let sc_lo = a & 0x3F3F_3F3F;
    let mn_lo = b & 0x3F3F_3F3F;
    let sc_hi = (c & 0x0F0F_0F0F) | (((a >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((c >> 4) & 0x0F0F_0F0F) | (((b >> 6) & 0x0303_0303) << 4);
    let join = |lo: u32, hi: u32| lo as u64 | (hi as u64) << 32;
    (join(sc_lo, sc_hi), join(mn_lo, mn_hi))
}

/// The row's 32 activations at `at` of `row`.
///
/// # Safety
/// The CPU has AVX; `at + 32 <= row.quants.len()`.
#[inline(always)]
unsafe fn quants(row: &SuperRow<'_>, at: usize) -> __m256i {
    debug_assert!(at + 32 <= row.quants.len());
    // SAFETY: the caller's promise; unaligned load.
    unsafe { _mm256_loadu_si256(row.quants.as_ptr().add(at) as *const __m256i) }
}

/// The sum of 8 32-bit lanes (exact: the callers' sums cannot overflow).
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: AVX2 is the caller's promise; register operations only.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
        _mm_cvtsi128_si32(s)
    }
}

/// `sum_j mins[j] * sums[j]` of 8 16-bit lanes each (at most 8 * 63 * 32 * 127: exact).
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
pub(super) unsafe fn dot8_i16(mins: __m128i, sums: __m128i) -> i32 {
    // SAFETY: AVX2 is the caller's promise; register operations only.
    unsafe {
        let s = _mm_madd_epi16(mins, sums);
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
        _mm_cvtsi128_si32(s)
    }
}

/// `acc + madd(maddubs(q, x), scales)`: 32 weights against 32 activations, each 16-bit pair sum
/// times its lane's scale, into 8 lanes of 32 bits.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn dot32(acc: __m256i, q: __m256i, x: __m256i, scales: __m256i) -> __m256i {
    // SAFETY: AVX2 is the caller's promise; register operations only.
    unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), scales)) }
}

/// Q4_K and Q5_K: per super-block of 256, `w = (d * sc) * q - dmin * mn` per sub-block of 32.
/// Each 32 bytes of nibbles hold two sub-blocks (low nibbles the first); Q5_K's fifth bit of
/// weight `i` of sub-block `2c` is bit `2c` of `qh[i]`, of sub-block `2c + 1` bit `2c + 1`.
///
/// # Safety
/// As [`rows_dot`], for one weight row `w` and `dots` of `R`.
#[inline(always)]
unsafe fn k_nibbles<const R: usize, const FIVE: bool>(
    w: &[u8],
    rows: &[SuperRow<'_>; R],
    dots: &mut [f32],
) {
    let bb = if FIVE { 176 } else { 144 };
    let qs_at = if FIVE { 48 } else { 16 };
    // SAFETY: reads inside super-block `sb` of `w` (the offsets are the format's) and inside
    // super-block `sb` of each activation row (`256 * sb + 64 * c + 32 < 256 * (sb + 1)`; the
    // sums at `8 * sb`, 8 of them); the rest is the caller's promise.
    unsafe {
        let low = _mm256_set1_epi8(0x0F);
        let bit4 = _mm256_set1_epi8(0x10);
        let mut facc = [0f32; R];
        for sb in 0..w.len() / bb {
            let blk = &w[sb * bb..][..bb];
            prefetch_ahead(blk);
            let p = blk.as_ptr();
            let d = f16_at(p);
            let dmin = f16_at(p.add(2));
            let (sc, mn) = k_scales(blk[4..16].try_into().expect("12 scale bytes"));
            let scales =
                _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
            let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
            let qh = if FIVE {
                _mm256_loadu_si256(p.add(16) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            let mut acc = [_mm256_setzero_si256(); R];
            for c in 0..4 {
                let qs = _mm256_loadu_si256(p.add(qs_at + 32 * c) as *const __m256i);
                let mut lo = _mm256_and_si256(qs, low);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), low);
                if FIVE {
                    // Bits 2c and 2c + 1 of each byte to bit 4: the 16-bit shifts carry bits
                    // across bytes, below bit 4, which the mask drops.
                    let (b_lo, b_hi) = match c {
                        0 => (_mm256_slli_epi16(qh, 4), _mm256_slli_epi16(qh, 3)),
                        1 => (_mm256_slli_epi16(qh, 2), _mm256_slli_epi16(qh, 1)),
                        2 => (qh, _mm256_srli_epi16(qh, 1)),
                        _ => (_mm256_srli_epi16(qh, 2), _mm256_srli_epi16(qh, 3)),
                    };
                    lo = _mm256_or_si256(lo, _mm256_and_si256(b_lo, bit4));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(b_hi, bit4));
                }
                let s_lo = _mm256_shuffle_epi8(scales, picks(&LANE_PICKS[2 * c]));
                let s_hi = _mm256_shuffle_epi8(scales, picks(&LANE_PICKS[2 * c + 1]));
                for r in 0..R {
                    let at = sb * SUPER + 64 * c;
                    acc[r] = dot32(acc[r], lo, quants(&rows[r], at), s_lo);
                    acc[r] = dot32(acc[r], hi, quants(&rows[r], at + 32), s_hi);
                }
            }
            for r in 0..R {
                let row = &rows[r];
                debug_assert!(8 * sb + 8 <= row.sums32.len());
                let sums = _mm_loadu_si128(row.sums32.as_ptr().add(8 * sb) as *const __m128i);
                let xd = *row.scales.get_unchecked(sb);
                let (isum, imin) = (hsum_i32(acc[r]), dot8_i16(mins, sums));
                facc[r] = k_super_block(facc[r], isum, Some(imin), d, dmin, xd);
            }
        }
        dots.copy_from_slice(&facc);
    }
}

/// Bits `shift` and `shift + 1` of each byte of `qh`, moved to bits 4 and 5 (`mask` holds 0x30
/// in every byte; the 16-bit shift carries bits across bytes, which the mask drops).
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn high_pair<const SHIFT: i32>(qh: __m256i, mask: __m256i) -> __m256i {
    // SAFETY: AVX2 is the caller's promise; register operations only.
    unsafe {
        let moved = match SHIFT {
            0 => _mm256_slli_epi16(qh, 4),
            2 => _mm256_slli_epi16(qh, 2),
            4 => qh,
            _ => _mm256_srli_epi16(qh, 2),
        };
        _mm256_and_si256(moved, mask)
    }
}

/// Q6_K: per super-block of 256, `w = (d * sc) * (q - 32)` with an i8 scale per 16 weights.
/// Each half of 128 weights has 64 bytes of low nibbles `ql` and 32 of high bit pairs `qh`:
/// weights `l`, `l + 32`, `l + 64`, `l + 96` take `ql[l]` low, `ql[l + 32]` low, `ql[l]` high and
/// `ql[l + 32]` high, with bits 0-1, 2-3, 4-5 and 6-7 of `qh[l]` above them.
///
/// # Safety
/// As [`rows_dot`], for one weight row `w` and `dots` of `R`.
#[inline(always)]
unsafe fn q6_k<const R: usize>(w: &[u8], rows: &[SuperRow<'_>; R], dots: &mut [f32]) {
    let bb = QuantFormat::Q6K.block_bytes();
    // SAFETY: reads inside super-block `sb` of `w`: `ql` at 0..128, `qh` at 128..192, the
    // scales at 192..208, `d` at 208; inside super-block `sb` of each activation row (the
    // quants at `256 * sb + 128 * half + 32 * k`, the sums of 16 at `16 * sb`, 16 of them);
    // the rest is the caller's promise.
    unsafe {
        let low = _mm256_set1_epi8(0x0F);
        let high = _mm256_set1_epi8(0x30);
        let mut facc = [0f32; R];
        for sb in 0..w.len() / bb {
            prefetch_ahead(&w[sb * bb..][..bb]);
            let p = w.as_ptr().add(sb * bb);
            let d = f16_at(p.add(208));
            let sc = _mm_loadu_si128(p.add(192) as *const __m128i);
            // Scales 0..8 and 8..16 as 16-bit lanes in both halves, for the halves of 128
            // weights; and all 16 in order, for the `- 32` correction.
            let halves = [
                _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc)),
                _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc, 8))),
            ];
            let all = _mm256_cvtepi8_epi16(sc);
            let mut acc = [_mm256_setzero_si256(); R];
            for (half, scales) in halves.into_iter().enumerate() {
                let ql0 = _mm256_loadu_si256(p.add(64 * half) as *const __m256i);
                let ql1 = _mm256_loadu_si256(p.add(64 * half + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(p.add(128 + 32 * half) as *const __m256i);
                let quarters = [
                    _mm256_or_si256(_mm256_and_si256(ql0, low), high_pair::<0>(qh, high)),
                    _mm256_or_si256(_mm256_and_si256(ql1, low), high_pair::<2>(qh, high)),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                        high_pair::<4>(qh, high),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                        high_pair::<6>(qh, high),
                    ),
                ];
                for (k, q) in quarters.into_iter().enumerate() {
                    let s = _mm256_shuffle_epi8(scales, picks(&PAIR_PICKS[k]));
                    for r in 0..R {
                        let at = sb * SUPER + 128 * half + 32 * k;
                        acc[r] = dot32(acc[r], q, quants(&rows[r], at), s);
                    }
                }
            }
            for r in 0..R {
                let row = &rows[r];
                debug_assert!(16 * sb + 16 <= row.sums16.len());
                let sums = _mm256_loadu_si256(row.sums16.as_ptr().add(16 * sb) as *const __m256i);
                let offset = _mm256_slli_epi32(_mm256_madd_epi16(all, sums), 5);
                let isum = hsum_i32(_mm256_sub_epi32(acc[r], offset));
                let xd = *row.scales.get_unchecked(sb);
                facc[r] = k_super_block(facc[r], isum, None, d, 0.0, xd);
            }
        }
        dots.copy_from_slice(&facc);
    }
}
