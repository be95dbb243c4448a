//! What every x86 kernel of `int8_matmul` reads its weights with: one f16 scale as a float,
//! and prefetches ahead of a weight row streaming from memory.

use std::arch::x86_64::*;

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
