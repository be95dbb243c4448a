//! The AVX-512 VNNI kernels of the K-quants (Q4_K, Q5_K, Q6_K) against super-block
//! activations: one weight row against up to [`K_ACT_ROWS`](super::K_ACT_ROWS) activation
//! rows, in the K-quants' one arithmetic (module docs of `int8_matmul`), with fewer
//! instructions per weight than `avx2_k.rs`.
//!
//! A super-block's weights are unpacked 64 at a time into bytes (0..31, or 0..63 for Q6_K)
//! once for every activation row. Against a row's 64 activations, `vpdpbusd` sums each 4
//! products into a 32-bit lane, unscaled; two such registers pack into 16-bit lanes exactly
//! (`packs`), and `vpdpwssd` multiplies each lane by its sub-block's integer scale and sums
//! pairs into 32 bits. Q6_K, unpacked in natural order, packs single `vpdpbusd`s (at most
//! 4 * 63 * 127 = 32004 a lane); its `q - 32` enters as one more `vpdpwssd`: the row's integer
//! sums of each 16 against `-32` times the scales. Q4_K and Q5_K are unpacked so that each lane
//! holds one sub-block in every register, against the activations in the same order
//! (`lane_quants`), and pack sums of two `vpdpbusd`s (at most 8 * 31 * 127 = 31496): six
//! instructions a row and super-block instead of eight ([`k_nibbles`]). The super-block's 16
//! lanes then hold `isum` exactly (at most 256 * 63 * 127 * 128 < 2^31).
//!
//! One activation row (a decode step of one sequence) would pay those permutes for one row's
//! products: Q4_K and Q5_K are then unpacked in the nibbles' own order (a mask, a shift) against
//! the activations in that order (`pair_quants`), each register two sub-blocks side by side,
//! four `vpdpbusd`s packed by twos ([`one_row`]). The same integers, so the same bits; measured
//! with `benches/gemm.rs` (`SLUICE_BENCH_ROWS=1`), fewer shuffles per super-block on one row.
//!
//! A tile of up to 8 rows (from `K_TILE_MIN_ROWS`; the missing ones zero) sums its registers in
//! one tree of unpacks, takes Q4_K's and Q5_K's `imin` from the tile's transposed integer sums
//! of each 32, and runs the float epilogue on 8 lanes at once: per lane the two fused
//! multiply-adds of [`k_super_block`] in its order, with the same roundings (a vector `fnmadd`
//! by `dmin * xd` rounds as `fma` by `-(dmin * xd)`). Fewer rows call [`k_super_block`] itself. Either way each output is the scalar oracle's
//! float, bit for bit, whichever rows share its step.

use std::arch::x86_64::*;

use super::avx2::{f16_at, prefetch_ahead};
use super::avx2_k::{dot8_i16, k_scales};
use super::{k_super_block, QuantFormat, SuperRow, SuperTile, SUPER};

