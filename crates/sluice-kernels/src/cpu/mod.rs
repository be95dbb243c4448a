//! Kernels for the CPU. Each checks at run time that the CPU has the instructions it needs
//! (`available`/`supports`) and is compiled with `#[target_feature]`, so a portable build still
//! runs its AVX-512 and AMX paths where the CPU has them.

#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod attention;
pub mod gemm;
pub mod int8_matmul;
pub mod rows;
mod simd;
pub mod swiglu;
