//! AVX-512 microkernels for every panel layout (the K-quants, Q5_0 and Q5_1 included), read
//! through [`PanelLayout`](crate::quant_format::PanelLayout) as the AVX2 kernels read it, with
//! a panel's 16 columns in one register. A one-row decode step of a Q4_K_M file is bound by
//! forming its weights (unpack, convert, scale: three operations a weight before its FMA), so
//! twice the lanes nearly halve it. Each output column is the same chain of FMAs in the same k
//! order as in [`super::avx2`] and `super::x86`, so the results are bit-identical to theirs.

use std::arch::x86_64::*;

use super::x86::{fma_rows, store, Tile};
use crate::cpu::panel_avx512::{f16x16, i8x16, sub_scales, weight};
use crate::quant_format::{MinKind, QuantFormat, PANEL_COLUMNS as PANEL};

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
        let low = _mm512_set1_epi32(0x0F);
        let offset = _mm512_set1_epi32(l.nibble_offset);
        let zero = _mm512_setzero_ps();
        let mut acc = [[zero; NR]; MR];
        for sb in 0..t.k / l.super_rows {
            let k0 = sb * l.super_rows;
            let blk = |j: usize| w.add(j * stride + sb * block);
            let mut d = [zero; NR];
            let mut m = [zero; NR];
            for j in 0..NR {
                d[j] = f16x16(blk(j));
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
                            let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                blk(j).add(l.quants_at() + pair * PANEL) as *const __m128i,
                            ));
                            let mut lo = _mm512_and_si512(q, low);
                            let mut hi = _mm512_srli_epi32(q, 4);
                            if l.nibble_offset != 0 {
                                lo = _mm512_sub_epi32(lo, offset);
                                hi = _mm512_sub_epi32(hi, offset);
                            }
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
        let low = _mm512_set1_epi32(0x0F);
        let offset = _mm512_set1_epi32(l.nibble_offset);
        for sb in 0..k / l.super_rows {
            let blk = w.add(sb * block);
            let out = out.add(sb * l.super_rows * PANEL);
            let d = f16x16(blk);
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
                        let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                            blk.add(l.quants_at() + pair * PANEL) as *const __m128i,
                        ));
                        let mut lo = _mm512_and_si512(q, low);
                        let mut hi = _mm512_srli_epi32(q, 4);
                        if l.nibble_offset != 0 {
                            lo = _mm512_sub_epi32(lo, offset);
                            hi = _mm512_sub_epi32(hi, offset);
                        }
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