/// Each weight row of `weights` (rows of `row_bytes` bytes of `format`, a K-quant) against
/// each of `rows`: `dots[i * rows.len() + a]` is weight row `i` times activation row `a`.
/// `tile`, when given, is the tile of these rows transposed ([`K_ACT_ROWS`](super::K_ACT_ROWS) of them, those past
/// `rows` zero).
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI; `format` is Q4_K, Q5_K or
/// Q6_K; each weight row is whole super-blocks; every row of `rows` holds a weight row's count
/// of quants with their scales and sums, and `tile`, when given, as many super-blocks of the
/// same rows; `rows.len()` is 1 to 8 and `dots` holds `rows.len()` per weight row.
pub(super) unsafe fn rows_dot(
    format: QuantFormat,
    weights: &[u8],
    row_bytes: usize,
    rows: &[SuperRow<'_>],
    tile: Option<&SuperTile<'_>>,
    dots: &mut [f32],
) {
    debug_assert_eq!(weights.len() / row_bytes * rows.len(), dots.len());
    // SAFETY: forwarded from the caller.
    unsafe {
        match (tile, rows, format) {
            (Some(tile), _, _) => by_rows::<true>(format, weights, row_bytes, rows, tile, dots),
            // A lone row whose activations hold the pair order (the quantizer writes it for
            // the row a product takes alone, `Blocks256::quantize`).
            (None, [row], QuantFormat::Q4K) if row.pair_quants.len() == row.quants.len() => {
                one_row::<false>(weights, row_bytes, row, dots)
            }
            (None, [row], QuantFormat::Q5K) if row.pair_quants.len() == row.quants.len() => {
                one_row::<true>(weights, row_bytes, row, dots)
            }
            (None, _, _) => {
                by_rows::<false>(format, weights, row_bytes, rows, &SuperTile::EMPTY, dots)
            }
        }
    }
}

/// [`by_format`] for the call's row count.
///
/// # Safety
/// As [`rows_dot`], with `tile` given when `TILE`.
#[inline(always)]
unsafe fn by_rows<const TILE: bool>(
    format: QuantFormat,
    weights: &[u8],
    row_bytes: usize,
    rows: &[SuperRow<'_>],
    tile: &SuperTile<'_>,
    dots: &mut [f32],
) {
    // SAFETY: forwarded from the caller, with `R` the length of `rows`.
    unsafe {
        match rows.len() {
            1 => by_format::<1, TILE>(format, weights, row_bytes, rows, tile, dots),
            2 => by_format::<2, TILE>(format, weights, row_bytes, rows, tile, dots),
            3 => by_format::<3, TILE>(format, weights, row_bytes, rows, tile, dots),
            4 => by_format::<4, TILE>(format, weights, row_bytes, rows, tile, dots),
            5 => by_format::<5, TILE>(format, weights, row_bytes, rows, tile, dots),
            6 => by_format::<6, TILE>(format, weights, row_bytes, rows, tile, dots),
            7 => by_format::<7, TILE>(format, weights, row_bytes, rows, tile, dots),
            _ => by_format::<8, TILE>(format, weights, row_bytes, rows, tile, dots),
        }
    }
}

/// # Safety
/// As [`rows_dot`], with `rows.len() == R`, and `tile` given when `TILE`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn by_format<const R: usize, const TILE: bool>(
    format: QuantFormat,
    weights: &[u8],
    row_bytes: usize,
    rows: &[SuperRow<'_>],
    tile: &SuperTile<'_>,
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
            QuantFormat::Q4K => {
                each.for_each(|(w, d)| k_nibbles::<R, false, TILE>(w, rows, tile, d))
            }
            QuantFormat::Q5K => {
                each.for_each(|(w, d)| k_nibbles::<R, true, TILE>(w, rows, tile, d))
            }
            QuantFormat::Q6K => each.for_each(|(w, d)| q6_k::<R, TILE>(w, rows, tile, d)),
            _ => unreachable!("{format:?} is not a K-quant"),
        }
    }
}

/// Q4_K (Q5_K when `FIVE`) against one activation row: the weights unpacked in
/// [`PairUnpack`]'s order, then per super-block the epilogue of [`k_nibbles`] for one row
/// ([`Sums::add`]).
///
/// # Safety
/// As [`rows_dot`], for the one activation row `row`, which holds its quants in
/// [`by_nibble_pairs`](super::by_nibble_pairs)' order too, and `dots` of one per weight row.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn one_row<const FIVE: bool>(
    weights: &[u8],
    row_bytes: usize,
    row: &SuperRow<'_>,
    dots: &mut [f32],
) {
    let bb = if FIVE { 176 } else { 144 };
    // SAFETY: the caller's promise (each weight row is whole super-blocks, and the row holds as
    // many); reads inside super-block `sb` of the weight row and of the activation row; the
    // features are enabled on this function.
    unsafe {
        let unpack = PairUnpack::new();
        let rows = std::slice::from_ref(row).try_into().expect("one row");
        for (w, dot) in weights
            .chunks_exact(row_bytes)
            .zip(dots.chunks_exact_mut(1))
        {
            let mut sums = Sums::<1>::new();
            for (sb, blk) in w.chunks_exact(bb).enumerate() {
                prefetch_ahead(blk);
                let (z, scales, mn) = unpack.super_block::<FIVE>(blk);
                let lanes = [pair_lanes(&z, &scales, row, sb * SUPER)];
                let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
                let p = blk.as_ptr();
                let d = (f16_at(p), f16_at(p.add(2)));
                sums.add::<false>(&lanes, Some(mins), d, rows, &SuperTile::EMPTY, sb);
            }
            sums.store::<false>(dot);
        }
    }
}

