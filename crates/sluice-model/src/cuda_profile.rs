//! Where a CUDA step's time goes, when `SLUICE_CUDA_PROFILE=N` asks (N steps a report): the
//! host time each phase of the forward takes to enqueue its launches, summed over the layers,
//! and the time the device still needed after the host had enqueued the whole step (one
//! synchronization at the step's end, made only while profiling). A step whose enqueue time
//! is close to its whole time is bound by host-side work, not by the GPU.
//!
//! Decode steps on static buffers (a graph replayed) and steps run op by op (prefill, mixed
//! prefill and decode) are reported apart: their costs differ by kind, and a sweep mixes them.
//! With `SLUICE_CUDA_PROFILE_SYNC=1` every mark first waits for the device, so that each phase
//! of an op-by-op step reads as the GPU time of its kernels (slower steps, truer shares).
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

/// The two kinds of step, reported apart.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A decode step on static buffers: its graph replayed (or its launches enqueued).
    Decode = 0,
    /// A step run op by op: prefill, or prefill and decode rows mixed.
    OpByOp = 1,
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

/// Whether each mark waits for the device (`SLUICE_CUDA_PROFILE_SYNC=1`).
fn synchronized() -> bool {
    static SYNC: OnceLock<bool> = OnceLock::new();
    *SYNC.get_or_init(|| std::env::var("SLUICE_CUDA_PROFILE_SYNC").is_ok_and(|v| v == "1"))
}

fn totals() -> &'static Mutex<[Totals; 2]> {
    static TOTALS: OnceLock<Mutex<[Totals; 2]>> = OnceLock::new();
    TOTALS.get_or_init(Mutex::default)
}

/// One step's marks; records nothing when profiling is off.
pub(crate) struct StepTimer {
    last: Option<Instant>,
    /// The device each mark waits for, in the synchronized mode.
    sync: Option<Device>,
    rows: usize,
    kind: Kind,
    nanos: [u64; PHASES.len()],
}

impl StepTimer {
    /// A step of `rows` rows (tokens) on `device`.
    pub(crate) fn start(rows: usize, device: &Device) -> Self {
        let on = every() > 0;
        Self {
            last: on.then(Instant::now),
            sync: (on && synchronized()).then(|| device.clone()),
            rows,
            kind: Kind::OpByOp,
            nanos: [0; PHASES.len()],
        }
    }

    /// The time since the last mark goes to `phase`.
    pub(crate) fn mark(&mut self, phase: Phase) {
        if let Some(last) = self.last {
            if let Some(device) = &self.sync {
                // A failed synchronization surfaces at the step's own read of its output.
                let _ = device.synchronize();
            }
            let now = Instant::now();
            self.nanos[phase as usize] += (now - last).as_nanos() as u64;
            self.last = Some(now);
            if matches!(phase, Phase::Graph) {
                self.kind = Kind::Decode;
            }
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

    /// Adds the step to its kind's totals and logs both kinds every N steps.
    pub(crate) fn finish(self) {
        if self.last.is_none() {
            return;
        }
        let Ok(mut all) = totals().lock() else { return };
        let t = &mut all[self.kind as usize];
        t.steps += 1;
        t.rows += self.rows as u64;
        for (sum, n) in t.nanos.iter_mut().zip(self.nanos) {
            *sum += n;
        }
        if all.iter().map(|t| t.steps).sum::<u64>() < every() {
            return;
        }
        for (kind, t) in [Kind::Decode, Kind::OpByOp].into_iter().zip(all.iter()) {
            if t.steps == 0 {
                continue;
            }
            let steps = t.steps as f64;
            let us = |n: u64| n as f64 / steps / 1e3;
            let enqueue: u64 = t.nanos[..Phase::DeviceDrain as usize].iter().sum();
            let phases: Vec<String> = PHASES
                .iter()
                .zip(t.nanos)
                .filter(|&(_, n)| n > 0)
                .map(|(p, n)| format!("{p:?} {:.1}", us(n)))
                .collect();
            tracing::info!(
                kind = ?kind,
                synchronized = self.sync.is_some(),
                steps = t.steps,
                rows_per_step = format!("{:.1}", t.rows as f64 / steps),
                enqueue_us = format!("{:.1}", us(enqueue)),
                drain_us = format!("{:.1}", us(t.nanos[Phase::DeviceDrain as usize])),
                step_us = format!("{:.1}", us(t.nanos.iter().sum())),
                "cuda step profile (mean us a step): {}",
                phases.join(", ")
            );
        }
        *all = Default::default();
    }
}
