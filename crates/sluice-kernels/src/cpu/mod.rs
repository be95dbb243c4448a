//! Kernels for the CPU. Each checks at run time that the CPU has the instructions it needs
//! (`available`/`supports`) and is compiled with `#[target_feature]`, so a portable build still
//! runs its AVX-512 and AMX paths where the CPU has them.

#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod attention;
pub mod gemm;
pub mod int8_matmul;
#[cfg(target_arch = "x86_64")]
mod panel_avx512;
pub mod rows;
mod simd;
pub mod swiglu;

/// The first `len` elements of a per-thread scratch buffer, grown (never shrunk) to hold them.
/// Calls of different sizes then zero it only when it outgrows its largest size yet, not each
/// time one needs more than the call before (a step's matrices alternate in size).
pub(crate) fn scratch<T: Copy + Default>(buffer: &mut Vec<T>, len: usize) -> &mut [T] {
    if buffer.len() < len {
        buffer.resize(len, T::default());
    }
    &mut buffer[..len]
}

/// 64 bytes on a 64-byte boundary: what buffers that AMX tiles are loaded from or stored to
/// are made of. Heap buffers of bytes or floats are only 16-byte aligned, and a tile whose
/// 64-byte rows straddle cache lines loaded 8x slower on the AMX host (1 KiB in 16 ns against
/// 2 ns).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct CacheLine([u8; 64]);

impl Default for CacheLine {
    fn default() -> Self {
        CacheLine([0; 64])
    }
}

impl CacheLine {
    /// Lines enough to hold `bytes` bytes.
    pub(crate) fn count(bytes: usize) -> usize {
        bytes.div_ceil(64)
    }

    /// The bytes of `lines`.
    pub(crate) fn bytes(lines: &[CacheLine]) -> &[u8] {
        // SAFETY: a `CacheLine` is 64 bytes with no padding (`repr(C)` around `[u8; 64]`), so
        // the lines are `64 * len` initialized bytes, borrowed as long as `lines`.
        unsafe { std::slice::from_raw_parts(lines.as_ptr().cast(), 64 * lines.len()) }
    }

    /// The bytes of `lines`, writable.
    pub(crate) fn bytes_mut(lines: &mut [CacheLine]) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed exclusively as long as `lines`; any byte pattern is
        // a valid `CacheLine`.
        unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast(), 64 * lines.len()) }
    }
}
