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
