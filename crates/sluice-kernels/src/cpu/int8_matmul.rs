//! Quantized matrix products for steps with few rows, where reading the weights is the cost.
//!
//! Weights stay in their GGUF blocks (Q4_0, Q4_1, Q8_0: 32 weights per block with f16 scales).
//! Each activation row is quantized to int8 per block of 32 (a scale and the sum of its
//! quants kept beside it, as llama.cpp's Q8_1), so a block's contribution is one integer dot
//! product and a multiply-add of scales. On CPUs with AVX-512 VNNI the integer dot is
//! `vpdpbusd` over 32 bytes; elsewhere a scalar loop with the same arithmetic runs, which is
//! also the oracle the SIMD path is tested against.

use half::f16;
use rayon::prelude::*;

use crate::quant_format::{QuantFormat, BLOCK_WEIGHTS as BLOCK};

/// A `[rows, cols]` weight matrix in GGUF blocks, rows being output features.
pub struct QuantMatrix {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    row_bytes: usize,
}

/// Activation rows quantized for [`QuantMatrix::matmul`]: per block a scale, the sum of the
/// dequantized block (scale times the integer sum), and the integer sum itself.
#[derive(Default)]
pub struct QuantizedActivations {
    quants: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<f32>,
    int_sums: Vec<i32>,
    rows: usize,
    blocks_per_row: usize,
}

impl QuantizedActivations {
    pub fn quantize(&mut self, x: &[f32], rows: usize, cols: usize) {
        debug_assert_eq!(x.len(), rows * cols);
        debug_assert_eq!(cols % BLOCK, 0);
        let nb = cols / BLOCK;
        self.rows = rows;
        self.blocks_per_row = nb;
        self.quants.resize(rows * cols, 0);
        self.scales.resize(rows * nb, 0.0);
        self.sums.resize(rows * nb, 0.0);
        self.int_sums.resize(rows * nb, 0);
        for (b, (xs, qs)) in x
            .chunks_exact(BLOCK)
            .zip(self.quants.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut isum = 0i32;
            for (q, v) in qs.iter_mut().zip(xs) {
                let r = (v * inv).round() as i32;
                *q = r as i8;
                isum += r;
            }
            self.scales[b] = d;
            self.int_sums[b] = isum;
            self.sums[b] = d * isum as f32;
        }
    }
}

/// Output rows computed together by one task: big enough to amortise scheduling, small enough
/// to balance 2..N cores on the smallest matrices (192 rows).
const ROWS_PER_TASK: usize = 32;

impl QuantMatrix {
    /// A matrix of `rows` output features over `cols` inputs, `data` being its rows of GGUF
    /// `format` blocks; `None` when `cols` is not a whole number of blocks, `data` has the
    /// wrong size, or the format is not one of the int8-dot kernel's (Q4_0, Q4_1, Q8_0).
    pub fn new(format: QuantFormat, data: Vec<u8>, rows: usize, cols: usize) -> Option<Self> {
        if !format.is_legacy_layout() || !cols.is_multiple_of(BLOCK) {
            return None;
        }
        let row_bytes = cols / BLOCK * format.block_bytes();
        if data.len() != rows * row_bytes {
            return None;
        }
        Some(Self {
            format,
            rows,
            cols,
            data,
            row_bytes,
        })
    }

    /// Bytes the blocks take.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `out[t, r] = sum_c x[t, c] * W[r, c]` for the activation rows in `acts`; `out` is
    /// `[acts.rows, self.rows]` row-major.
    pub fn matmul(&self, acts: &QuantizedActivations, out: &mut [f32]) {
        let t = acts.rows;
        assert_eq!(acts.blocks_per_row * BLOCK, self.cols, "activation width");
        assert_eq!(out.len(), t * self.rows, "output size");
        let simd = simd_available();
        if t == 1 {
            out.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(task, chunk)| {
                    for (i, o) in chunk.iter_mut().enumerate() {
                        *o = self.row_dot(task * ROWS_PER_TASK + i, acts, 0, simd);
                    }
                });
            return;
        }
        // Several activation rows: each task computes a run of weight rows for all of them,
        // so every weight block read serves every row, then results go to their places.
        let transposed: Vec<f32> = (0..self.rows.div_ceil(ROWS_PER_TASK))
            .into_par_iter()
            .flat_map_iter(|task| {
                let begin = task * ROWS_PER_TASK;
                let end = (begin + ROWS_PER_TASK).min(self.rows);
                (begin..end)
                    .flat_map(move |r| (0..t).map(move |row| self.row_dot(r, acts, row, simd)))
            })
            .collect();
        for (r, vals) in transposed.chunks_exact(t).enumerate() {
            for (row, v) in vals.iter().enumerate() {
                out[row * self.rows + r] = *v;
            }
        }
    }

    #[inline]
    fn row_dot(&self, r: usize, acts: &QuantizedActivations, row: usize, simd: bool) -> f32 {
        let w = &self.data[r * self.row_bytes..][..self.row_bytes];
        let nb = acts.blocks_per_row;
        let a = ActRow {
            quants: &acts.quants[row * self.cols..][..self.cols],
            scales: &acts.scales[row * nb..][..nb],
            sums: &acts.sums[row * nb..][..nb],
            int_sums: &acts.int_sums[row * nb..][..nb],
        };
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: `simd` is only true when the CPU has the features the function enables.
            return unsafe { x86::row_dot(self.format, w, &a) };
        }
        let _ = simd;
        scalar_row_dot(self.format, w, &a)
    }

    /// The same product through the scalar path, for tests of the SIMD one.
    pub fn matmul_scalar(&self, acts: &QuantizedActivations, out: &mut [f32]) {
        let nb = acts.blocks_per_row;
        for row in 0..acts.rows {
            for r in 0..self.rows {
                let a = ActRow {
                    quants: &acts.quants[row * self.cols..][..self.cols],
                    scales: &acts.scales[row * nb..][..nb],
                    sums: &acts.sums[row * nb..][..nb],
                    int_sums: &acts.int_sums[row * nb..][..nb],
                };
                out[row * self.rows + r] = scalar_row_dot(
                    self.format,
                    &self.data[r * self.row_bytes..][..self.row_bytes],
                    &a,
                );
            }
        }
    }
}

