//! The AVX2 int8 kernels: one weight row against up to [`ACT_ROWS`](super::ACT_ROWS) activation
//! rows, every format read in its GGUF block.
//!
//! Each group of 32 weights becomes a register of 32 bytes `q` (the block's integers, as the
//! reference decodes them) and a float scale `s` and minimum `m`, unpacked once and used for
//! every activation row. Against a row's 32 int8 activations `x` (scale `xd`, sum `xs`):
//! `maddubs(q, x)` then `madd` gives 8 integer partial dots, added into a float accumulator as
//! `s * xd * dot`, and `m * xs` into a scalar correction. Unsigned `q` (nibbles, 5 and 6 bits)
//! go straight into `maddubs`; signed ones (Q8_0, Q6_K's `q - 32`) go as `|q|` with their sign
//! moved onto `x`. No product saturates: |q| <= 128 and |x| <= 127 keep a pair under 2^15.

use std::arch::x86_64::*;

use super::{ActRow, QuantFormat, BLOCK};

/// The horizontal sum of 8 floats.
///
/// # Safety
/// The CPU has AVX.
#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: AVX is the caller's promise; the intrinsics only shuffle registers.
    unsafe {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

/// The running sums of one weight row against `R` activation rows.
struct Acc<'a, const R: usize> {
    rows: &'a [ActRow<'a>],
    vec: [__m256; R],
    /// Minimum corrections, 8 blocks at a time (K-quants) or one (`scalar`).
    corr: [__m256; R],
    scalar: [f32; R],
    /// Per row, a K-quant super-block's 8 sub-block factors `s_j * xd_(b0 + j)`.
    factors: [[f32; 8]; R],
}