/// The constants of Q4_K's and Q5_K's unpacking for one activation row, loaded once per call.
/// Each 64 bytes of nibbles, masked, are sub-blocks `[2p, 2p + 2]` (32 weights each, in
/// order), and shifted by 4 then masked `[2p + 1, 2p + 3]`: no permutation, against the
/// activations in [`by_nibble_pairs`](super::by_nibble_pairs)' order. Against one row this
/// costs fewer shuffles than [`NibbleUnpack`]'s order, whose permutes serve many rows.
struct PairUnpack {
    low: __m512i,
    bit4: __m512i,
    /// Per register: the left rotation of each 32-bit lane that brings bit `s` of each byte of
    /// Q5_K's `qh` to bit 4, `s` the lane's sub-block.
    rotations: [__m512i; 4],
    /// The scale of each 16-bit lane of `packs(t0, t1)` and `packs(t2, t3)`.
    picks: [__m512i; 2],
}

/// The sub-blocks of pair register `c`'s low and high 256 bits.
const fn pair_sub_blocks(c: usize) -> (usize, usize) {
    let lo = 4 * (c / 2) + c % 2;
    (lo, lo + 2)
}

const fn pair_rotations(c: usize) -> [u32; 16] {
    let (lo, hi) = pair_sub_blocks(c);
    let mut out = [0u32; 16];
    let mut i = 0;
    while i < 16 {
        let s = if i < 8 { lo } else { hi };
        out[i] = ((36 - s) % 32) as u32;
        i += 1;
    }
    out
}

static PAIR_ROTATIONS: [[u32; 16]; 4] = [
    pair_rotations(0),
    pair_rotations(1),
    pair_rotations(2),
    pair_rotations(3),
];

/// In 128-bit lane `k` of `packs(a, b)`, 16-bit lanes `j < 4` hold `a`'s 32-bit lanes
/// `4k..4k + 4`, the others `b`'s: register `c`'s 32-bit lane `l` sums sub-block `lo` for
/// `l < 8`, `hi` after ([`pair_sub_blocks`]).
const fn pair_picks(a: usize, b: usize) -> [i16; 32] {
    let mut out = [0i16; 32];
    let mut i = 0;
    while i < 32 {
        let (k, j) = (i / 8, i % 8);
        let (lo, hi) = pair_sub_blocks(if j < 4 { a } else { b });
        out[i] = (if k < 2 { lo } else { hi }) as i16;
        i += 1;
    }
    out
}

static PAIR_PICKS: [[i16; 32]; 2] = [pair_picks(0, 1), pair_picks(2, 3)];

impl PairUnpack {
    /// # Safety
    /// The CPU has AVX-512 F.
    #[inline(always)]
    unsafe fn new() -> Self {
        // SAFETY: AVX-512 F is the caller's promise; each load reads a 64-byte table.
        unsafe {
            Self {
                low: _mm512_set1_epi8(0x0F),
                bit4: _mm512_set1_epi8(0x10),
                rotations: std::array::from_fn(|c| {
                    _mm512_loadu_si512(PAIR_ROTATIONS[c].as_ptr() as *const __m512i)
                }),
                picks: [picks(&PAIR_PICKS[0]), picks(&PAIR_PICKS[1])],
            }
        }
    }

    /// The super-block `blk` (Q5_K's when `FIVE`, else Q4_K's): its four registers of weights,
    /// the scales of `packs(t0, t1)` and `packs(t2, t3)`, and its 8 minimums as bytes.
    ///
    /// # Safety
    /// The CPU has AVX2 and AVX-512 F and BW; `blk` is one whole super-block of the format.
    #[inline(always)]
    unsafe fn super_block<const FIVE: bool>(
        &self,
        blk: &[u8],
    ) -> ([__m512i; 4], [__m512i; 2], u64) {
        let qs_at = if FIVE { 48 } else { 16 };
        debug_assert_eq!(blk.len(), qs_at + 128);
        // SAFETY: the caller's promise; reads inside the super-block's bytes: 128 bytes of
        // nibbles at `qs_at`, Q5_K's 32 bytes of `qh` at 16.
        unsafe {
            let p = blk.as_ptr();
            let (sc, mn) = k_scales(blk[4..16].try_into().expect("12 scale bytes"));
            let sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
            let scales = [
                _mm512_permutexvar_epi16(self.picks[0], sc),
                _mm512_permutexvar_epi16(self.picks[1], sc),
            ];
            let qs = [
                _mm512_loadu_si512(p.add(qs_at) as *const __m512i),
                _mm512_loadu_si512(p.add(qs_at + 64) as *const __m512i),
            ];
            let mut z = [
                _mm512_and_si512(qs[0], self.low),
                _mm512_and_si512(_mm512_srli_epi16::<4>(qs[0]), self.low),
                _mm512_and_si512(qs[1], self.low),
                _mm512_and_si512(_mm512_srli_epi16::<4>(qs[1]), self.low),
            ];
            if FIVE {
                let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(16) as *const __m256i));
                for (z, rotation) in z.iter_mut().zip(&self.rotations) {
                    *z = or_masked(*z, _mm512_rolv_epi32(qh, *rotation), self.bit4);
                }
            }
            (z, scales, mn)
        }
    }
}

