//! AVX2 + FMA microkernels of the packed gemm, for CPUs without AVX-512. A panel's 16 columns
//! are two 8-lane registers; everything else follows the AVX-512 kernels: per k-row, one
//! broadcast of each activation row and one FMA per register into accumulators that live for
//! the whole of `k`. Each output column is thus the same chain of FMAs in the same k order
//! whatever the vector width, so these kernels, the AVX-512 ones and the f32 and quantized
//! panels all give bit-identical results.

use std::arch::x86_64::*;

use super::Tile;
use crate::quant_format::{
    MinKind, PanelLayout, QuantFormat, ScaleKind, E2M1_VALUES, PANEL_COLUMNS as PANEL,
};

/// Accumulators of a tile: MR rows x NR panels x two 8-column halves.
type Acc<const MR: usize, const NR: usize> = [[[__m256; 2]; NR]; MR];

/// # Safety
/// The CPU has AVX; `t` addresses MR rows of `t.valid` writable columns (NR panels at most).
#[inline(always)]
unsafe fn store<const MR: usize, const NR: usize>(t: &Tile, acc: &Acc<MR, NR>) {
    // SAFETY: the caller's promise: every store is inside the tile's rows and valid columns.
    unsafe {
        for (r, row) in acc.iter().enumerate() {
            for (j, panel) in row.iter().enumerate() {
                for (h, v) in panel.iter().enumerate() {
                    let col = j * PANEL + 8 * h;
                    let cols = t.valid.saturating_sub(col).min(8);
                    let dst = t.out.add(r * t.ldo + col);
                    if cols == 8 {
                        _mm256_storeu_ps(dst, *v);
                    } else if cols > 0 {
                        let mut lanes = [0f32; 8];
                        _mm256_storeu_ps(lanes.as_mut_ptr(), *v);
                        std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, cols);
                    }
                }
            }
        }
    }
}

/// `acc[r] += x[r][kk] * wv` for every row of the tile.
///
/// # Safety
/// The CPU has AVX2 and FMA; `t.x` holds MR rows of `t.k > kk` activations.
#[inline(always)]
unsafe fn fma_rows<const MR: usize, const NR: usize>(
    t: &Tile,
    kk: usize,
    wv: &[[__m256; 2]; NR],
    acc: &mut Acc<MR, NR>,
) {
    // SAFETY: the caller's promise: the reads are rows of `t.x` below `t.k`.
    unsafe {
        for (r, row) in acc.iter_mut().enumerate() {
            let xb = _mm256_broadcast_ss(&*t.x.add(r * t.k + kk));
            for (panel, w) in row.iter_mut().zip(wv) {
                for h in 0..2 {
                    panel[h] = _mm256_fmadd_ps(xb, w[h], panel[h]);
                }
            }
        }
    }
}

/// The f32 panels' product: see `super::avx512::tile`.
///
/// # Safety
/// The CPU has AVX2 and FMA; `t` addresses MR rows of `t.k` activations and MR rows of
/// `t.valid` writable outputs; `w` holds NR panels of `t.k * 16` floats, `stride` floats apart.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile<const MR: usize, const NR: usize>(
    t: &Tile,
    w: *const f32,
    stride: usize,
) {
    // SAFETY: the CPU features and every read and write in bounds are the caller's promise.
    unsafe {
        let mut acc = [[[_mm256_setzero_ps(); 2]; NR]; MR];
        for kk in 0..t.k {
            let mut wv = [[_mm256_setzero_ps(); 2]; NR];
            for (j, v) in wv.iter_mut().enumerate() {
                for (h, half) in v.iter_mut().enumerate() {
                    *half = _mm256_loadu_ps(w.add(j * stride + kk * PANEL + 8 * h));
                }
            }
            fma_rows(t, kk, &wv, &mut acc);
        }
        store(t, &acc);
    }
}

/// A weight from its integer `q` (as f32), scale `s` and minimum `m`, equal to the reference
/// dequantizer's rounded product then rounded add or subtract, in one instruction: the
/// product never rounds. `q` has at most 5 significant bits (Q4_1, Q5_1, Q4_K, Q5_K: the
/// formats with a minimum) and `s` at most 17 (an f16's 11, times a 6-bit K-quant scale),
/// so `q * s` fits f32's 24 and the fused multiply-add rounds only the sum, as the add did.
#[inline(always)]
unsafe fn weight(min: MinKind, q: __m256, s: __m256, m: __m256) -> __m256 {
    // SAFETY: register arithmetic only; the callers run with AVX and FMA enabled.
    unsafe {
        match min {
            MinKind::None => _mm256_mul_ps(q, s),
            MinKind::AddF16 => _mm256_fmadd_ps(q, s, m),
            MinKind::SubScaled => _mm256_fmsub_ps(q, s, m),
        }
    }
}