impl<'a, const R: usize> Acc<'a, R> {
    /// # Safety
    /// The CPU has AVX.
    #[inline(always)]
    unsafe fn new(rows: &'a [ActRow<'a>]) -> Self {
        debug_assert_eq!(rows.len(), R);
        // SAFETY: AVX is the caller's promise.
        let zero = unsafe { _mm256_setzero_ps() };
        Self {
            rows,
            vec: [zero; R],
            corr: [zero; R],
            scalar: [0.0; R],
            factors: [[0.0; 8]; R],
        }
    }

    /// Starts a super-block of 8 sub-blocks of 32 from activation block `b0`: `s` holds the
    /// sub-blocks' scales and `m` their minimums (`w = s * q + m`), which enter each row once
    /// for the 8 (`m` times the blocks' sums).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `b0 + 8` blocks are within every activation row.
    #[inline(always)]
    unsafe fn super_block<const MIN: bool>(&mut self, b0: usize, s: __m256, m: __m256) {
        // SAFETY: the features are the caller's promise; `b0 + 8 <= ` every row's block count
        // (the caller's promise), so the 8-float loads stay inside the scales and sums.
        unsafe {
            for r in 0..R {
                let row = &self.rows[r];
                debug_assert!(b0 + 8 <= row.scales.len());
                let xd = _mm256_loadu_ps(row.scales.as_ptr().add(b0));
                _mm256_storeu_ps(self.factors[r].as_mut_ptr(), _mm256_mul_ps(s, xd));
                if MIN {
                    let sums = _mm256_loadu_ps(row.sums.as_ptr().add(b0));
                    self.corr[r] = _mm256_fmadd_ps(m, sums, self.corr[r]);
                }
            }
        }
    }

    /// Adds activation block `b0 + j` times 32 weights `q` of sub-block `j` of the super-block
    /// [`super_block`](Self::super_block) started, as [`add`](Self::add) does.
    ///
    /// # Safety
    /// As [`add`](Self::add), after `super_block(b0, ..)`.
    #[inline(always)]
    unsafe fn add_sub<const SIGNED: bool>(
        &mut self,
        b0: usize,
        j: usize,
        q: __m256i,
        mul: __m256i,
    ) {
        // SAFETY: as `add`.
        unsafe {
            let qa = if SIGNED { _mm256_sign_epi8(q, q) } else { q };
            for r in 0..R {
                let row = &self.rows[r];
                let b = b0 + j;
                debug_assert!(b * BLOCK + BLOCK <= row.quants.len());
                let x = _mm256_loadu_si256(row.quants.as_ptr().add(b * BLOCK) as *const __m256i);
                let x = if SIGNED { _mm256_sign_epi8(x, q) } else { x };
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(qa, x), mul);
                let scale = _mm256_broadcast_ss(&self.factors[r][j]);
                self.vec[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, self.vec[r]);
            }
        }
    }

    /// Adds activation block `b` times 32 weights `q` (unsigned bytes unless `SIGNED`), whose
    /// integer products are weighted per 16-bit pair by `mul` (ones, or Q6_K's scales), then
    /// scaled by `s`; and `m` times the block's sum when `MIN`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `b` is a block of every activation row.
    #[inline(always)]
    unsafe fn add<const SIGNED: bool, const MIN: bool>(
        &mut self,
        b: usize,
        q: __m256i,
        mul: __m256i,
        s: f32,
        m: f32,
    ) {
        // SAFETY: the features are the caller's promise; `b * BLOCK + 32` is within every
        // row's quants (and `b` within its scales and sums) by the caller's promise, checked in
        // debug builds by the slice indexing below.
        unsafe {
            let qa = if SIGNED { _mm256_sign_epi8(q, q) } else { q };
            for r in 0..R {
                let row = &self.rows[r];
                debug_assert!(b * BLOCK + BLOCK <= row.quants.len());
                let x = _mm256_loadu_si256(row.quants.as_ptr().add(b * BLOCK) as *const __m256i);
                let x = if SIGNED { _mm256_sign_epi8(x, q) } else { x };
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(qa, x), mul);
                let scale = _mm256_set1_ps(s * *row.scales.get_unchecked(b));
                self.vec[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, self.vec[r]);
                if MIN {
                    self.scalar[r] += m * *row.sums.get_unchecked(b);
                }
            }
        }
    }

    /// # Safety
    /// The CPU has AVX.
    #[inline(always)]
    unsafe fn finish(&self, dots: &mut [f32]) {
        for (r, d) in dots.iter_mut().enumerate().take(R) {
            // SAFETY: AVX is the caller's promise.
            *d = unsafe { hsum(_mm256_add_ps(self.vec[r], self.corr[r])) } + self.scalar[r];
        }
    }
}