/// A row's 16 lanes of one Q4_K or Q5_K super-block (at `at` of the row), against its
/// weights `z` and scales from [`PairUnpack::super_block`]: four `vpdpbusd`s (4 products a
/// lane), packed by twos, times the scales.
///
/// # Safety
/// The CPU has AVX-512 BW and VNNI; `at + 256 <= row.pair_quants.len()`.
#[inline(always)]
unsafe fn pair_lanes(
    z: &[__m512i; 4],
    scales: &[__m512i; 2],
    row: &SuperRow<'_>,
    at: usize,
) -> __m512i {
    debug_assert!(at + SUPER <= row.pair_quants.len());
    // SAFETY: the caller's promise; loads inside `at..at + 256` of the row.
    unsafe {
        let zero = _mm512_setzero_si512();
        let t: [__m512i; 4] = std::array::from_fn(|c| {
            let x = _mm512_loadu_si512(row.pair_quants.as_ptr().add(at + 64 * c) as *const __m512i);
            _mm512_dpbusd_epi32(zero, z[c], x)
        });
        let acc = _mm512_dpwssd_epi32(zero, _mm512_packs_epi32(t[0], t[1]), scales[0]);
        _mm512_dpwssd_epi32(acc, _mm512_packs_epi32(t[2], t[3]), scales[1])
    }
}

/// A `permutexvar_epi16` control that gives each 16-bit lane of Q6_K's `packs(t_a, t_b)` its
/// weights' scale: in each 128-bit lane `k`, lanes 0..4 hold sums of `t_a`, lanes 4..8 of
/// `t_b`; each `t` covers four groups of 16, one per 128 bits, so the scale is `a + k` (or
/// `b + k`). (Q4_K's and Q5_K's lanes take [`LANE_PICKS`].)
const fn scale_picks(a: usize, b: usize) -> [i16; 32] {
    let mut out = [0i16; 32];
    let mut i = 0;
    while i < 32 {
        let base = if i % 8 < 4 { a } else { b };
        out[i] = (base + i / 8) as i16;
        i += 1;
    }
    out
}

/// Q6_K, half `h` of a super-block: `t_{2h}` holds groups `8h..8h + 4` (one per 128 bits),
/// `t_{2h + 1}` groups `8h + 4..8h + 8`.
static Q6_PICKS: [[i16; 32]; 2] = [scale_picks(0, 4), scale_picks(8, 12)];

/// A [`LANE_PICKS`] or [`Q6_PICKS`] control in a register.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn picks(p: &[i16; 32]) -> __m512i {
    // SAFETY: AVX-512 F is the caller's promise; the load reads the array's 64 bytes.
    unsafe { _mm512_loadu_si512(p.as_ptr() as *const __m512i) }
}

/// A register of 16-bit lanes: `low` in its low 256 bits, `high` in its high 256 bits.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn halves(low: i16, high: i16) -> __m512i {
    // SAFETY: AVX-512 F is the caller's promise; register operations only.
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi16(low)),
            _mm256_set1_epi16(high),
        )
    }
}

/// `a | (b & c)` in one instruction.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn or_masked(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    // SAFETY: AVX-512 F is the caller's promise; register operations only.
    unsafe { _mm512_ternarylogic_epi32::<0xF8>(a, b, c) }
}

/// The row's 64 activations at `at` of `row`.
///
/// # Safety
/// The CPU has AVX-512 F; `at + 64 <= row.quants.len()`.
#[inline(always)]
unsafe fn quants(row: &SuperRow<'_>, at: usize) -> __m512i {
    debug_assert!(at + 64 <= row.quants.len());
    // SAFETY: the caller's promise; unaligned load.
    unsafe { _mm512_loadu_si512(row.quants.as_ptr().add(at) as *const __m512i) }
}