/// 8 scales `d` of a panel-block of layout `l` from `blk`, as f32: f16, or E8M0 bytes as
/// [`e8m0_half`](crate::quant_format::e8m0_half) forms them (see
/// `dequant_avx512::e8m0x16`, the same lane for lane). `half` picks columns 0-7 or 8-15.
///
/// # Safety
/// The CPU has AVX2 and F16C; `blk` is a panel-block of layout `l`.
#[inline(always)]
unsafe fn d8(l: PanelLayout, blk: *const u8, half: usize) -> __m256 {
    // SAFETY: the caller's promise: the scales are the block's first bytes.
    unsafe {
        match l.scale {
            ScaleKind::F16 => {
                _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * half) as *const __m128i))
            }
            ScaleKind::E8M0 => {
                let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(8 * half) as *const __m128i));
                let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
                let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
                let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
                _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small))
            }
        }
    }
}

/// The integers of two k-rows of 8 columns from their 8 bytes of nibbles at `p` (the even row
/// in the low nibbles): each nibble less the layout's offset, or for E2M1 codes its
/// [`E2M1_VALUES`] entry.
///
/// # Safety
/// The CPU has AVX2; `p` holds 8 readable bytes; `l` has nibbles.
#[inline(always)]
unsafe fn nibble_rows(l: PanelLayout, p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller's promise; register operations after the load.
    unsafe {
        let raw = _mm_loadl_epi64(p as *const __m128i);
        if l.e2m1 {
            let low = _mm_set1_epi8(0x0F);
            let table = _mm_loadu_si128(E2M1_VALUES.as_ptr() as *const __m128i);
            let even = _mm_shuffle_epi8(table, _mm_and_si128(raw, low));
            let odd = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(raw), low));
            return (_mm256_cvtepi8_epi32(even), _mm256_cvtepi8_epi32(odd));
        }
        let q = _mm256_cvtepu8_epi32(raw);
        let mut lo = _mm256_and_si256(q, _mm256_set1_epi32(0x0F));
        let mut hi = _mm256_srli_epi32::<4>(q);
        if l.nibble_offset != 0 {
            let offset = _mm256_set1_epi32(l.nibble_offset);
            lo = _mm256_sub_epi32(lo, offset);
            hi = _mm256_sub_epi32(hi, offset);
        }
        (lo, hi)
    }
}

/// The product over quantized panels of format `FMT` (see [`PanelLayout`]), `stride` bytes
/// apart. Each k-row of 16 weights is dequantized in registers exactly as the reference
/// dequantizer does it and fed to the same FMA chain as [`tile`], so the outputs equal those
/// of the dequantized f32 panels.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `t` addresses MR rows of `t.k` activations (a multiple of
/// the format's super-block) and MR rows of `t.valid` writable outputs; `w` holds NR quantized
/// panels of `FMT`, `stride` bytes apart, each covering `t.k`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn qtile<const MR: usize, const NR: usize, const FMT: u8>(
    t: &Tile,
    w: *const u8,
    stride: usize,
) {
    // SAFETY: the CPU features and the bounds of every load and store are the caller's promise:
    // every offset below is inside one panel-block of the layout.
    unsafe {
        let l = const { QuantFormat::from_id(FMT).panel_layout() };
        let block = l.block_bytes();
        let zero = _mm256_setzero_ps();
        let mut acc = [[[zero; 2]; NR]; MR];
        let f16x8 = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let i8x8 = |p: *const u8| {
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
        };
        for sb in 0..t.k / l.super_rows {
            let k0 = sb * l.super_rows;
            let blk = |j: usize| w.add(j * stride + sb * block);
            let mut d = [[zero; 2]; NR];
            let mut m = [[zero; 2]; NR];
            for j in 0..NR {
                for h in 0..2 {
                    d[j][h] = d8(l, blk(j), h);
                    if l.min != MinKind::None {
                        m[j][h] = f16x8(blk(j).add(l.min_at() + 16 * h));
                    }
                }
            }
            for sub in 0..l.subs() {
                let (mut s, mut o) = (d, m);
                if l.sub_scales {
                    for j in 0..NR {
                        for h in 0..2 {
                            let at = sub * 16 + 8 * h;
                            s[j][h] = _mm256_mul_ps(d[j][h], i8x8(blk(j).add(l.scales_at() + at)));
                            if l.min == MinKind::SubScaled {
                                o[j][h] =
                                    _mm256_mul_ps(m[j][h], i8x8(blk(j).add(l.mins_at() + at)));
                            }
                        }
                    }
                }
                let r0 = sub * l.sub_rows;
                if l.nibbles {
                    for pair in r0 / 2..(r0 + l.sub_rows) / 2 {
                        let mut even = [[zero; 2]; NR];
                        let mut odd = [[zero; 2]; NR];
                        for j in 0..NR {
                            for h in 0..2 {
                                let at = l.quants_at() + pair * PANEL + 8 * h;
                                let (lo, hi) = nibble_rows(l, blk(j).add(at));
                                even[j][h] =
                                    weight(l.min, _mm256_cvtepi32_ps(lo), s[j][h], o[j][h]);
                                odd[j][h] = weight(l.min, _mm256_cvtepi32_ps(hi), s[j][h], o[j][h]);
                            }
                        }
                        fma_rows(t, k0 + 2 * pair, &even, &mut acc);
                        fma_rows(t, k0 + 2 * pair + 1, &odd, &mut acc);
                    }
                } else {
                    for row in r0..r0 + l.sub_rows {
                        let mut wv = [[zero; 2]; NR];
                        for j in 0..NR {
                            for h in 0..2 {
                                let q = i8x8(blk(j).add(l.quants_at() + row * PANEL + 8 * h));
                                wv[j][h] = weight(l.min, q, s[j][h], o[j][h]);
                            }
                        }
                        fma_rows(t, k0 + row, &wv, &mut acc);
                    }
                }
            }
        }
        store(t, &acc);
    }
}