/// Each weight row of `weights` (rows of `row_bytes` bytes of `format` blocks) against each
/// of `rows`: `dots[i * rows.len() + a]` is weight row `i` times activation row `a`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; each weight row is whole blocks of `format`; every row of
/// `rows` has a weight row's count of quants (and a scale and sum per 32); `rows.len()` is 1
/// to 4 and `dots` holds `rows.len()` per weight row.
pub(super) unsafe fn rows_dot(
    format: QuantFormat,
    weights: &[u8],
    row_bytes: usize,
    rows: &[ActRow<'_>],
    dots: &mut [f32],
) {
    debug_assert_eq!(weights.len() / row_bytes * rows.len(), dots.len());
    // SAFETY: forwarded from the caller.
    unsafe {
        match rows.len() {
            1 => by_format::<1>(format, weights, row_bytes, rows, dots),
            2 => by_format::<2>(format, weights, row_bytes, rows, dots),
            3 => by_format::<3>(format, weights, row_bytes, rows, dots),
            _ => by_format::<4>(format, weights, row_bytes, rows, dots),
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
    rows: &[ActRow<'_>],
    dots: &mut [f32],
) {
    // SAFETY: forwarded from the caller; the features are enabled on this function.
    unsafe {
        // The format is matched once per call, not per weight row: each arm is its own loop.
        macro_rules! each_row {
            ($kernel:expr) => {
                for (w, dots) in weights
                    .chunks_exact(row_bytes)
                    .zip(dots.chunks_exact_mut(R))
                {
                    let mut acc = Acc::<R>::new(rows);
                    $kernel(w, &mut acc);
                    acc.finish(dots);
                }
            };
        }
        match format {
            QuantFormat::Q4_0 => each_row!(|w, acc| legacy_nibbles(QuantFormat::Q4_0, w, acc)),
            QuantFormat::Q4_1 => each_row!(|w, acc| legacy_nibbles(QuantFormat::Q4_1, w, acc)),
            QuantFormat::Q5_0 => each_row!(|w, acc| legacy_nibbles(QuantFormat::Q5_0, w, acc)),
            QuantFormat::Q5_1 => each_row!(|w, acc| legacy_nibbles(QuantFormat::Q5_1, w, acc)),
            QuantFormat::Q8_0 => each_row!(q8_0),
            QuantFormat::Q4K => each_row!(|w, acc| k_nibbles(QuantFormat::Q4K, w, acc)),
            QuantFormat::Q5K => each_row!(|w, acc| k_nibbles(QuantFormat::Q5K, w, acc)),
            QuantFormat::Q6K => each_row!(q6_k),
        }
    }
}

/// Loads an f16 at `p` as f32.
///
/// # Safety
/// `p` points at 2 readable bytes.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller's promise; unaligned read.
    half::f16::from_bits(unsafe { (p as *const u16).read_unaligned() }).to_f32()
}

/// Bit `j` of `bits`, for `j` in 0..32, as 0x10 in byte `j` (the fifth bit of Q5_0/Q5_1).
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn fifth_bits(bits: u32) -> __m256i {
    // SAFETY: AVX2 is the caller's promise; register operations only.
    unsafe {
        // Byte j takes byte j / 8 of `bits` (the shuffle works per 128-bit half, and each half
        // holds all four bytes), then tests its own bit.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// The 32 nibbles of 16 bytes at `p`: low nibbles in bytes 0..16, high ones in 16..32 (the
/// legacy formats' weight order).
///
/// # Safety
/// The CPU has AVX2; `p` points at 16 readable bytes.
#[inline(always)]
unsafe fn split_nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller's promise.
    unsafe {
        let qs = _mm_loadu_si128(p as *const __m128i);
        let low = _mm_set1_epi8(0x0F);
        _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16(qs, 4), low),
            _mm_and_si128(qs, low),
        )
    }
}

/// Q4_0 (`(q - 8) * d`), Q4_1 (`q * d + m`), Q5_0 (`(q - 16) * d`), Q5_1 (`q * d + m`):
/// unsigned `q` with the offset folded into the minimum.
///
/// # Safety
/// AVX2, FMA and F16C; `w` whole blocks of `format`; the rows as [`rows_dot`] says.
#[inline(always)]
unsafe fn legacy_nibbles<const R: usize>(format: QuantFormat, w: &[u8], acc: &mut Acc<'_, R>) {
    let bb = format.block_bytes();
    // SAFETY: every read is inside block `b` of `w` (offsets below the block's size); the rest
    // is the caller's promise.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        for b in 0..w.len() / bb {
            let blk = w.as_ptr().add(b * bb);
            let d = f16_at(blk);
            let (q, m) = match format {
                QuantFormat::Q4_0 => (split_nibbles(blk.add(2)), -8.0 * d),
                QuantFormat::Q4_1 => (split_nibbles(blk.add(4)), f16_at(blk.add(2))),
                QuantFormat::Q5_0 => {
                    let qh = (blk.add(2) as *const u32).read_unaligned();
                    let q = _mm256_or_si256(split_nibbles(blk.add(6)), fifth_bits(qh));
                    (q, -16.0 * d)
                }
                _ => {
                    let qh = (blk.add(4) as *const u32).read_unaligned();
                    let q = _mm256_or_si256(split_nibbles(blk.add(8)), fifth_bits(qh));
                    (q, f16_at(blk.add(2)))
                }
            };
            acc.add::<false, true>(b, q, ones, d, m);
        }
    }
}

