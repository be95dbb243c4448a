//! AVX-512 microkernels of the packed gemm, a panel's 16 columns in one register: the f32
//! panels' ([`tile`]: per k, NR panel loads and MR broadcasts feed MR x NR FMAs into
//! accumulators that live for the whole of `k`), the legacy layouts' (Q4_0, Q4_1, Q8_0:
//! [`legacy_qtile`]), and every other panel layout's (the K-quants, Q5_0 and Q5_1: [`qtile`]),
//! read through [`PanelLayout`](crate::quant_format::PanelLayout) as the AVX2 kernels read it.
//! A one-row decode step of a Q4_K_M file is bound by forming its weights (unpack, convert,
//! scale: three operations a weight before its FMA), so twice the lanes nearly halve it. Each
//! output column is the same chain of FMAs in the same k order in every kernel here and in
//! [`super::avx2`], so the results are bit-identical whichever runs.

use std::arch::x86_64::*;

use super::Tile;
use crate::cpu::dequant_avx512::{d16, f16x16, i8x16, nibble_rows, sub_scales, weight};
use crate::quant_format::{MinKind, QuantFormat, BLOCK_WEIGHTS as QBLOCK, PANEL_COLUMNS as PANEL};

/// # Safety
/// The CPU has AVX-512F; `t` addresses MR rows of `t.valid` writable columns (NR panels at
/// most).
#[inline(always)]
unsafe fn store<const MR: usize, const NR: usize>(t: &Tile, acc: &[[__m512; NR]; MR]) {
    // SAFETY: the caller's promise: every store is inside the tile's rows and valid columns.
    unsafe {
        for (r, row) in acc.iter().enumerate() {
            for (j, a) in row.iter().enumerate() {
                let cols = t.valid.saturating_sub(j * PANEL).min(PANEL);
                let dst = t.out.add(r * t.ldo + j * PANEL);
                if cols == PANEL {
                    _mm512_storeu_ps(dst, *a);
                } else if cols > 0 {
                    _mm512_mask_storeu_ps(dst, ((1u32 << cols) - 1) as u16, *a);
                }
            }
        }
    }
}

/// `out[r][c] = sum_k x[r][k] * panel[c / 16][k][c % 16]` over f32 panels `w`, `stride`
/// floats apart: per k, NR panel loads and MR broadcasts feed MR x NR FMAs.
///
/// # Safety
/// The CPU has AVX-512F; `t` addresses MR rows of `t.k` activations and MR rows of
/// `t.valid` writable outputs; `w` holds NR panels of `t.k * 16` floats, `stride` floats apart.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile<const MR: usize, const NR: usize>(
    t: &Tile,
    w: *const f32,
    stride: usize,
) {
    // SAFETY: AVX-512F and every read and write in bounds are the caller's promise.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        for kk in 0..t.k {
            let mut wv = [_mm512_setzero_ps(); NR];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(w.add(j * stride + kk * PANEL));
            }
            fma_rows(t, kk, &wv, &mut acc);
        }
        store(t, &acc);
    }
}

/// # Safety
/// The CPU has AVX-512F; `t.x` holds MR rows of `t.k > kk` activations.
#[inline(always)]
unsafe fn fma_rows<const MR: usize, const NR: usize>(
    t: &Tile,
    kk: usize,
    wv: &[__m512; NR],
    acc: &mut [[__m512; NR]; MR],
) {
    // SAFETY: the caller's promise: the reads are rows of `t.x` below `t.k`.
    unsafe {
        for (r, row) in acc.iter_mut().enumerate() {
            let xb = _mm512_set1_ps(*t.x.add(r * t.k + kk));
            for (j, a) in row.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(xb, wv[j], *a);
            }
        }
    }
}

/// The same product over quantized panels of a legacy layout (Q4_0, Q4_1, Q8_0), `stride`
/// bytes apart. Each k-row of 16 weights is dequantized as candle does it (one multiply, then
/// one add for Q4_1) and fed to the same FMA sequence as [`tile`], so the outputs are
/// identical to the f32 panels'.
///
/// # Safety
/// The CPU has AVX-512F, BW and F16C; `t` addresses MR rows of `t.k` activations (a multiple
/// of 32) and MR rows of `t.valid` writable outputs; `w` holds NR quantized panels of `FMT`,
/// `stride` bytes apart, each covering `t.k`.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub(super) unsafe fn legacy_qtile<const MR: usize, const NR: usize, const FMT: u8>(
    t: &Tile,
    w: *const u8,
    stride: usize,
) {
    // SAFETY: the CPU features and the bounds of every load and store are the caller's promise.
    unsafe {
        let block = super::panel_block_bytes(FMT);
        let quants_at = if FMT == QuantFormat::Q4_1_ID { 64 } else { 32 };
        let low = _mm_set1_epi8(0x0F);
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        for kb in 0..t.k / QBLOCK {
            let mut d = [_mm512_setzero_ps(); NR];
            let mut m = [_mm512_setzero_ps(); NR];
            for j in 0..NR {
                let blk = w.add(j * stride + kb * block);
                d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
                if FMT == QuantFormat::Q4_1_ID {
                    m[j] = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32) as *const __m256i));
                }
            }
            let k0 = kb * QBLOCK;
            if FMT == QuantFormat::Q8_0_ID {
                for kk in 0..QBLOCK {
                    let mut wv = [_mm512_setzero_ps(); NR];
                    for j in 0..NR {
                        let q = _mm_loadu_si128(
                            w.add(j * stride + kb * block + quants_at + kk * PANEL)
                                as *const __m128i,
                        );
                        wv[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d[j]);
                    }
                    fma_rows(t, k0 + kk, &wv, &mut acc);
                }
            } else {
                for pair in 0..QBLOCK / 2 {
                    let mut even = [_mm512_setzero_ps(); NR];
                    let mut odd = [_mm512_setzero_ps(); NR];
                    for j in 0..NR {
                        let q = _mm_loadu_si128(
                            w.add(j * stride + kb * block + quants_at + pair * PANEL)
                                as *const __m128i,
                        );
                        let mut lo = _mm512_cvtepu8_epi32(_mm_and_si128(q, low));
                        let mut hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low));
                        if FMT == QuantFormat::Q4_0_ID {
                            lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(8));
                            hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(8));
                        }
                        even[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d[j]);
                        odd[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d[j]);
                        if FMT == QuantFormat::Q4_1_ID {
                            even[j] = _mm512_add_ps(even[j], m[j]);
                            odd[j] = _mm512_add_ps(odd[j], m[j]);
                        }
                    }
                    fma_rows(t, k0 + 2 * pair, &even, &mut acc);
                    fma_rows(t, k0 + 2 * pair + 1, &odd, &mut acc);
                }
            }
        }
        store(t, &acc);
    }
}