/// The 16 lanes of one super-block against one row, `z` its four registers of 64 unpacked
/// weights and `scales` the two controls' scales for `packs(t0, t1)` and `packs(t2, t3)`.
///
/// # Safety
/// The CPU has AVX-512 BW and VNNI; `at + 256 <= row.quants.len()`.
#[inline(always)]
unsafe fn super_block_lanes(
    z: &[__m512i; 4],
    scales: &[__m512i; 2],
    row: &SuperRow<'_>,
    at: usize,
) -> __m512i {
    // SAFETY: the caller's promise; loads inside `at..at + 256` of the row.
    unsafe {
        let zero = _mm512_setzero_si512();
        let t: [__m512i; 4] =
            std::array::from_fn(|c| _mm512_dpbusd_epi32(zero, z[c], quants(row, at + 64 * c)));
        let acc = _mm512_dpwssd_epi32(zero, _mm512_packs_epi32(t[0], t[1]), scales[0]);
        _mm512_dpwssd_epi32(acc, _mm512_packs_epi32(t[2], t[3]), scales[1])
    }
}

/// The sums of 8 registers' 16 lanes each, in order, as 8 lanes (exact: the callers' sums
/// cannot overflow). A tree of unpacks: pairs of registers, then pairs of pairs, then the four
/// 128-bit lanes.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn sum_lanes_of_8(v: &[__m512i; 8]) -> __m256i {
    // SAFETY: AVX-512 F is the caller's promise; register operations only.
    unsafe {
        // Per 128 bits: [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
        let pair = |a: __m512i, b: __m512i| {
            _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
        };
        // Per 128 bits: one partial sum of each of the four registers, in order.
        let quad = |ab: __m512i, cd: __m512i| {
            _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd))
        };
        let low = quad(pair(v[0], v[1]), pair(v[2], v[3]));
        let high = quad(pair(v[4], v[5]), pair(v[6], v[7]));
        // [low 0 + low 1, low 2 + low 3, high 0 + high 1, high 2 + high 3] by 128 bits.
        let h = _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(low, high),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(low, high),
        );
        _mm256_add_epi32(
            _mm512_castsi512_si256(_mm512_shuffle_i32x4::<0b00_00_10_00>(h, h)),
            _mm512_castsi512_si256(_mm512_shuffle_i32x4::<0b00_00_11_01>(h, h)),
        )
    }
}

/// `sum_j mins[j] * sums32[r][j]` of super-block `sb` for each row `r` of the tile, `mins`
/// the 8 minimums as 16-bit lanes: the tile holds each pair `j = 2k, 2k + 1` of its 8 rows in
/// one 256-bit register.
///
/// # Safety
/// The CPU has AVX2; `tile` holds super-block `sb`.
#[inline(always)]
unsafe fn tile_mins(tile: &SuperTile<'_>, sb: usize, mins: __m128i) -> __m256i {
    debug_assert!(64 * sb + 64 <= tile.sums32.len());
    // SAFETY: the caller's promise; loads of `64 * sb..64 * sb + 64` of the tile's sums.
    unsafe {
        let m = _mm256_broadcastsi128_si256(mins);
        let s = |k: usize| _mm256_loadu_si256(tile.sums32.as_ptr().add(64 * sb + 16 * k) as _);
        _mm256_add_epi32(
            _mm256_add_epi32(
                _mm256_madd_epi16(s(0), _mm256_shuffle_epi32::<0x00>(m)),
                _mm256_madd_epi16(s(1), _mm256_shuffle_epi32::<0x55>(m)),
            ),
            _mm256_add_epi32(
                _mm256_madd_epi16(s(2), _mm256_shuffle_epi32::<0xAA>(m)),
                _mm256_madd_epi16(s(3), _mm256_shuffle_epi32::<0xFF>(m)),
            ),
        )
    }
}

/// The running float sums of a weight row against `R` activation rows: 8 lanes for a tile,
/// one float per row otherwise.
struct Sums<const R: usize> {
    lanes: __m256,
    each: [f32; R],
}

impl<const R: usize> Sums<R> {
    /// # Safety
    /// The CPU has AVX.
    #[inline(always)]
    unsafe fn new() -> Self {
        Self {
            // SAFETY: AVX is the caller's promise.
            lanes: unsafe { _mm256_setzero_ps() },
            each: [0.0; R],
        }
    }