/// Dequantizes one quantized panel of format `FMT` over `k` into `out` as f32 panel rows
/// (`[k][16]`), with the arithmetic of [`qtile`]: large steps multiply these with [`tile`] and
/// dequantize each weight once per call rather than once per six rows, with the same results.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` holds one quantized panel of `FMT` covering `k` (a
/// multiple of the format's super-block) and `out` has room for `k * 16` floats.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequantize_panel<const FMT: u8>(w: *const u8, k: usize, out: *mut f32) {
    // SAFETY: the CPU features and the bounds of every load and store are the caller's promise:
    // every offset below is inside one panel-block of the layout, every store below `k * 16`.
    unsafe {
        let l = const { QuantFormat::from_id(FMT).panel_layout() };
        let block = l.block_bytes();
        let zero = _mm256_setzero_ps();
        let f16x8 = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let i8x8 = |p: *const u8| {
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
        };
        for sb in 0..k / l.super_rows {
            let blk = w.add(sb * block);
            let k0 = sb * l.super_rows;
            let mut d = [zero; 2];
            let mut m = [zero; 2];
            for h in 0..2 {
                d[h] = d8(l, blk, h);
                if l.min != MinKind::None {
                    m[h] = f16x8(blk.add(l.min_at() + 16 * h));
                }
            }
            for sub in 0..l.subs() {
                let (mut s, mut o) = (d, m);
                if l.sub_scales {
                    for h in 0..2 {
                        let at = sub * 16 + 8 * h;
                        s[h] = _mm256_mul_ps(d[h], i8x8(blk.add(l.scales_at() + at)));
                        if l.min == MinKind::SubScaled {
                            o[h] = _mm256_mul_ps(m[h], i8x8(blk.add(l.mins_at() + at)));
                        }
                    }
                }
                let r0 = sub * l.sub_rows;
                for h in 0..2 {
                    if l.nibbles {
                        for pair in r0 / 2..(r0 + l.sub_rows) / 2 {
                            let at = l.quants_at() + pair * PANEL + 8 * h;
                            let (lo, hi) = nibble_rows(l, blk.add(at));
                            let row = k0 + 2 * pair;
                            _mm256_storeu_ps(
                                out.add(row * PANEL + 8 * h),
                                weight(l.min, _mm256_cvtepi32_ps(lo), s[h], o[h]),
                            );
                            _mm256_storeu_ps(
                                out.add((row + 1) * PANEL + 8 * h),
                                weight(l.min, _mm256_cvtepi32_ps(hi), s[h], o[h]),
                            );
                        }
                    } else {
                        for row in r0..r0 + l.sub_rows {
                            let q = i8x8(blk.add(l.quants_at() + row * PANEL + 8 * h));
                            _mm256_storeu_ps(
                                out.add((k0 + row) * PANEL + 8 * h),
                                weight(l.min, q, s[h], o[h]),
                            );
                        }
                    }
                }
            }
        }
    }
}