/// The product over quantized panels of format `FMT`, `stride` bytes apart: each k-row of 16
/// weights is formed in one register exactly as the reference dequantizer forms it and fed to
/// the f32 kernel's FMA chain.
///
/// # Safety
/// The CPU has AVX-512F and BW; `t` addresses MR rows of `t.k` activations (a multiple of the
/// format's super-block) and MR rows of `t.valid` writable outputs; `w` holds NR quantized
/// panels of `FMT`, `stride` bytes apart, each covering `t.k`.
#[target_feature(enable = "avx512f,avx512bw")]
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
        let zero = _mm512_setzero_ps();
        let mut acc = [[zero; NR]; MR];
        for sb in 0..t.k / l.super_rows {
            let k0 = sb * l.super_rows;
            let blk = |j: usize| w.add(j * stride + sb * block);
            let mut d = [zero; NR];
            let mut m = [zero; NR];
            for j in 0..NR {
                d[j] = d16(l, blk(j));
                if l.min != MinKind::None {
                    m[j] = f16x16(blk(j).add(l.min_at()));
                }
            }
            for sub in 0..l.subs() {
                let mut s = [zero; NR];
                let mut o = [zero; NR];
                for j in 0..NR {
                    (s[j], o[j]) = sub_scales(l, blk(j), sub, d[j], m[j]);
                }
                let r0 = sub * l.sub_rows;
                if l.nibbles {
                    for pair in r0 / 2..(r0 + l.sub_rows) / 2 {
                        let mut even = [zero; NR];
                        let mut odd = [zero; NR];
                        for j in 0..NR {
                            let (lo, hi) = nibble_rows(l, blk(j).add(l.quants_at() + pair * PANEL));
                            even[j] = weight(l.min, _mm512_cvtepi32_ps(lo), s[j], o[j]);
                            odd[j] = weight(l.min, _mm512_cvtepi32_ps(hi), s[j], o[j]);
                        }
                        fma_rows(t, k0 + 2 * pair, &even, &mut acc);
                        fma_rows(t, k0 + 2 * pair + 1, &odd, &mut acc);
                    }
                } else {
                    for row in r0..r0 + l.sub_rows {
                        let mut wv = [zero; NR];
                        for j in 0..NR {
                            let q = i8x16(blk(j).add(l.quants_at() + row * PANEL));
                            wv[j] = weight(l.min, q, s[j], o[j]);
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
/// (`[k][16]`), with the arithmetic of [`qtile`] (and of `super::avx2::dequantize_panel`, bit
/// for bit).
///
/// # Safety
/// The CPU has AVX-512F and BW; `w` holds one quantized panel of `FMT` covering `k` (a
/// multiple of the format's super-block) and `out` has room for `k * 16` floats.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn dequantize_panel<const FMT: u8>(w: *const u8, k: usize, out: *mut f32) {
    // SAFETY: the CPU features and the bounds of every load and store are the caller's promise:
    // every offset below is inside one panel-block of the layout, every store below `k * 16`.
    unsafe {
        let l = const { QuantFormat::from_id(FMT).panel_layout() };
        let block = l.block_bytes();
        for sb in 0..k / l.super_rows {
            let blk = w.add(sb * block);
            let out = out.add(sb * l.super_rows * PANEL);
            let d = d16(l, blk);
            let m = if l.min != MinKind::None {
                f16x16(blk.add(l.min_at()))
            } else {
                _mm512_setzero_ps()
            };
            for sub in 0..l.subs() {
                let (s, o) = sub_scales(l, blk, sub, d, m);
                let r0 = sub * l.sub_rows;
                if l.nibbles {
                    for pair in r0 / 2..(r0 + l.sub_rows) / 2 {
                        let (lo, hi) = nibble_rows(l, blk.add(l.quants_at() + pair * PANEL));
                        let row = 2 * pair;
                        _mm512_storeu_ps(
                            out.add(row * PANEL),
                            weight(l.min, _mm512_cvtepi32_ps(lo), s, o),
                        );
                        _mm512_storeu_ps(
                            out.add((row + 1) * PANEL),
                            weight(l.min, _mm512_cvtepi32_ps(hi), s, o),
                        );
                    }
                } else {
                    for row in r0..r0 + l.sub_rows {
                        let q = i8x16(blk.add(l.quants_at() + row * PANEL));
                        _mm512_storeu_ps(out.add(row * PANEL), weight(l.min, q, s, o));
                    }
                }
            }
        }
    }
}