    /// Adds super-block `sb`: [`k_super_block`] for each row, its integers `isum` summed from
    /// `lanes` and `imin` from `mins` (None for Q6_K).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and AVX-512 F; with `TILE` `tile` holds super-block
    /// `sb` of the rows, otherwise every row does.
    #[inline(always)]
    unsafe fn add<const TILE: bool>(
        &mut self,
        lanes: &[__m512i; R],
        mins: Option<__m128i>,
        (d, dmin): (f32, f32),
        rows: &[SuperRow<'_>; R],
        tile: &SuperTile<'_>,
        sb: usize,
    ) {
        // SAFETY: the caller's promise; reads of super-block `sb` of the tile or the rows.
        unsafe {
            if TILE {
                // A partial tile's missing rows sum zeros into lanes nobody stores.
                let lanes: [__m512i; 8] = std::array::from_fn(|r| {
                    if r < R {
                        lanes[r]
                    } else {
                        _mm512_setzero_si512()
                    }
                });
                debug_assert!(8 * sb + 8 <= tile.scales.len());
                let xd = _mm256_loadu_ps(tile.scales.as_ptr().add(8 * sb));
                let isum = _mm256_cvtepi32_ps(sum_lanes_of_8(&lanes));
                self.lanes =
                    _mm256_fmadd_ps(isum, _mm256_mul_ps(_mm256_set1_ps(d), xd), self.lanes);
                if let Some(mins) = mins {
                    let imin = _mm256_cvtepi32_ps(tile_mins(tile, sb, mins));
                    let by = _mm256_mul_ps(_mm256_set1_ps(dmin), xd);
                    self.lanes = _mm256_fnmadd_ps(imin, by, self.lanes);
                }
            } else {
                for r in 0..R {
                    let row = &rows[r];
                    let xd = *row.scales.get_unchecked(sb);
                    let isum = _mm512_reduce_add_epi32(lanes[r]);
                    let imin = mins.map(|mins| {
                        debug_assert!(8 * sb + 8 <= row.sums32.len());
                        dot8_i16(mins, _mm_loadu_si128(row.sums32.as_ptr().add(8 * sb) as _))
                    });
                    self.each[r] = k_super_block(self.each[r], isum, imin, d, dmin, xd);
                }
            }
        }
    }

    /// Writes the `R` sums to `dots`.
    ///
    /// # Safety
    /// The CPU has AVX; `dots.len() == R`.
    #[inline(always)]
    unsafe fn store<const TILE: bool>(&self, dots: &mut [f32]) {
        if TILE {
            debug_assert_eq!(dots.len(), R);
            let mut lanes = [0f32; 8];
            // SAFETY: AVX is the caller's promise; `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), self.lanes) };
            dots.copy_from_slice(&lanes[..R]);
        } else {
            dots.copy_from_slice(&self.each);
        }
    }
}

/// Q4_K and Q5_K: per super-block of 256, `w = (d * sc) * q - dmin * mn` per sub-block of 32.
///
/// The weights are unpacked in the order of the activations' `lane_quants`
/// (`by_sub_block_lanes`): register `c` holds weights `8c..8c + 8` of sub-block `s` in its
/// 32-bit lanes `2s` and `2s + 1`. Sub-block `2p + h`'s weight `i` is nibble `h` of byte
/// `32p + i` of the 128 bytes of nibbles: register `c` is their 8-byte words
/// `c, c, 4 + c, 4 + c, 8 + c, 8 + c, 12 + c, 12 + c`, one two-table word permute
/// (`vpermt2q`), then a shift by 0 or 4 per lane and a mask. Q5_K's fifth bit of weight `i` of
/// sub-block `s` is bit `s` of `qh[i]`: word `c` of `qh` broadcast, and a rotation of each lane
/// by `4 - s`, bring it to bit 4.
///
/// As each lane belongs to one sub-block in every register, a row's `vpdpbusd` of registers 0
/// and 1 accumulate in one register and those of 2 and 3 in another: 8 products a lane, at
/// most 8 * 31 * 127 = 31496, so the two still pack into 16-bit lanes exactly, and one
/// `vpdpwssd` by the scales makes the row's 16 lanes. Six instructions a row and super-block
/// where unpacking in natural order took eight.
///
/// # Safety
/// As [`rows_dot`], for one weight row `w` and `dots` of `R`.
#[inline(always)]
unsafe fn k_nibbles<const R: usize, const FIVE: bool, const TILE: bool>(
    w: &[u8],
    rows: &[SuperRow<'_>; R],
    tile: &SuperTile<'_>,
    dots: &mut [f32],
) {
    let bb = if FIVE { 176 } else { 144 };
    let qs_at = if FIVE { 48 } else { 16 };
    // SAFETY: reads inside super-block `sb` of `w` (the offsets are the format's: 128 bytes of
    // nibbles at `qs_at`, Q5_K's 32 bytes of `qh` at 16) and inside super-block `sb` of each
    // activation row and of the tile; the tables are 64 bytes each; the rest is the caller's
    // promise.
    unsafe {
        let low = _mm512_set1_epi8(0x0F);
        let bit4 = _mm512_set1_epi8(0x10);
        let load = |table: &[u64; 8]| _mm512_loadu_si512(table.as_ptr() as *const __m512i);
        let nibble_words: [__m512i; 4] = std::array::from_fn(|c| load(&NIBBLE_WORDS[c]));
        let nibble_shift = _mm512_loadu_si512(NIBBLE_SHIFT.as_ptr() as *const __m512i);
        let fifth_rotation = _mm512_loadu_si512(FIFTH_ROTATION.as_ptr() as *const __m512i);
        let picks = picks(&LANE_PICKS);
        let mut sums = Sums::<R>::new();
        for sb in 0..w.len() / bb {
            let blk = &w[sb * bb..][..bb];
            prefetch_ahead(blk);
            let p = blk.as_ptr();
            let d = f16_at(p);
            let dmin = f16_at(p.add(2));
            let (sc, mn) = k_scales(blk[4..16].try_into().expect("12 scale bytes"));
            let sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
            let scales = _mm512_permutexvar_epi16(picks, sc);
            let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
            let qs = [
                _mm512_loadu_si512(p.add(qs_at) as *const __m512i),
                _mm512_loadu_si512(p.add(qs_at + 64) as *const __m512i),
            ];
            let z: [__m512i; 4] = std::array::from_fn(|c| {
                let bytes = _mm512_permutex2var_epi64(qs[0], nibble_words[c], qs[1]);
                let q = _mm512_and_si512(_mm512_srlv_epi32(bytes, nibble_shift), low);
                if FIVE {
                    let high =
                        _mm512_set1_epi64((p.add(16 + 8 * c) as *const i64).read_unaligned());
                    or_masked(q, _mm512_rolv_epi32(high, fifth_rotation), bit4)
                } else {
                    q
                }
            });
            let lanes: [__m512i; R] = std::array::from_fn(|r| {
                let row = &rows[r];
                let at = sb * SUPER;
                debug_assert!(at + SUPER <= row.lane_quants.len());
                let x = |c: usize| {
                    _mm512_loadu_si512(row.lane_quants.as_ptr().add(at + 64 * c) as *const __m512i)
                };
                let zero = _mm512_setzero_si512();
                let first = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, z[0], x(0)), z[1], x(1));
                let last = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, z[2], x(2)), z[3], x(3));
                _mm512_dpwssd_epi32(zero, _mm512_packs_epi32(first, last), scales)
            });
            sums.add::<TILE>(&lanes, Some(mins), (d, dmin), rows, tile, sb);
        }
        sums.store::<TILE>(dots);
    }
}

