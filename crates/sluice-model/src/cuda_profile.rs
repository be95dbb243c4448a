//! Where a CUDA step's time goes, when `SLUICE_CUDA_PROFILE=N` asks (N steps a report): the
//! host time each phase of the forward takes to enqueue its launches, summed over the layers,
//! and the time the device still needed after the host had enqueued the whole step (one
//! synchronization at the step's end, made only while profiling). A step whose enqueue time
//! is close to its whole time is bound by host-side work, not by the GPU.
//!
//! Off (the default), [`StepTimer::start`] returns a timer that records nothing: one branch a
//! phase.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use candle_core::Device;

/// The phases of a step, in the order the forward runs them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    /// The attention plan, its upload, positions and slot mapping.
    Plan,
    Embedding,
    /// Residual add + RMSNorm, both norms of every layer.
    Norm,
    Qkv,
    /// QK-norm and RoPE.
    Rope,
    KvWrite,
    Attention,
    O,
    GateUp,
    Swiglu,
    Down,
    /// Final norm, lm_head and the logits' cast.
    Head,
    /// A decode step on static buffers: its graph replayed (or its launches enqueued).
    Graph,
    /// From the end of the enqueue to the device's end of the step.
    DeviceDrain,
    /// A decode step's rows sampled (on the device where they may be) and copied back.
    Sample,
}

const PHASES: [Phase; 15] = [
    Phase::Plan,
    Phase::Embedding,
    Phase::Norm,
    Phase::Qkv,
    Phase::Rope,
    Phase::KvWrite,
    Phase::Attention,
    Phase::O,
    Phase::GateUp,
    Phase::Swiglu,
    Phase::Down,
    Phase::Head,
    Phase::Graph,
    Phase::DeviceDrain,
    Phase::Sample,
];

#[derive(Default)]
struct Totals {
    steps: u64,
    rows: u64,
    nanos: [u64; PHASES.len()],
}

/// Steps a report, from `SLUICE_CUDA_PROFILE` (unset or 0: off).
fn every() -> u64 {
    static EVERY: OnceLock<u64> = OnceLock::new();
    *EVERY.get_or_init(|| {
        std::env::var("SLUICE_CUDA_PROFILE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

fn totals() -> &'static Mutex<Totals> {
    static TOTALS: OnceLock<Mutex<Totals>> = OnceLock::new();
    TOTALS.get_or_init(Mutex::default)
}

/// One step's marks; records nothing when profiling is off.
pub(crate) struct StepTimer {
    last: Option<Instant>,
    rows: usize,
    nanos: [u64; PHASES.len()],
}

impl StepTimer {
    pub(crate) fn start(rows: usize) -> Self {
        Self {
            last: (every() > 0).then(Instant::now),
            rows,
            nanos: [0; PHASES.len()],
        }
    }

    /// The time since the last mark goes to `phase`.
    pub(crate) fn mark(&mut self, phase: Phase) {
        if let Some(last) = self.last {
            let now = Instant::now();
            self.nanos[phase as usize] += (now - last).as_nanos() as u64;
            self.last = Some(now);
        }
    }

    /// Waits for the device (profiling only): the time the GPU still needed goes to
    /// [`Phase::DeviceDrain`].
    pub(crate) fn drain(&mut self, device: &Device) {
        if self.last.is_some() {
            // A failed synchronization surfaces at the step's own read of its output.
            let _ = device.synchronize();
            self.mark(Phase::DeviceDrain);
        }
    }

    /// Adds the step to the totals and logs them every N steps.
    pub(crate) fn finish(self) {
        if self.last.is_none() {
            return;
        }
        let Ok(mut t) = totals().lock() else { return };
        t.steps += 1;
        t.rows += self.rows as u64;
        for (sum, n) in t.nanos.iter_mut().zip(self.nanos) {
            *sum += n;
        }
        if t.steps >= every() {
            let steps = t.steps as f64;
            let us = |n: u64| n as f64 / steps / 1e3;
            let enqueue: u64 = t.nanos[..Phase::DeviceDrain as usize].iter().sum();
            let phases: Vec<String> = PHASES
                .iter()
                .zip(t.nanos)
                .map(|(p, n)| format!("{p:?} {:.1}", us(n)))
                .collect();
            tracing::info!(
                steps = t.steps,
                rows_per_step = format!("{:.1}", t.rows as f64 / steps),
                enqueue_us = format!("{:.1}", us(enqueue)),
                drain_us = format!("{:.1}", us(t.nanos[Phase::DeviceDrain as usize])),
                "cuda step profile (mean us a step): {}",
                phases.join(", ")
            );
            *t = Totals::default();
        }
    }
}
