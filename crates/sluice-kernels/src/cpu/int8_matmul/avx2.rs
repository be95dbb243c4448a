//! The AVX2 int8 kernels of the legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): one weight row
//! against up to [`ACT_ROWS`](super::ACT_ROWS) activation rows of 32-blocks, each format read in
//! its GGUF block. (The K-quants read super-block activations: `avx2_k.rs`.)
//!
//! Each group of 32 weights becomes a register of 32 bytes `q` (the block's integers, as the
//! reference decodes them) and a float scale `s` and minimum `m`, unpacked once and used for
//! every activation row. Against a row's 32 int8 activations `x` (scale `xd`, sum `xs`):
//! `maddubs(q, x)` then `madd` gives 8 integer partial dots, added into a float accumulator as
//! `s * xd * dot`, and `m * xs` into a scalar correction. Unsigned `q` (nibbles, 5 bits) go
//! straight into `maddubs`; signed ones (Q8_0) go as `|q|` with their sign moved onto `x`. No
//! product saturates: |q| <= 128 and |x| <= 127 keep a pair under 2^15.
//!
//! On CPUs with AVX-512 VNNI the same kernels take the 8 partial dots from one `vpdpbusd`
//! (256-bit, AVX512VL) instead of `maddubs` and `madd`: the same integers, one instruction
//! fewer per block and row.

use std::arch::x86_64::*;

use super::{ActRow, QuantFormat, BLOCK};

/// The horizontal sum of 8 floats.
///
/// # Safety
/// The CPU has AVX.
#[inline(always)]
pub(in crate::cpu::int8_matmul) unsafe fn hsum(v: __m256) -> f32 {
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
struct Acc<'a, const R: usize, const VNNI: bool> {
    rows: &'a [ActRow<'a>],
    vec: [__m256; R],
    /// Minimum corrections, 8 blocks at a time.
    corr: [__m256; R],
    /// Minimum corrections of the blocks past the last whole group of 8.
    scalar: [f32; R],
    /// Per row, a group's 8 block factors `d_j * xd_(b0 + j)`.
    factors: [[f32; GROUP]; R],
}

/// Blocks whose scales are converted and multiplied together, 8 lanes at a time.
const GROUP: usize = 8;

