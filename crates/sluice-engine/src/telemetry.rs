//! What the engine thread tells the outside about itself: the counters the handle reads
//! without a round trip ([`crate::EngineStats`]) and the Prometheus metrics. Publishing is a
//! few atomic stores; nothing here allocates.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::block_manager::PrefixCacheStats;
use crate::handle::{LoraUsage, Shared};
use crate::metrics::EngineMetrics;
use crate::scheduler::Scheduler;
use crate::stop::FinishReason;

/// How one step's time was spent.
pub(crate) struct StepTiming {
    pub start: Instant,
    pub forward: Duration,
    pub sample: Duration,
    pub num_tokens: usize,
}

pub(crate) struct Telemetry {
    shared: Arc<Shared>,
    /// Recorded directly by the loop for per-token and per-request histograms.
    pub metrics: EngineMetrics,
    /// The scheduler's cumulative counters at the last publish: metrics get the difference.
    last_prefix: PrefixCacheStats,
    last_preemptions: u64,
    /// The adapters in use as last published, and this publish's, reused: the shared copy is
    /// locked and replaced only when they change.
    lora_usage: LoraUsage,
    lora_scratch: LoraUsage,
}

impl Telemetry {
    pub fn new(shared: Arc<Shared>, metrics: EngineMetrics) -> Self {
        Self {
            shared,
            metrics,
            last_prefix: PrefixCacheStats::default(),
            last_preemptions: 0,
            lora_usage: LoraUsage::default(),
            lora_scratch: LoraUsage::default(),
        }
    }

    /// The adapters running and waiting sequences use, when they changed (nothing without
    /// adapter slots).
    fn publish_lora_usage<R, S>(&mut self, scheduler: &Scheduler<R, S>) {
        if scheduler.config().max_loras == 0 {
            return;
        }
        let scratch = &mut self.lora_scratch;
        scheduler.adapters_in_use(&mut scratch.running, &mut scratch.waiting);
        if *scratch == self.lora_usage {
            return;
        }
        std::mem::swap(&mut self.lora_usage, &mut self.lora_scratch);
        if let Ok(mut shared) = self.shared.lora_usage.lock() {
            shared.clone_from(&self.lora_usage);
        }
    }

    /// Queue and pool counts (cheap; after every change a client could observe).
    pub fn publish_counts<R, S>(&self, scheduler: &Scheduler<R, S>) {
        let s = &self.shared.stats;
        s.running.store(scheduler.num_running(), Ordering::Release);
        s.waiting.store(scheduler.num_waiting(), Ordering::Release);
        s.blocks_used
            .store(scheduler.num_used_blocks(), Ordering::Release);
    }

    /// Everything, counters and gauges included.
    pub fn publish<R, S>(&mut self, scheduler: &Scheduler<R, S>) {
        self.publish_counts(scheduler);
        self.publish_lora_usage(scheduler);
        let s = &self.shared.stats;
        let preemptions = scheduler.num_preemptions();
        s.preemptions.store(preemptions, Ordering::Release);
        self.metrics
            .preemptions
            .increment(preemptions - self.last_preemptions);
        self.last_preemptions = preemptions;
        let prefix = scheduler.prefix_cache_stats();
        s.prefix_queries.store(prefix.queries, Ordering::Release);
        s.prefix_hits.store(prefix.hits, Ordering::Release);
        self.metrics
            .prefix_queries
            .increment(prefix.queries - self.last_prefix.queries);
        self.metrics
            .prefix_hits
            .increment(prefix.hits - self.last_prefix.hits);
        self.last_prefix = prefix;
        let pending = s.pending.load(Ordering::Acquire);
        self.metrics.running.set(scheduler.num_running() as f64);
        self.metrics
            .waiting
            .set((scheduler.num_waiting() + pending) as f64);
        self.metrics
            .blocks_used
            .set(scheduler.num_used_blocks() as f64);
        let windows = scheduler.block_pools().windows();
        let window_used: usize = windows.map(|w| w.num_used_blocks()).sum();
        self.metrics.window_blocks_used.set(window_used as f64);
        let pools = scheduler.block_pools();
        let states = (0..pools.num_groups()).filter_map(|g| pools.num_used_states(g));
        self.metrics.states_used.set(states.sum::<usize>() as f64);
    }

    /// Counts a finished step (failed or not) and publishes everything.
    pub fn finish_step<R, S>(&mut self, scheduler: &Scheduler<R, S>, timing: StepTiming) {
        let elapsed = timing.start.elapsed();
        let s = &self.shared.stats;
        s.steps.fetch_add(1, Ordering::Relaxed);
        s.step_nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
        s.forward_nanos
            .fetch_add(timing.forward.as_nanos() as u64, Ordering::Relaxed);
        s.sample_nanos
            .fetch_add(timing.sample.as_nanos() as u64, Ordering::Relaxed);
        self.metrics.step_duration.record(elapsed.as_secs_f64());
        self.metrics
            .tokens_per_step
            .record(timing.num_tokens as f64);
        self.publish(scheduler);
    }

    /// A mixture of experts' step read this share of its experts' weights.
    pub fn expert_share(&self, share: f64) {
        self.metrics.expert_share.record(share);
    }

    pub fn failed_step(&self) {
        self.metrics.step_failures.increment(1);
        self.shared
            .stats
            .failed_steps
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Speculation this step: sequences that drafted, tokens drafted, drafted tokens kept.
    pub fn speculated(&self, drafts: u64, drafted: u64, accepted: u64) {
        self.metrics.spec_drafts.increment(drafts);
        self.metrics.spec_draft_tokens.increment(drafted);
        self.metrics.spec_accepted_tokens.increment(accepted);
        let s = &self.shared.stats;
        s.spec_drafts.fetch_add(drafts, Ordering::Relaxed);
        s.spec_draft_tokens.fetch_add(drafted, Ordering::Relaxed);
        s.spec_accepted_tokens
            .fetch_add(accepted, Ordering::Relaxed);
    }

    /// Time the draft model took to guess for one step.
    pub fn drafted(&self, elapsed: Duration) {
        self.shared
            .stats
            .draft_nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Blocks of the draft model's cache held by sequences.
    pub fn publish_draft_blocks(&self, used: usize) {
        self.shared
            .stats
            .draft_blocks_used
            .store(used, Ordering::Release);
        self.metrics.draft_blocks_used.set(used as f64);
    }

    /// A sequence finished (any reason): the success counter and its end-to-end latency.
    pub fn sequence_finished(&self, reason: FinishReason, arrival: Instant, now: Instant) {
        self.metrics.finished(reason).increment(1);
        self.metrics
            .e2e_latency
            .record((now - arrival).as_secs_f64());
    }
}
