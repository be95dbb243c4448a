//! How the device keeps the memory a step frees. candle allocates every tensor from the
//! device's default memory pool (stream-ordered `cuMemAllocAsync`), whose release threshold is
//! 0 by default: at every synchronization (each step's download of its tokens) the pool hands
//! its free memory back to the driver, and the next op-by-op step maps it again, tens of
//! megabytes a tensor for a prefill of thousands of tokens. Raising the threshold keeps what the
//! largest step needed in the pool; the KV cache is sized by its own budget either way.

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::Result;

/// Makes `dev`'s default memory pool keep freed memory across synchronizations.
pub fn retain_freed_memory(dev: &CudaDevice) -> Result<()> {
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread().w()?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: `pool` is a valid out-pointer for one handle and the device ordinal comes from a
    // live context bound to this thread; the attribute takes a pointer to a u64 (the CUDA
    // driver API's type for CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), read during the call only.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
            .result()
            .w()?;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .w()?;
    }
    Ok(())
}