/// Q8_0: `q * d`, signed bytes.
///
/// # Safety
/// As [`legacy_nibbles`].
#[inline(always)]
unsafe fn q8_0<const R: usize>(w: &[u8], acc: &mut Acc<'_, R>) {
    let bb = QuantFormat::Q8_0.block_bytes();
    // SAFETY: reads inside block `b` of `w`; the rest is the caller's promise.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        for b in 0..w.len() / bb {
            let blk = w.as_ptr().add(b * bb);
            let q = _mm256_loadu_si256(blk.add(2) as *const __m256i);
            acc.add::<true, false>(b, q, ones, f16_at(blk), 0.0);
        }
    }
}

/// The 8 six-bit scales and 8 minimums of a Q4_K/Q5_K super-block's 12 scale bytes: bytes
/// 0..4 hold the low six bits of scales 0..3 (their top two bits are the high bits of scales
/// 4..7), bytes 4..8 likewise for the minimums, bytes 8..12 the low nibbles of scales 4..7 and
/// the low nibbles of minimums 4..7 in their high halves.
#[inline(always)]
fn k_scales(p: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    let sc_lo = a & 0x3F3F_3F3F;
    let mn_lo = b & 0x3F3F_3F3F;
    let sc_hi = (c & 0x0F0F_0F0F) | (((a >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((c >> 4) & 0x0F0F_0F0F) | (((b >> 6) & 0x0303_0303) << 4);
    let join = |lo: u32, hi: u32| {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&lo.to_le_bytes());
        out[4..].copy_from_slice(&hi.to_le_bytes());
        out
    };
    (join(sc_lo, sc_hi), join(mn_lo, mn_hi))
}

/// Eight bytes as eight floats.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn widen_u8x8(v: [u8; 8]) -> __m256 {
    // SAFETY: AVX2 is the caller's promise; the load reads the array's 8 bytes.
    unsafe {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
            v.as_ptr() as *const __m128i
        )))
    }
}

/// Q4_K and Q5_K: per super-block of 256, `w = (d * sc) * q - dmin * mn` per sub-block of 32.
/// Each 32 bytes of nibbles hold two sub-blocks (low nibbles the first); Q5_K's fifth bit of
/// weight `i` of sub-block `2c` is bit `2c` of `qh[i]`, of sub-block `2c + 1` bit `2c + 1`.
///
/// # Safety
/// As [`legacy_nibbles`].
#[inline(always)]
unsafe fn k_nibbles<const R: usize>(format: QuantFormat, w: &[u8], acc: &mut Acc<'_, R>) {
    let bb = format.block_bytes();
    let five = format == QuantFormat::Q5K;
    let qs_at = if five { 48 } else { 16 };
    // SAFETY: reads inside super-block `sb` of `w` (the offsets are the format's); the rest is
    // the caller's promise.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let low = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        for sb in 0..w.len() / bb {
            let blk = &w[sb * bb..][..bb];
            let p = blk.as_ptr();
            let d = f16_at(p);
            let dmin = f16_at(p.add(2));
            let (sc, mn) = k_scales(blk[4..16].try_into().expect("12 scale bytes"));
            let b0 = sb * 8;
            acc.super_block::<true>(
                b0,
                _mm256_mul_ps(_mm256_set1_ps(d), widen_u8x8(sc)),
                _mm256_mul_ps(_mm256_set1_ps(-dmin), widen_u8x8(mn)),
            );
            let qh = if five {
                _mm256_loadu_si256(p.add(16) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            for c in 0..4 {
                let qs = _mm256_loadu_si256(p.add(qs_at + 32 * c) as *const __m256i);
                let mut lo = _mm256_and_si256(qs, low);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), low);
                if five {
                    // Bit 2c (2c + 1) of each byte to bit 4; the 16-bit shifts carry bits across
                    // bytes, which the mask with 1 drops.
                    let shift = _mm_cvtsi32_si128(2 * c as i32);
                    let b_lo = _mm256_and_si256(_mm256_srl_epi16(qh, shift), one);
                    let b_hi = _mm256_and_si256(
                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)),
                        one,
                    );
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(b_lo, 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(b_hi, 4));
                }
                acc.add_sub::<false>(b0, 2 * c, lo, ones);
                acc.add_sub::<false>(b0, 2 * c + 1, hi, ones);
            }
        }
    }
}