/// For [`k_nibbles`]: register `c`'s 8-byte words from the 128 bytes of nibbles, by
/// `vpermt2q` (indices 8.. read the second 64 bytes): word `s` (lanes `2s`, `2s + 1`) holds
/// weights `8c..8c + 8` of sub-block `s`, bytes `32 * (s / 2) + 8c..` of the nibbles.
const fn nibble_words(c: u64) -> [u64; 8] {
    let mut out = [0u64; 8];
    let mut s = 0;
    while s < 8 {
        out[s] = 4 * (s as u64 / 2) + c;
        s += 1;
    }
    out
}

static NIBBLE_WORDS: [[u64; 8]; 4] = [
    nibble_words(0),
    nibble_words(1),
    nibble_words(2),
    nibble_words(3),
];

/// Per 32-bit lane `2s + m`: the shift that brings sub-block `s`'s nibble (high for odd `s`)
/// down, and the left rotation that brings bit `s` of each byte to bit 4 (`4 - s`, mod 32).
static NIBBLE_SHIFT: [u32; 16] = [0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4];
static FIFTH_ROTATION: [u32; 16] = [4, 4, 3, 3, 2, 2, 1, 1, 0, 0, 31, 31, 30, 30, 29, 29];

/// For [`k_nibbles`]: the scale of each 16-bit lane of `packs(first, last)`. In 128-bit lane
/// `k`, 16-bit lanes `j < 4` hold `first`'s 32-bit lane `4k + j`, the others `last`'s lane
/// `4k + j - 4`; 32-bit lane `l` sums sub-block `l / 2`.
const fn lane_picks() -> [i16; 32] {
    let mut out = [0i16; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = (2 * (i / 8) + (i % 4) / 2) as i16;
        i += 1;
    }
    out
}