impl<'a, const R: usize, const VNNI: bool> Acc<'a, R, VNNI> {
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
            factors: [[0.0; GROUP]; R],
        }
    }

    /// Starts the group of 8 blocks from `b0`: `d` holds their scales and `m` their minimums
    /// (`w = d * q + m`), which enter each row once for the 8 (`m` times the blocks' sums).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `b0 + 8` blocks are within every activation row.
    #[inline(always)]
    unsafe fn group<const MIN: bool>(&mut self, b0: usize, d: __m256, m: __m256) {
        // SAFETY: the features are the caller's promise; `b0 + 8 <=` every row's block count
        // (the caller's promise), so the 8-float loads stay inside the scales and sums.
        unsafe {
            for r in 0..R {
                let row = &self.rows[r];
                debug_assert!(b0 + GROUP <= row.scales.len());
                let xd = _mm256_loadu_ps(row.scales.as_ptr().add(b0));
                _mm256_storeu_ps(self.factors[r].as_mut_ptr(), _mm256_mul_ps(d, xd));
                if MIN {
                    let sums = _mm256_loadu_ps(row.sums.as_ptr().add(b0));
                    self.corr[r] = _mm256_fmadd_ps(m, sums, self.corr[r]);
                }
            }
        }
    }

    /// Adds block `b0 + j` of the group [`group`](Self::group) started, as
    /// [`add`](Self::add) does, its scale and minimum already taken.
    ///
    /// # Safety
    /// As [`add`](Self::add), after `group(b0, ..)`, `j < 8`.
    #[inline(always)]
    unsafe fn add_in_group<const SIGNED: bool>(&mut self, b0: usize, j: usize, q: __m256i) {
        let scales: [f32; R] = std::array::from_fn(|r| self.factors[r][j]);
        // SAFETY: as `add`.
        unsafe { self.add_scaled::<SIGNED>(b0 + j, q, &scales) }
    }

    /// Adds activation block `b` times 32 weights `q` (unsigned bytes unless `SIGNED`), scaled
    /// by `s`; and `m` times the block's sum when `MIN`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `b` is a block of every activation row.
    #[inline(always)]
    unsafe fn add<const SIGNED: bool, const MIN: bool>(
        &mut self,
        b: usize,
        q: __m256i,
        s: f32,
        m: f32,
    ) {
        debug_assert!(self.rows.iter().all(|row| b < row.scales.len()));
        // SAFETY: `b` is within every row's scales and sums (the caller's promise).
        let scales: [f32; R] =
            std::array::from_fn(|r| s * unsafe { *self.rows[r].scales.get_unchecked(b) });
        // SAFETY: the caller's promise, forwarded.
        unsafe { self.add_scaled::<SIGNED>(b, q, &scales) };
        if MIN {
            for r in 0..R {
                // SAFETY: as above.
                self.scalar[r] += m * unsafe { *self.rows[r].sums.get_unchecked(b) };
            }
        }
    }

    /// Adds activation block `b` times 32 weights `q` (unsigned bytes unless `SIGNED`) into
    /// each row's accumulator, times that row's `scales[r]`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, and AVX-512 VNNI and VL if `VNNI`; `b` is a block of every
    /// activation row.
    #[inline(always)]
    unsafe fn add_scaled<const SIGNED: bool>(&mut self, b: usize, q: __m256i, scales: &[f32; R]) {
        // SAFETY: the features are the caller's promise; `b * BLOCK + 32` is within every
        // row's quants by the caller's promise, checked in debug builds.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let qa = if SIGNED { _mm256_sign_epi8(q, q) } else { q };
            for (r, &scale) in scales.iter().enumerate() {
                let row = &self.rows[r];
                debug_assert!(b * BLOCK + BLOCK <= row.quants.len());
                let x = _mm256_loadu_si256(row.quants.as_ptr().add(b * BLOCK) as *const __m256i);
                let x = if SIGNED { _mm256_sign_epi8(x, q) } else { x };
                let dot = if VNNI {
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), qa, x)
                } else {
                    _mm256_madd_epi16(_mm256_maddubs_epi16(qa, x), ones)
                };
                let scale = _mm256_set1_ps(scale);
                self.vec[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, self.vec[r]);
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
/// The CPU has AVX2, FMA and F16C, and AVX-512 VNNI and VL if `vnni`; each weight row is whole
/// blocks of `format`; every row of `rows` has a weight row's count of quants (and a scale and
/// sum per 32); `rows.len()` is 1 to 4 and `dots` holds `rows.len()` per weight row.
pub(super) unsafe fn rows_dot(
    format: QuantFormat,
    weights: &[u8],
    row_bytes: usize,
    rows: &[ActRow<'_>],
    dots: &mut [f32],
    vnni: bool,
) {
    debug_assert_eq!(weights.len() / row_bytes * rows.len(), dots.len());
    // SAFETY: forwarded from the caller.
    unsafe {
        match (rows.len(), vnni) {
            (1, false) => by_format::<1>(format, weights, row_bytes, rows, dots),
            (2, false) => by_format::<2>(format, weights, row_bytes, rows, dots),
            (3, false) => by_format::<3>(format, weights, row_bytes, rows, dots),
            (_, false) => by_format::<4>(format, weights, row_bytes, rows, dots),
            (1, true) => by_format_vnni::<1>(format, weights, row_bytes, rows, dots),
            (2, true) => by_format_vnni::<2>(format, weights, row_bytes, rows, dots),
            (3, true) => by_format_vnni::<3>(format, weights, row_bytes, rows, dots),
            (_, true) => by_format_vnni::<4>(format, weights, row_bytes, rows, dots),
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
    unsafe { each_row::<R, false>(format, weights, row_bytes, rows, dots) }
}

/// [`by_format`] with `vpdpbusd` for the integer dots.
///
/// # Safety
/// As [`rows_dot`] with `vnni`, and `rows.len() == R`.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn by_format_vnni<const R: usize>(
    format: QuantFormat,
    weights: &[u8],
    row_bytes: usize,
    rows: &[ActRow<'_>],
    dots: &mut [f32],
) {
    // SAFETY: forwarded from the caller; the features are enabled on this function.
    unsafe { each_row::<R, true>(format, weights, row_bytes, rows, dots) }
}

/// The body of [`by_format`] and [`by_format_vnni`], inlined into each with its features.
///
/// # Safety
/// As [`by_format_vnni`] if `VNNI`, else as [`by_format`].
#[inline(always)]
unsafe fn each_row<const R: usize, const VNNI: bool>(
    format: QuantFormat,
    weights: &[u8],
    row_bytes: usize,
    rows: &[ActRow<'_>],
    dots: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        // The format is matched once per call, not per weight row: each arm is its own loop.
        macro_rules! per_weight_row {
            ($kernel:expr) => {
                for (w, dots) in weights
                    .chunks_exact(row_bytes)
                    .zip(dots.chunks_exact_mut(R))
                {
                    let mut acc = Acc::<R, VNNI>::new(rows);
                    $kernel(w, &mut acc);
                    acc.finish(dots);
                }
            };
        }
        match format {
            QuantFormat::Q4_0 => {
                per_weight_row!(|w, acc| legacy_nibbles(QuantFormat::Q4_0, w, acc))
            }
            QuantFormat::Q4_1 => {
                per_weight_row!(|w, acc| legacy_nibbles(QuantFormat::Q4_1, w, acc))
            }
            QuantFormat::Q5_0 => {
                per_weight_row!(|w, acc| legacy_nibbles(QuantFormat::Q5_0, w, acc))
            }
            QuantFormat::Q5_1 => {
                per_weight_row!(|w, acc| legacy_nibbles(QuantFormat::Q5_1, w, acc))
            }
            QuantFormat::Q8_0 => per_weight_row!(q8_0),
            _ => unreachable!("{format:?} reads super-block activations"),
        }
    }
}

/// Loads an f16 at `p` as f32 (one F16C conversion).
///
/// # Safety
/// The CPU has F16C; `p` points at 2 readable bytes.
#[inline(always)]
pub(in crate::cpu::int8_matmul) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller's promise; unaligned read, then register operations.
    unsafe {
        let bits = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }
}

/// How far ahead of the weights being read [`prefetch_ahead`] asks for cache lines: 4 KiB,
/// measured with `benches/forward.rs` (Qwen2.5-Coder-1.5B Q4_K_M, one-row decode steps) against
/// 1, 2 and 8 KiB and none (docs/models.md).
const PREFETCH_DISTANCE: usize = 4096;

/// Asks for the cache lines [`PREFETCH_DISTANCE`] bytes past each 64 bytes of `weights`, the
/// block (or group of blocks) a kernel is about to read: a weight row streams from memory once
/// per step, and the hardware prefetchers alone left a one-row decode step waiting on it.
#[inline(always)]
pub(in crate::cpu::int8_matmul) fn prefetch_ahead(weights: &[u8]) {
    let mut off = 0;
    while off < weights.len() {
        let ahead = weights.as_ptr().wrapping_add(PREFETCH_DISTANCE + off);
        // SAFETY: a prefetch is a hint: it reads nothing architecturally and never faults,
        // whatever the address; `wrapping_add` forms the address without the promise of `add`
        // that it stays inside the allocation.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8) };
        off += 64;
    }
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

/// The f16 at byte `at` of each of the 8 blocks of `bb` bytes from `p`, as 8 floats.
///
/// # Safety
/// The CPU has AVX and F16C; `p` points at 8 blocks of `bb` bytes and `at + 2 <= bb`.
#[inline(always)]
unsafe fn group_f16(p: *const u8, bb: usize, at: usize) -> __m256 {
    // SAFETY: the caller's promise; unaligned reads inside the 8 blocks.
    unsafe {
        let bits: [u16; GROUP] =
            std::array::from_fn(|j| (p.add(j * bb + at) as *const u16).read_unaligned());
        _mm256_cvtph_ps(_mm_loadu_si128(bits.as_ptr() as *const __m128i))
    }
}

/// The 32 weights of the legacy nibble block at `blk` as unsigned bytes.
///
/// # Safety
/// The CPU has AVX2; `blk` points at a whole block of `format`.
#[inline(always)]
unsafe fn nibble_quants(format: QuantFormat, blk: *const u8) -> __m256i {
    // SAFETY: the caller's promise; the offsets are the format's.
    unsafe {
        match format {
            QuantFormat::Q4_0 => split_nibbles(blk.add(2)),
            QuantFormat::Q4_1 => split_nibbles(blk.add(4)),
            QuantFormat::Q5_0 => {
                let qh = (blk.add(2) as *const u32).read_unaligned();
                _mm256_or_si256(split_nibbles(blk.add(6)), fifth_bits(qh))
            }
            _ => {
                let qh = (blk.add(4) as *const u32).read_unaligned();
                _mm256_or_si256(split_nibbles(blk.add(8)), fifth_bits(qh))
            }
        }
    }
}

/// Q4_0 (`(q - 8) * d`), Q4_1 (`q * d + m`), Q5_0 (`(q - 16) * d`), Q5_1 (`q * d + m`):
/// unsigned `q` with the offset folded into the minimum. Blocks go 8 at a time: their scales
/// and minimums are converted together, and each row's minimum correction is one FMA.
///
/// # Safety
/// AVX2, FMA and F16C; `w` whole blocks of `format`; the rows as [`rows_dot`] says.
#[inline(always)]
unsafe fn legacy_nibbles<const R: usize, const VNNI: bool>(
    format: QuantFormat,
    w: &[u8],
    acc: &mut Acc<'_, R, VNNI>,
) {
    let bb = format.block_bytes();
    let nb = w.len() / bb;
    let whole = nb / GROUP * GROUP;
    // SAFETY: every read is inside block `b` of `w` (offsets below the block's size), a group's
    // inside its 8 blocks; the rest is the caller's promise.
    unsafe {
        let p = w.as_ptr();
        for b0 in (0..whole).step_by(GROUP) {
            prefetch_ahead(&w[b0 * bb..][..GROUP * bb]);
            let first = p.add(b0 * bb);
            let d = group_f16(first, bb, 0);
            let m = match format {
                QuantFormat::Q4_0 => _mm256_mul_ps(_mm256_set1_ps(-8.0), d),
                QuantFormat::Q5_0 => _mm256_mul_ps(_mm256_set1_ps(-16.0), d),
                _ => group_f16(first, bb, 2),
            };
            acc.group::<true>(b0, d, m);
            for j in 0..GROUP {
                acc.add_in_group::<false>(b0, j, nibble_quants(format, first.add(j * bb)));
            }
        }
        for b in whole..nb {
            let blk = p.add(b * bb);
            let d = f16_at(blk);
            let m = match format {
                QuantFormat::Q4_0 => -8.0 * d,
                QuantFormat::Q5_0 => -16.0 * d,
                _ => f16_at(blk.add(2)),
            };
            acc.add::<false, true>(b, nibble_quants(format, blk), d, m);
        }
    }
}

/// The 32 signed weights of the Q8_0 block at `blk`.
///
/// # Safety
/// The CPU has AVX; `blk` points at a whole Q8_0 block.
#[inline(always)]
unsafe fn q8_quants(blk: *const u8) -> __m256i {
    // SAFETY: the caller's promise; the quants follow the 2-byte scale.
    unsafe { _mm256_loadu_si256(blk.add(2) as *const __m256i) }
}

/// Q8_0: `q * d`, signed bytes; blocks 8 at a time as [`legacy_nibbles`] takes them.
///
/// # Safety
/// As [`legacy_nibbles`].
#[inline(always)]
unsafe fn q8_0<const R: usize, const VNNI: bool>(w: &[u8], acc: &mut Acc<'_, R, VNNI>) {
    let bb = QuantFormat::Q8_0.block_bytes();
    let nb = w.len() / bb;
    let whole = nb / GROUP * GROUP;
    // SAFETY: reads inside block `b` of `w`, a group's inside its 8 blocks; the rest is the
    // caller's promise.
    unsafe {
        let p = w.as_ptr();
        for b0 in (0..whole).step_by(GROUP) {
            prefetch_ahead(&w[b0 * bb..][..GROUP * bb]);
            let first = p.add(b0 * bb);
            acc.group::<false>(b0, group_f16(first, bb, 0), _mm256_setzero_ps());
            for j in 0..GROUP {
                acc.add_in_group::<true>(b0, j, q8_quants(first.add(j * bb)));
            }
        }
        for b in whole..nb {
            let blk = p.add(b * bb);
            acc.add::<true, false>(b, q8_quants(blk), f16_at(blk), 0.0);
        }
    }
}
