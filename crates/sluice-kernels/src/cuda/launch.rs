//! What every launcher shares: the embedded PTX modules, kernel names by element type, and
//! device memory of a tensor (from its layout's start) as a kernel argument of any dtype.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::CUdeviceptr;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaStream, CudaView, DevicePtr, LaunchArgs, LaunchConfig, PushKernelArg,
    SyncOnDrop,
};
use candle_core::cuda_backend::{CudaDevice, CudaStorageSlice};
use candle_core::{CudaStorage, DType, Layout, Result, Storage};
use half::{bf16, f16};

use crate::cuda_plan::LaunchDims;

/// A PTX module of ours: one `.cu` file.
#[derive(Debug, Clone, Copy)]
pub(super) enum Module {
    CacheWrite,
    PagedAttention,
    Fused,
    Sampling,
}

impl Module {
    fn name(self) -> &'static str {
        match self {
            Self::CacheWrite => "sluice_cache_write",
            Self::PagedAttention => "sluice_paged_attention",
            Self::Fused => "sluice_fused",
            Self::Sampling => "sluice_sampling",
        }
    }

    fn ptx(self) -> &'static str {
        match self {
            Self::CacheWrite => include_str!(concat!(env!("OUT_DIR"), "/cache_write.ptx")),
            Self::PagedAttention => include_str!(concat!(env!("OUT_DIR"), "/paged_attention.ptx")),
            Self::Fused => include_str!(concat!(env!("OUT_DIR"), "/fused.ptx")),
            Self::Sampling => include_str!(concat!(env!("OUT_DIR"), "/sampling.ptx")),
        }
    }

    /// Kernel `name` of this module, loaded once per device (candle caches the module). Launch
    /// it on the device's stream: `dev.cuda_stream().launch_builder(&function)`.
    pub(super) fn function(self, dev: &CudaDevice, name: &str) -> Result<CudaFunction> {
        Ok(dev
            .get_or_load_custom_func(name, self.name(), self.ptx())?
            .into_cuda_function())
    }
}

/// The suffix our kernel names use for an element type.
pub(super) fn suffix(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => candle_core::bail!("sluice's CUDA kernels do not take {other:?} tensors"),
    })
}

pub(super) fn config(dims: LaunchDims) -> LaunchConfig {
    LaunchConfig {
        grid_dim: dims.grid,
        block_dim: dims.block,
        shared_mem_bytes: dims.dynamic_shared_bytes,
    }
}

/// A tensor's device memory from its layout's start offset, whatever its element type.
pub enum View<'a> {
    F32(CudaView<'a, f32>),
    F16(CudaView<'a, f16>),
    BF16(CudaView<'a, bf16>),
    U32(CudaView<'a, u32>),
}

impl<'a> View<'a> {
    /// `storage` from `layout`'s start; it must be contiguous from there on (rows may be a
    /// strided view only where a launcher passes the stride, and says so).
    pub fn new(storage: &'a CudaStorage, layout: &Layout) -> Result<Self> {
        let at = layout.start_offset();
        Ok(match &storage.slice {
            CudaStorageSlice::F32(s) => Self::F32(s.slice(at..)),
            CudaStorageSlice::F16(s) => Self::F16(s.slice(at..)),
            CudaStorageSlice::BF16(s) => Self::BF16(s.slice(at..)),
            CudaStorageSlice::U32(s) => Self::U32(s.slice(at..)),
            _ => candle_core::bail!("sluice's CUDA kernels do not take {:?}", storage.dtype()),
        })
    }

    /// Elements from the start offset to the end of the allocation.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::F16(v) => v.len(),
            Self::BF16(v) => v.len(),
            Self::U32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device address, for a library call (cuBLAS) on `stream`.
    pub(super) fn device_ptr<'s>(
        &'s self,
        stream: &'s CudaStream,
    ) -> (CUdeviceptr, SyncOnDrop<'s>) {
        match self {
            Self::F32(v) => v.device_ptr(stream),
            Self::F16(v) => v.device_ptr(stream),
            Self::BF16(v) => v.device_ptr(stream),
            Self::U32(v) => v.device_ptr(stream),
        }
    }

    pub(super) fn push<'b>(&'b self, args: &mut LaunchArgs<'b>) {
        match self {
            Self::F32(v) => args.arg(v),
            Self::F16(v) => args.arg(v),
            Self::BF16(v) => args.arg(v),
            Self::U32(v) => args.arg(v),
        };
    }
}

/// A new, uninitialised output of `n` elements of `dtype` that a kernel fills completely.
pub(super) fn alloc_output(dev: &CudaDevice, dtype: DType, n: usize) -> Result<CudaStorage> {
    // SAFETY: every caller launches a kernel that writes all `n` elements before the storage
    // is read (each launcher's SAFETY comment says how its grid covers them).
    let slice = unsafe {
        match dtype {
            DType::F32 => CudaStorageSlice::F32(dev.alloc::<f32>(n)?),
            DType::F16 => CudaStorageSlice::F16(dev.alloc::<f16>(n)?),
            DType::BF16 => CudaStorageSlice::BF16(dev.alloc::<bf16>(n)?),
            other => candle_core::bail!("sluice's CUDA kernels do not write {other:?}"),
        }
    };
    Ok(CudaStorage {
        slice,
        device: dev.clone(),
    })
}

/// The element count a layout spans from its start, for bounds checks.
pub(super) fn require(what: &str, have: usize, need: usize) -> Result<()> {
    if have < need {
        candle_core::bail!("{what}: {have} elements where the launch reads or writes {need}");
    }
    Ok(())
}

/// The CUDA storage behind a tensor's storage guard.
pub(super) fn cuda_storage<'g>(storage: &'g Storage, what: &str) -> Result<&'g CudaStorage> {
    match storage {
        Storage::Cuda(s) => Ok(s),
        _ => candle_core::bail!("{what} is not on the GPU"),
    }
}
