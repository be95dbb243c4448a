//! sluice's CUDA kernels (`crates/sluice-kernels/cuda/*.cu`), compiled to PTX by the build
//! script and launched on candle tensors through candle's custom-op API: each entry point is a
//! safe function over tensors that checks shapes, dtypes and devices, with the one `unsafe`
//! launch inside. What each launch computes and its grid come from [`crate::cuda_plan`].
//!
//! These kernels compile with nvcc 13.0 for sm_90 and pass `ptxas -v` with no spills (the
//! build checks both), their host-side plan is tested on the CPU against the CPU attention
//! kernel, and they run on H200s in `sluice-model/tests/gpu.rs` (`scripts/gpu-check.sh`):
//! against the CPU forward, and graph replays against their launches bit for bit.
//!
//! - [`write_kv`]: the step's K and V into the paged cache through `slot_mapping`, one launch.
//! - [`paged_attention`]: varlen paged attention over a whole mixed step, one launch (two with
//!   split-K).
//! - [`add_rms_norm`], [`rope_qk`], [`swiglu`]: fused element-wise steps.
//! - [`direct`]: the same kernels (and cuBLAS) writing buffers the caller owns, for a decode
//!   step captured once as a CUDA graph ([`graph`]) and replayed.
//! - [`DeviceSampler`]: greedy, temperature, top-k, top-p and min-p sampling of a step's rows
//!   on the device, by the rule of [`crate::sampling`], in one upload, launch and download.

mod attention;
mod cache_write;
pub mod direct;
mod fused;
pub mod graph;
mod launch;
mod sampling;

pub use attention::{paged_attention, StepMetadata};
pub use cache_write::write_kv;
pub use fused::{add_rms_norm, rope_qk, swiglu, QkNorm};
pub use launch::View;
pub use sampling::{sample_rows, DeviceSampler, RowSampling, SampledToken};

/// `ptxas -v` for every kernel, as the build saw it (registers, shared memory, spills).
pub const PTXAS_REPORT: &str = include_str!(concat!(env!("OUT_DIR"), "/ptxas-report.txt"));

/// The plan's view of `device`: its number of SMs, asked of the driver, and the decode
/// partition length ([`crate::cuda_plan::DECODE_PARTITION_KEYS`], or
/// `SLUICE_CUDA_DECODE_PARTITION` where a benchmark sets it; a bad value is an error).
///
/// Asked once per process and kept: the eager forward plans every step with it, and a row's
/// partitions (so its logits) must not change while the process runs. One GPU per process
/// (device 0), so one answer serves every call.
pub fn device_limits(
    device: &candle_core::Device,
) -> candle_core::Result<crate::cuda_plan::DeviceLimits> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
    use candle_core::cuda_backend::WrapErr;
    static LIMITS: std::sync::OnceLock<crate::cuda_plan::DeviceLimits> = std::sync::OnceLock::new();
    if let Some(limits) = LIMITS.get() {
        return Ok(*limits);
    }
    let sms = device
        .as_cuda_device()?
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .w()?;
    let knob = std::env::var(crate::cuda_plan::DECODE_PARTITION_VAR).ok();
    let decode_partition_keys = crate::cuda_plan::decode_partition_keys(knob.as_deref())
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    Ok(*LIMITS.get_or_init(|| crate::cuda_plan::DeviceLimits {
        num_sms: sms.max(1) as usize,
        decode_partition_keys,
        split_workspace_rows: crate::cuda_plan::SPLIT_WORKSPACE_ROWS,
    }))
}