/// Bits `shift` and `shift + 1` of each byte of `qh`, moved to bits 4 and 5 (`three` holds 3
/// in every byte; the 16-bit shift carries bits across bytes, which the mask drops).
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn high_pair(qh: __m256i, shift: i32, three: __m256i) -> __m256i {
    // SAFETY: AVX2 is the caller's promise; register operations only.
    unsafe {
        _mm256_slli_epi16(
            _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), three),
            4,
        )
    }
}

/// Q6_K: per super-block of 256, `w = (d * sc) * (q - 32)` with an i8 scale per 16 weights.
/// Each half of 128 weights has 64 bytes of low nibbles `ql` and 32 of high bit pairs `qh`:
/// weights `l`, `l + 32`, `l + 64`, `l + 96` take `ql[l]` low, `ql[l + 32]` low, `ql[l]` high and
/// `ql[l + 32]` high, with bits 0-1, 2-3, 4-5 and 6-7 of `qh[l]` above them.
///
/// # Safety
/// As [`legacy_nibbles`].
#[inline(always)]
unsafe fn q6_k<const R: usize>(w: &[u8], acc: &mut Acc<'_, R>) {
    let bb = QuantFormat::Q6K.block_bytes();
    // SAFETY: reads inside super-block `sb` of `w`: `ql` at 0..128, `qh` at 128..192, the
    // scales at 192..208, `d` at 208; the rest is the caller's promise.
    unsafe {
        let low = _mm256_set1_epi8(0x0F);
        let two = _mm256_set1_epi8(3);
        let offset = _mm256_set1_epi8(32);
        let pair = _mm_set_epi64x(0x0101_0101_0101_0101, 0);
        for sb in 0..w.len() / bb {
            let p = w.as_ptr().add(sb * bb);
            let d = f16_at(p.add(208));
            let sc = _mm_loadu_si128(p.add(192) as *const __m128i);
            let b0 = sb * 8;
            acc.super_block::<false>(b0, _mm256_set1_ps(d), _mm256_setzero_ps());
            for half in 0..2 {
                let ql0 = _mm256_loadu_si256(p.add(64 * half) as *const __m256i);
                let ql1 = _mm256_loadu_si256(p.add(64 * half + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(p.add(128 + 32 * half) as *const __m256i);
                let quarters = [
                    _mm256_or_si256(_mm256_and_si256(ql0, low), high_pair(qh, 0, two)),
                    _mm256_or_si256(_mm256_and_si256(ql1, low), high_pair(qh, 2, two)),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                        high_pair(qh, 4, two),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                        high_pair(qh, 6, two),
                    ),
                ];
                for (k, q) in quarters.into_iter().enumerate() {
                    // Scales g and g + 1 (the two 16-weight groups of these 32), each in eight
                    // 16-bit lanes.
                    let g = (8 * half + 2 * k) as i8;
                    let pick = _mm_add_epi8(pair, _mm_set1_epi8(g));
                    let mul = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pick));
                    acc.add_sub::<true>(b0, 4 * half + k, _mm256_sub_epi8(q, offset), mul);
                }
            }
        }
    }
}