static LANE_PICKS: [i16; 32] = lane_picks();

/// Q6_K: per super-block of 256, `w = (d * sc) * (q - 32)` with an i8 scale per 16 weights.
/// Each half of 128 weights has 64 bytes of low nibbles `ql` and 32 of high bit pairs `qh`:
/// weights `l`, `l + 32`, `l + 64`, `l + 96` take `ql[l]` low, `ql[l + 32]` low, `ql[l]` high and
/// `ql[l + 32]` high, with bits 0-1, 2-3, 4-5 and 6-7 of `qh[l]` above them. So the 64 bytes of
/// `ql`, masked, are the half's first 64 weights in order, shifted by 4 its last 64.
///
/// # Safety
/// As [`rows_dot`], for one weight row `w` and `dots` of `R`.
#[inline(always)]
unsafe fn q6_k<const R: usize, const TILE: bool>(
    w: &[u8],
    rows: &[SuperRow<'_>; R],
    tile: &SuperTile<'_>,
    dots: &mut [f32],
) {
    let bb = QuantFormat::Q6K.block_bytes();
    // SAFETY: reads inside super-block `sb` of `w`: `ql` at 0..128, `qh` at 128..192, the
    // scales at 192..208, `d` at 208; inside super-block `sb` of each activation row (the
    // quants at `256 * sb..256 * (sb + 1)`, the sums of 16 at `16 * sb`, 16 of them) and of the
    // tile; the rest is the caller's promise.
    unsafe {
        let low = _mm512_set1_epi8(0x0F);
        let high = _mm512_set1_epi8(0x30);
        // Bits 0-1 (low 256 bits) and 2-3 (high) of `qh` to bits 4-5 for the first 64
        // weights; bits 4-5 and 6-7 for the last 64.
        let (first, last) = (halves(4, 2), halves(0, 2));
        let picks = [picks(&Q6_PICKS[0]), picks(&Q6_PICKS[1])];
        let mut sums = Sums::<R>::new();
        for sb in 0..w.len() / bb {
            let p = w.as_ptr().add(sb * bb);
            prefetch_ahead(&w[sb * bb..][..bb]);
            let d = f16_at(p.add(208));
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192) as *const __m128i));
            let scz = _mm512_castsi256_si512(sc);
            // `q - 32`: minus 32 times each scale against the row's sums of 16.
            let offset = _mm512_zextsi256_si512(_mm256_sub_epi16(
                _mm256_setzero_si256(),
                _mm256_slli_epi16(sc, 5),
            ));
            let mut z = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                let ql = _mm512_loadu_si512(p.add(64 * h) as *const __m512i);
                let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    p.add(128 + 32 * h) as *const __m256i
                ));
                z[2 * h] = or_masked(
                    _mm512_and_si512(ql, low),
                    _mm512_sllv_epi16(qh, first),
                    high,
                );
                z[2 * h + 1] = or_masked(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low),
                    _mm512_srlv_epi16(qh, last),
                    high,
                );
            }
            let scales = [
                _mm512_permutexvar_epi16(picks[0], scz),
                _mm512_permutexvar_epi16(picks[1], scz),
            ];
            let lanes: [__m512i; R] = std::array::from_fn(|r| {
                let row = &rows[r];
                debug_assert!(16 * sb + 16 <= row.sums16.len());
                let sums16 = _mm512_zextsi256_si512(_mm256_loadu_si256(
                    row.sums16.as_ptr().add(16 * sb) as *const __m256i,
                ));
                _mm512_dpwssd_epi32(
                    super_block_lanes(&z, &scales, row, sb * SUPER),
                    sums16,
                    offset,
                )
            });
            sums.add::<TILE>(&lanes, None, (d, 0.0), rows, tile, sb);
        }
        sums.store::<TILE>(dots);
    }
}