struct ActRow<'a> {
    quants: &'a [i8],
    scales: &'a [f32],
    sums: &'a [f32],
    int_sums: &'a [i32],
}

fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("f16c")
                && is_x86_feature_detected!("fma")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[inline(always)]
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

fn scalar_row_dot(format: QuantFormat, w: &[u8], a: &ActRow<'_>) -> f32 {
    let bb = format.block_bytes();
    let mut total = 0f32;
    for (b, blk) in w.chunks_exact(bb).enumerate() {
        let x = &a.quants[b * BLOCK..][..BLOCK];
        let d = f16_at(blk, 0);
        match format {
            QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                let qs = if format == QuantFormat::Q4_1 {
                    &blk[4..20]
                } else {
                    &blk[2..18]
                };
                let mut dot = 0i32;
                for j in 0..16 {
                    dot += (qs[j] & 0x0F) as i32 * x[j] as i32
                        + (qs[j] >> 4) as i32 * x[j + 16] as i32;
                }
                if format == QuantFormat::Q4_1 {
                    total += d * a.scales[b] * dot as f32 + f16_at(blk, 2) * a.sums[b];
                } else {
                    total += d * a.scales[b] * (dot - 8 * a.int_sums[b]) as f32;
                }
            }
            // Q8_0: `new` admits the legacy layouts only.
            _ => {
                let dot: i32 = blk[2..34]
                    .iter()
                    .zip(x)
                    .map(|(&q, &v)| q as i8 as i32 * v as i32)
                    .sum();
                total += d * a.scales[b] * dot as f32;
            }
        }
    }
    total
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{f16_at, ActRow, QuantFormat, BLOCK};

    /// # Safety
    /// The CPU has AVX.
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
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
}

#[cfg(test)]
mod tests {
    use crate::testing::{quantized_matrix, random_values};
    use candle_core::{Device, Tensor};

    use super::*;

    #[test]
    fn simd_equals_scalar_and_tracks_dequantized_product() {
        for format in QuantFormat::ALL
            .into_iter()
            .filter(|f| f.is_legacy_layout())
        {
            for &(rows, cols, t) in &[(40usize, 64usize, 1usize), (200, 576, 3), (33, 160, 8)] {
                let (bytes, dense) = quantized_matrix(rows, cols, format, 3);
                let m = QuantMatrix::new(format, bytes, rows, cols).unwrap();
                let x = random_values(t * cols, 11);
                let mut acts = QuantizedActivations::default();
                acts.quantize(&x, t, cols);
                let mut fast = vec![0f32; t * rows];
                let mut slow = vec![0f32; t * rows];
                m.matmul(&acts, &mut fast);
                m.matmul_scalar(&acts, &mut slow);
                for (a, b) in fast.iter().zip(&slow) {
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "{format:?}: simd {a} vs scalar {b}"
                    );
                }
                // Against the dequantized weights in f32: only activation rounding differs.
                let wd = Tensor::from_vec(dense, (rows, cols), &Device::Cpu).unwrap();
                let xt = Tensor::from_vec(x.clone(), (t, cols), &Device::Cpu).unwrap();
                let exact = xt
                    .matmul(&wd.t().unwrap())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (a, e) in fast.iter().zip(&exact) {
                    assert!(
                        (a - e).abs() <= 0.02 * scale,
                        "{format:?}: {a} vs dequantized {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn wrong_sizes_are_declined() {
        let (bytes, _) = quantized_matrix(32, 256, QuantFormat::Q4_0, 1);
        assert!(QuantMatrix::new(QuantFormat::Q4_0, bytes.clone(), 32, 255).is_none());
        assert!(QuantMatrix::new(QuantFormat::Q8_0, bytes, 32, 256).is_none());
    }
}
