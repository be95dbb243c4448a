//! CUDA graphs of a step: the launches a closure enqueues on the device's stream, captured once
//! (nothing runs while capturing) and replayed with one call, so a step's host cost no longer
//! grows with its number of launches. What a graph reads and writes is fixed at capture: the
//! caller records launches on buffers that outlive the graph (`direct`) and changes only their
//! contents between replays.

use candle_core::cuda_backend::cudarc::driver::sys::{
    CUgraphInstantiate_flags, CUstreamCaptureMode,
};
use candle_core::cuda_backend::cudarc::driver::CudaGraph;
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::Result;

/// One captured step.
pub struct StepGraph {
    graph: CudaGraph,
}

// SAFETY: a CUDA graph may be used from any thread as long as calls on it are serialized
// (the driver API's thread-safety rule for graphs); a `StepGraph` is owned by one model and
// replayed only through `&self` of its owner's `&mut` step, one call at a time.
unsafe impl Send for StepGraph {}

impl StepGraph {
    /// Captures what `record` enqueues on `dev`'s stream. Capture is thread-local: other threads'
    /// CUDA calls go on as usual, and this thread's `record` must not synchronize or allocate
    /// (a failure inside it fails the capture, which is ended either way).
    pub fn capture(dev: &CudaDevice, record: impl FnOnce() -> Result<()>) -> Result<Self> {
        let stream = dev.cuda_stream();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .w()?;
        let recorded = record();
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        recorded?;
        let Some(graph) = ended.w()? else {
            candle_core::bail!("the captured step launched nothing");
        };
        // Its resources on the device now rather than at the first replay.
        graph.upload().w()?;
        Ok(Self { graph })
    }

    /// Enqueues the captured launches on the stream they were captured from.
    pub fn replay(&self) -> Result<()> {
        self.graph.launch().w()
    }
}

/// Stops cudarc from creating a pair of CUDA events for every allocation made on `dev` from
/// now on: they order work between streams, and sluice runs every launch of a model on one.
pub fn single_stream(dev: &CudaDevice) {
    // SAFETY: candle's default device (`Device::new_cuda`) launches everything on one stream
    // per thread, and sluice steps a model from one thread at a time (the engine thread), so
    // no tensor is used on another stream than the one it was written on; the events' only use
    // is that cross-stream ordering.
    unsafe { dev.disable_event_tracking() }
}
