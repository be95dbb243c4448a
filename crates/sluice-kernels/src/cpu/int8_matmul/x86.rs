//! What the x86 kernels of `int8_matmul` share: one f16 scale as a float, prefetches ahead of
//! a weight row streaming from memory, and the panel kernels' masked ternary and stores.

use std::arch::x86_64::*;

/// `$kernel::<M>(args...)` for `M` the number of activation rows `$n`, one of `$m` or else
/// `$last`: the panel kernels are instantiated per row count, so that a pass keeps each row's
/// accumulators in registers.
macro_rules! for_rows {
    ($n:expr, $kernel:ident, [$($m:literal),*], $last:literal, $args:expr) => {{
        let (a, b, c, d, e, f) = $args;
        match $n {
            $($m => $kernel::<$m>(a, b, c, d, e, f),)*
            _ => $kernel::<$last>(a, b, c, d, e, f),
        }
    }};
}
pub(super) use for_rows;

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

/// `a | (b & c)` in one instruction.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
pub(in crate::cpu::int8_matmul) unsafe fn or_masked(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    // SAFETY: AVX-512 F is the caller's promise; register operations only.
    unsafe { _mm512_ternarylogic_epi32::<0xF8>(a, b, c) }
}

/// Panel `p`'s results (`acc[m]`: its 16 weight rows against activation row `m`) into
/// `dots[m * weight_rows + 16 * p..]`, only the rows the matrix has (the last panel's may be
/// fewer than 16).
///
/// # Safety
/// The CPU has AVX-512 F; panel `p` holds weight rows below `weight_rows`, and `dots` holds
/// `M * weight_rows` floats.
#[inline(always)]
pub(in crate::cpu::int8_matmul) unsafe fn store_panel<const M: usize>(
    acc: &[__m512; M],
    p: usize,
    weight_rows: usize,
    dots: &mut [f32],
) {
    use super::panels::PANEL_ROWS;
    let first = p * PANEL_ROWS;
    let valid = PANEL_ROWS.min(weight_rows - first);
    let mask: __mmask16 = if valid == PANEL_ROWS {
        !0
    } else {
        (1 << valid) - 1
    };
    for (m, acc) in acc.iter().enumerate() {
        let to = &mut dots[m * weight_rows + first..][..valid];
        // SAFETY: AVX-512 F is the caller's promise; the mask writes `valid` floats, the length
        // of `to`.
        unsafe { _mm512_mask_storeu_ps(to.as_mut_ptr(), mask, *acc) };
    }
}

/// The 4 activations at `at` of the quants `row` in every 32-bit lane: what a panel kernel's
/// `vpdpbusd` multiplies 4 weights of each of its 16 rows by.
///
/// # Safety
/// The CPU has AVX-512 F; `row + at..row + at + 4` is readable.
#[inline(always)]
pub(in crate::cpu::int8_matmul) unsafe fn four(row: *const i8, at: usize) -> __m512i {
    // SAFETY: the caller's promise; unaligned read of 4 bytes.
    unsafe { _mm512_set1_epi32((row.add(at) as *const i32).read_unaligned()) }
}
