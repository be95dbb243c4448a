//! sluice-kernels: the compute kernels of sluice, knowing nothing of models. They work on plain
//! slices: a packed f32 GEMM with quantized panels ([`cpu::gemm`]), split-bf16 products on AMX
//! tiles ([`cpu::amx`]), int8-dot products against GGUF blocks ([`cpu::int8_matmul`]), paged
//! attention over a block-major KV cache ([`cpu::attention`]), and fused element-wise ops
//! ([`cpu::swiglu`]); the rule a model samples its own rows by ([`sampling`]). CUDA kernels
//! sit beside them in a `cuda` module (the `cuda` feature; run on H200s by
//! `scripts/gpu-check.sh`), planned by [`cuda_plan`], which is plain Rust built and tested
//! always.
//!
//! This crate is the project's unsafe boundary: SIMD intrinsics, AMX assembly and the raw
//! pointers of parallel writes live here, each `unsafe` block with a `SAFETY:` comment and each
//! `unsafe fn` with a `# Safety` section (the workspace lints enforce both). The other crates
//! call only safe functions of this one.
#![allow(unsafe_code)]

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod cuda_plan;
pub mod disjoint;
pub mod paged;
pub mod ptxas_report;
pub mod quant_format;
pub mod sampling;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use cpu::attention::KvElem;
pub use cpu::gemm::PackedMatrix;
pub use cpu::int8_matmul::{ActivationBlocks, QuantMatrix, QuantizedActivations};
pub use disjoint::DisjointSlice;
pub use paged::{AttentionShape, KvLayout, SequenceSlice};
pub use quant_format::QuantFormat;
pub use sampling::{RowSampling, SampledToken};
