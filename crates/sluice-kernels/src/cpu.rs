//! Kernels for the CPU. Each checks at run time that the CPU has the instructions it needs
//! (`available`/`supports`) and is compiled with `#[target_feature]`, so a portable build still
//! runs its AVX-512 and AMX paths where the CPU has them.
//!
//! Each kernel family is a file with its dispatch and portable code, beside a folder of its
//! kernels named by instruction set, or by format where that is the split: [`gemm`] (f32 and
//! quantized weights packed in panels: `gemm/avx2.rs`, `gemm/avx512.rs`), [`int8_matmul`]
//! (int8 dots against GGUF blocks: `int8_matmul/legacy_panel.rs` the legacy formats on AVX2
//! and AVX-512 VNNI, `int8_matmul/kquant_avx2.rs` and `int8_matmul/kquant_vnni.rs` the
//! K-quants), [`amx`] (split-bf16 tiles; the integer and int8 tiles in `amx/integer.rs`,
//! `amx/int8.rs`) and [`attention`] (`attention/avx2.rs`, `attention/avx512.rs`,
//! `attention/portable.rs`, and the 8-bit cache in `attention/q8.rs`); [`delta_net`] is the
//! hybrids' recurrent mixer (portable code the compiler vectorises). `dequant_avx512.rs`
//! forms f32 weights from quantized panels on AVX-512 for both `gemm` and `amx`.

#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod attention;
pub mod delta_net;
#[cfg(target_arch = "x86_64")]
mod dequant_avx512;
pub mod gemm;
pub mod int8_matmul;
pub mod rows;
mod simd;
pub mod softmax;
pub mod swiglu;

use std::sync::atomic::{AtomicU8, Ordering};

/// The instruction sets the CPU kernels choose between, in the order each adds to the last.
/// Every kernel of a weight format computes each row bit for bit as the others of that format
/// do (docs/design.md), so a tier changes speed, never a result; tests check it by running
/// every tier this CPU has in turn ([`limit_kernels`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum KernelTier {
    /// AVX2, FMA and F16C (x86-64-v3): the packed and int8 kernels' floor.
    Avx2,
    /// AVX-512 F and BW: the packed kernel's 16-lane microkernels and SwiGLU, and paged
    /// attention's 16-lane kernel (whose lanes compute as the AVX2 kernel's do).
    Avx512,
    /// AVX-512 VNNI (and VL): the int8 dots by `vpdpbusd`, the legacy formats' and the K-quants'
    /// (`int8_matmul/legacy_panel.rs`, `int8_matmul/kquant_vnni.rs`).
    Avx512Vnni,
    /// AMX tiles (where a weight kind asks for them).
    Amx,
}

/// The highest tier kernels may use ([`limit_kernels`]); `u8::MAX`: whatever the CPU has.
static LIMIT: AtomicU8 = AtomicU8::new(u8::MAX);

/// Keeps every CPU kernel chosen from now on at or below `tier`, process-wide: for tests that
/// compare the kernels of one CPU, and for measuring one tier against another. Matrices choose
/// some kernels when they are built, so set it before loading a model.
pub fn limit_kernels(tier: KernelTier) {
    LIMIT.store(tier as u8, Ordering::Relaxed);
}

/// Whether kernels of `tier` may run (the CPU having them is the caller's check).
pub(crate) fn allows(tier: KernelTier) -> bool {
    LIMIT.load(Ordering::Relaxed) >= tier as u8
}

/// The vector width of the kernels written for AVX-512F or else AVX2 with FMA (the gated
/// activations, the softmax): `Some(true)` for AVX-512 (unless [`limit_kernels`] caps it),
/// `Some(false)` for AVX2, `None` for neither.
pub(crate) fn vector_path() -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static PATH: OnceLock<Option<bool>> = OnceLock::new();
        let path = *PATH.get_or_init(|| {
            if is_x86_feature_detected!("avx512f") {
                Some(true)
            } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                Some(false)
            } else {
                None
            }
        });
        path.map(|wide| wide && allows(KernelTier::Avx512))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

impl KernelTier {
    /// The tiers this CPU has, lowest first (empty without AVX2).
    pub fn available() -> Vec<KernelTier> {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            let avx512 = avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl");
            let vnni = avx512 && is_x86_feature_detected!("avx512vnni");
            [
                (KernelTier::Avx2, avx2),
                (KernelTier::Avx512, avx512),
                (KernelTier::Avx512Vnni, vnni),
                (KernelTier::Amx, avx512 && amx::hardware()),
            ]
            .into_iter()
            .filter_map(|(t, has)| has.then_some(t))
            .collect()
        }
        #[cfg(not(target_arch = "x86_64"))]
        Vec::new()
    }
}

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
