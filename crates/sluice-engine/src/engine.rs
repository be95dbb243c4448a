//! The engine loop: one thread that owns the model (and so its KV cache) and, while there is
//! work, runs steps: take in new submissions and aborts, schedule, lay the plan out as one
//! [`StepBatch`], run one forward, sample every row at once, commit, and stream each
//! sequence's token and text to its request; sequences that stopped leave the scheduler (and
//! free their blocks) before the next step. With nothing to do it blocks on its command
//! channel.
//!
//! Failure model: a forward that errors (or panics) fails only the requests in that step,
//! with an error finish event; the engine goes on with the next step. A client that goes away
//! (its [`RequestStream`] dropped) is noticed by the end of the step at the latest, through
//! the abort its stream sends or the closed event channel, and its blocks are freed then.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_model::StepBatch;
use sluice_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::block_manager::PrefixCacheStats;
use crate::events::{Event, FinishEvent, Timing, TokenEvent, Usage};
use crate::handle::{Command, EngineHandle, Shared, SharedStats, Submission};
use crate::metrics::EngineMetrics;
use crate::model::Model;
use crate::params::{ModelLimits, SamplingParams};
use crate::rng::SeqRng;
use crate::sampler::{SampleRow, Sampled, Sampler, TokenCounts};
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerError};
use crate::sequence::{RequestId, SeqId};
use crate::stop::{FinishReason, StopSpec, Stopped, TextStream};

/// Scheduling limits; the KV cache's geometry comes from the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens one step computes (prefill chunks and decodes together).
    pub max_num_batched_tokens: usize,
    /// Most sequences waiting; past it submissions fail with `SubmitError::Overloaded`.
    pub max_waiting: usize,
    /// Caps the model's context length (`None`: the model's own).
    pub max_model_len: Option<usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 256,
            max_num_batched_tokens: 512,
            max_waiting: 1024,
            max_model_len: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Config(#[from] SchedulerError),
    #[error("cannot start the engine thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// What [`Engine::shutdown`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Whether everything in flight finished before the deadline.
    pub drained: bool,
    /// Sequences aborted at the deadline.
    pub aborted: usize,
}

/// The running engine: owns its thread. Dropping it aborts whatever is in flight and joins
/// the thread; [`Engine::shutdown`] drains first.
pub struct Engine {
    handle: EngineHandle,
    commands: Sender<Command>,
    thread: Option<JoinHandle<usize>>,
    exited: Receiver<()>,
}

impl Engine {
    /// Starts the engine thread. Logs the KV cache's capacity in tokens and the concurrency it
    /// allows at full context.
    pub fn start(
        model: Box<dyn Model>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        let max_model_len = config
            .max_model_len
            .map_or(model.max_model_len(), |m| m.min(model.max_model_len()));
        let (block_size, num_blocks) = (model.block_size(), model.num_blocks());
        let scheduler = Scheduler::new(SchedulerConfig {
            max_num_seqs: config.max_num_seqs,
            max_num_batched_tokens: config.max_num_batched_tokens,
            // The handle enforces the bound at submission; the scheduler must never refuse
            // what the handle accepted.
            max_waiting: usize::MAX,
            block_size,
            num_blocks,
            max_model_len,
        })?;
        let limits = ModelLimits {
            vocab_size: model.vocab_size(),
            max_model_len,
            kv_cache_tokens: num_blocks * block_size,
        };
        tracing::info!(
            num_blocks,
            block_size,
            kv_cache_tokens = limits.kv_cache_tokens,
            max_model_len,
            "KV cache holds {} tokens: {:.2} sequences at the full context of {} tokens",
            limits.kv_cache_tokens,
            limits.kv_cache_tokens as f64 / max_model_len as f64,
            max_model_len
        );
        let shared = Arc::new(Shared {
            stats: SharedStats::default(),
            limits,
            max_waiting: config.max_waiting,
            tokenizer: tokenizer.clone(),
            next_id: 1.into(),
            draining: false.into(),
            stopped: false.into(),
        });
        shared
            .stats
            .blocks_total
            .store(num_blocks, Ordering::Release);
        let (commands, command_rx) = channel();
        let (exited_tx, exited) = channel();
        let metrics = EngineMetrics::register();
        metrics.blocks_total.set(num_blocks as f64);
        let engine_loop = EngineLoop {
            sampler: Sampler::new(model.vocab_size()),
            model,
            tokenizer,
            scheduler,
            shared: shared.clone(),
            commands: command_rx,
            requests: HashMap::new(),
            batch: StepBatch::new(block_size),
            logits: Vec::new(),
            sampled: Vec::new(),
            tokens: Vec::new(),
            rngs: Vec::new(),
            finished: Vec::new(),
            finish_events: Vec::new(),
            closed: Vec::new(),
            metrics,
            last_prefix: PrefixCacheStats::default(),
            last_preemptions: 0,
            draining: false,
        };
        let thread = std::thread::Builder::new()
            .name("sluice-engine".into())
            .spawn({
                let shared = shared.clone();
                move || {
                    // Marks the engine stopped on every exit path, unwinding included.
                    struct MarkStopped(Arc<Shared>);
                    impl Drop for MarkStopped {
                        fn drop(&mut self) {
                            self.0.stopped.store(true, Ordering::Release);
                        }
                    }
                    let _stopped = MarkStopped(shared);
                    let aborted = engine_loop.run();
                    let _ = exited_tx.send(());
                    aborted
                }
            })?;
        Ok(Self {
            handle: EngineHandle::new(shared, commands.clone()),
            commands,
            thread: Some(thread),
            exited,
        })
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Graceful stop: admit nothing more, let what is in flight finish for up to `timeout`,
    /// then abort the rest and join the engine thread.
    pub fn shutdown(mut self, timeout: Duration) -> ShutdownReport {
        self.handle.begin_drain();
        let drained = match self.exited.recv_timeout(timeout) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
            Err(RecvTimeoutError::Timeout) => false,
        };
        let aborted = self.stop();
        ShutdownReport { drained, aborted }
    }

    fn stop(&mut self) -> usize {
        let _ = self.commands.send(Command::Stop);
        self.thread
            .take()
            .map_or(0, |t| t.join().unwrap_or_default())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

struct SeqState {
    rng: SeqRng,
    /// Generated-token counts, kept only when the request uses penalties.
    counts: Option<TokenCounts>,
    text: TextStream,
    generated: usize,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    done: bool,
}

struct RequestState {
    events: UnboundedSender<Event>,
    sampling: SamplingParams,
    stop: StopSpec,
    prompt_len: usize,
    /// Distinct prompt tokens, sorted, for the repetition penalty (empty without it).
    prompt_set: Vec<u32>,
    arrival: Instant,
    scheduled: Option<Instant>,
    prompt_counted: bool,
    seqs: Vec<SeqState>,
    live: usize,
}

impl RequestState {
    fn finish_event(
        &self,
        index: u32,
        stopped: Stopped,
        error: Option<String>,
        now: Instant,
    ) -> Event {
        let seq = &self.seqs[index as usize];
        Event::Finished(FinishEvent {
            index,
            reason: stopped.reason,
            stop_reason: stopped.stop_reason,
            error,
            usage: Usage {
                prompt_tokens: self.prompt_len,
                completion_tokens: seq.generated,
            },
            timing: Timing {
                arrival: self.arrival,
                scheduled: self.scheduled,
                first_token: seq.first_token,
                last_token: seq.last_token,
                finished: now,
            },
        })
    }
}

/// Sampling parameters for a row whose request is unknown, which would be an engine bug; the
/// row is still sampled so the step's rows line up, and its token is dropped at commit.
static ORPHAN_PARAMS: std::sync::LazyLock<SamplingParams> =
    std::sync::LazyLock::new(SamplingParams::greedy);

struct EngineLoop {
    model: Box<dyn Model>,
    tokenizer: Arc<Tokenizer>,
    scheduler: Scheduler,
    sampler: Sampler,
    shared: Arc<Shared>,
    commands: Receiver<Command>,
    requests: HashMap<RequestId, RequestState>,
    // Buffers reused every step.
    batch: StepBatch,
    logits: Vec<f32>,
    sampled: Vec<Sampled>,
    tokens: Vec<u32>,
    rngs: Vec<SeqRng>,
    finished: Vec<SeqId>,
    /// Finish events held until the step has freed the finished sequences' blocks.
    finish_events: Vec<(UnboundedSender<Event>, Event)>,
    closed: Vec<RequestId>,
    metrics: EngineMetrics,
    last_prefix: PrefixCacheStats,
    last_preemptions: u64,
    draining: bool,
}

enum Flow {
    Continue,
    Exit,
}

impl EngineLoop {
    /// Runs until stopped, drained, or every sender is gone; returns how many sequences were
    /// aborted on the way out.
    fn run(mut self) -> usize {
        loop {
            if !self.scheduler.has_unfinished() {
                if self.draining {
                    // Submissions that raced with the drain get an abort, not silence.
                    return self.abort_everything();
                }
                self.publish();
                // Idle: block until there is something to do.
                let Ok(command) = self.commands.recv() else {
                    return self.abort_everything();
                };
                if let Flow::Exit = self.handle(command) {
                    return self.abort_everything();
                }
            }
            while let Ok(command) = self.commands.try_recv() {
                if let Flow::Exit = self.handle(command) {
                    return self.abort_everything();
                }
            }
            if self.scheduler.has_unfinished() {
                self.step();
            }
        }
    }

    fn handle(&mut self, command: Command) -> Flow {
        match command {
            Command::Submit(submission) => self.admit(*submission),
            Command::Abort(id) => self.abort_request(id),
            Command::Drain => self.draining = true,
            Command::Stop => return Flow::Exit,
        }
        Flow::Continue
    }

    fn admit(&mut self, sub: Submission) {
        let Submission {
            id,
            request,
            max_tokens,
            events,
            arrival,
        } = sub;
        let n = request.n;
        self.shared.stats.pending.fetch_sub(n, Ordering::AcqRel);
        if events.is_closed() {
            return;
        }
        let prompt_len = request.prompt.len();
        let prompt_set = if request.sampling.repetition_penalty != 1.0 {
            let mut set = request.prompt.clone();
            set.sort_unstable();
            set.dedup();
            set
        } else {
            Vec::new()
        };
        let limits = self.shared.limits;
        let stop = StopSpec::new(
            request.stop,
            &self.tokenizer,
            max_tokens,
            limits.max_model_len,
        );
        let seed = request.sampling.seed.unwrap_or_else(rand::random);
        let has_penalties = request.sampling.has_penalties();
        let seqs = (0..n as u32)
            .map(|index| SeqState {
                rng: SeqRng::new(seed, index),
                counts: has_penalties.then(TokenCounts::default),
                text: TextStream::new(stop.params.skip_special_tokens),
                generated: 0,
                first_token: None,
                last_token: None,
                done: false,
            })
            .collect();
        let state = RequestState {
            events,
            sampling: request.sampling,
            stop,
            prompt_len,
            prompt_set,
            arrival,
            scheduled: None,
            prompt_counted: false,
            seqs,
            live: n,
        };
        if let Err(e) = self
            .scheduler
            .add_request(id, request.prompt, max_tokens, n)
        {
            // The handle validated the request against the same limits, so this is a bug;
            // the client still gets an answer.
            tracing::error!(request = id, "scheduler refused a validated request: {e}");
            let now = Instant::now();
            for index in 0..n as u32 {
                let stopped = Stopped {
                    reason: FinishReason::Error,
                    stop_reason: None,
                };
                let _ =
                    state
                        .events
                        .send(state.finish_event(index, stopped, Some(e.to_string()), now));
            }
            return;
        }
        self.requests.insert(id, state);
        self.publish_counts();
    }

    /// Removes a request, finishing its live sequences with `Abort`.
    fn abort_request(&mut self, id: RequestId) {
        self.end_request(id, FinishReason::Abort, None);
    }

    fn end_request(&mut self, id: RequestId, reason: FinishReason, error: Option<String>) {
        self.scheduler.abort(id);
        let Some(state) = self.requests.remove(&id) else {
            return;
        };
        // Free first, tell the client second: whoever sees the finish sees the blocks free.
        self.publish_counts();
        let now = Instant::now();
        for (index, seq) in state.seqs.iter().enumerate() {
            if seq.done {
                continue;
            }
            let stopped = Stopped {
                reason,
                stop_reason: None,
            };
            let _ =
                state
                    .events
                    .send(state.finish_event(index as u32, stopped, error.clone(), now));
            self.record_finish(reason, state.arrival, now);
        }
    }

    fn abort_everything(&mut self) -> usize {
        let ids: Vec<RequestId> = self.requests.keys().copied().collect();
        let mut aborted = 0;
        for id in ids {
            aborted += self.requests.get(&id).map_or(0, |r| r.live);
            self.abort_request(id);
        }
        // Submissions still in the channel get their answer too.
        while let Ok(command) = self.commands.try_recv() {
            if let Command::Submit(sub) = command {
                self.shared
                    .stats
                    .pending
                    .fetch_sub(sub.request.n, Ordering::AcqRel);
                let now = Instant::now();
                for index in 0..sub.request.n as u32 {
                    let _ = sub.events.send(Event::Finished(FinishEvent {
                        index,
                        reason: FinishReason::Abort,
                        stop_reason: None,
                        error: None,
                        usage: Usage {
                            prompt_tokens: sub.request.prompt.len(),
                            completion_tokens: 0,
                        },
                        timing: Timing {
                            arrival: sub.arrival,
                            scheduled: None,
                            first_token: None,
                            last_token: None,
                            finished: now,
                        },
                    }));
                }
                aborted += sub.request.n;
            }
        }
        self.publish();
        aborted
    }

    fn step(&mut self) {
        let step_start = Instant::now();
        let out = self.scheduler.schedule();
        if out.is_empty() {
            // Cannot happen while something is unfinished (the oldest running sequence can
            // always proceed); wait for a command rather than spin if it ever does.
            let _ = self.scheduler.commit(&[]);
            self.publish();
            if let Ok(command) = self.commands.recv_timeout(Duration::from_millis(100)) {
                self.handle(command);
            }
            return;
        }
        let num_tokens = out.num_tokens();
        for s in out.scheduled() {
            if let Some(r) = self.requests.get_mut(&s.seq_id.request) {
                if r.scheduled.is_none() {
                    r.scheduled = Some(step_start);
                    self.metrics
                        .queue_time
                        .record((step_start - r.arrival).as_secs_f64());
                }
            }
        }
        self.scheduler.fill_step_batch(&mut self.batch);
        self.publish_counts();

        let forward_start = Instant::now();
        let (model, batch, logits) = (&mut self.model, &self.batch, &mut self.logits);
        let result = catch_unwind(AssertUnwindSafe(|| model.forward(batch, logits)));
        let forward_time = forward_start.elapsed();
        let num_samples = self.scheduler.output().num_samples();
        let failure = match result {
            Ok(Ok(())) if self.logits.len() == num_samples * self.sampler.vocab_size() => None,
            Ok(Ok(())) => Some(format!(
                "the model returned {} logits for {num_samples} rows of {}",
                self.logits.len(),
                self.sampler.vocab_size()
            )),
            Ok(Err(e)) => Some(e.to_string()),
            Err(panic) => Some(format!("model forward panicked: {}", panic_message(&panic))),
        };
        if let Some(message) = failure {
            self.fail_step(message);
            self.finish_step(step_start, forward_time, Duration::ZERO, num_tokens);
            return;
        }

        let sample_start = Instant::now();
        self.sample();
        let sample_time = sample_start.elapsed();
        if let Err(e) = self.scheduler.commit(&self.tokens) {
            tracing::error!("commit failed: {e}");
        }
        self.emit(Instant::now());
        for &id in &self.finished {
            self.scheduler.finish(id);
        }
        // Free and count first, tell the client second: whoever sees a finish sees its blocks
        // free and the step's counters (prefix hits, preemptions) published, even when the
        // request finished in the step that admitted it.
        self.publish();
        for (events, event) in self.finish_events.drain(..) {
            let _ = events.send(event);
        }
        self.reap_closed();
        self.finish_step(step_start, forward_time, sample_time, num_tokens);
    }

    /// Samples every row of the step into `self.tokens` (and `self.sampled`).
    fn sample(&mut self) {
        let requests = &self.requests;
        let mut rows: Vec<SampleRow<'_>> = self
            .scheduler
            .output()
            .sampling()
            .map(|s| match requests.get(&s.seq_id.request) {
                Some(r) => {
                    let seq = &r.seqs[s.seq_id.index as usize];
                    SampleRow {
                        params: &r.sampling,
                        rng: seq.rng,
                        prompt_tokens: &r.prompt_set,
                        output_counts: seq.counts.as_ref(),
                        banned: r.stop.banned(seq.generated),
                    }
                }
                None => SampleRow {
                    params: &ORPHAN_PARAMS,
                    rng: SeqRng::new(0, 0),
                    prompt_tokens: &[],
                    output_counts: None,
                    banned: &[],
                },
            })
            .collect();
        self.sampler
            .sample(&mut self.logits, &mut rows, &mut self.sampled);
        self.rngs.clear();
        self.rngs.extend(rows.iter().map(|r| r.rng));
        drop(rows);
        self.tokens.clear();
        self.tokens.extend(self.sampled.iter().map(|s| s.token));
    }

    /// Streams each sampled token and decides which sequences stopped (into `self.finished`,
    /// their finish events into `self.finish_events`).
    fn emit(&mut self, now: Instant) {
        self.finished.clear();
        let mut generated = 0u64;
        let rows = self.scheduler.output().sampling();
        for ((s, sampled), &rng) in rows.zip(self.sampled.iter_mut()).zip(&self.rngs) {
            let Some(r) = self.requests.get_mut(&s.seq_id.request) else {
                continue;
            };
            let index = s.seq_id.index;
            let seq = &mut r.seqs[index as usize];
            if seq.done {
                continue;
            }
            generated += 1;
            seq.rng = rng;
            seq.generated += 1;
            if let Some(counts) = &mut seq.counts {
                counts.add(sampled.token);
            }
            match seq.last_token {
                None => self
                    .metrics
                    .time_to_first_token
                    .record((now - r.arrival).as_secs_f64()),
                Some(last) => self
                    .metrics
                    .inter_token_latency
                    .record((now - last).as_secs_f64()),
            }
            seq.first_token.get_or_insert(now);
            seq.last_token = Some(now);
            if !r.prompt_counted {
                r.prompt_counted = true;
                self.metrics.prompt_tokens.increment(r.prompt_len as u64);
            }
            let mut text = String::new();
            let stopped = seq.text.push(
                &self.tokenizer,
                &r.stop,
                sampled.token,
                seq.generated,
                r.prompt_len + seq.generated,
                &mut text,
            );
            let event = Event::Token(TokenEvent {
                index,
                token: sampled.token,
                text,
                logprobs: sampled.logprobs.take(),
            });
            if r.events.send(event).is_err() {
                self.closed.push(s.seq_id.request);
                continue;
            }
            if let Some(stopped) = stopped {
                seq.done = true;
                r.live -= 1;
                let reason = stopped.reason;
                self.finish_events
                    .push((r.events.clone(), r.finish_event(index, stopped, None, now)));
                self.finished.push(s.seq_id);
                self.metrics.finished(reason).increment(1);
                self.metrics
                    .e2e_latency
                    .record((now - r.arrival).as_secs_f64());
                if r.live == 0 {
                    // Once its finish events are sent, the last sender is gone and the
                    // client's stream ends.
                    self.requests.remove(&s.seq_id.request);
                }
            }
        }
        self.metrics.generation_tokens.increment(generated);
    }

    /// Aborts requests whose client is gone: those whose send failed this step, and any whose
    /// stream was dropped (the abort command may still be in the channel).
    fn reap_closed(&mut self) {
        for (&id, r) in &self.requests {
            if r.events.is_closed() {
                self.closed.push(id);
            }
        }
        while let Some(id) = self.closed.pop() {
            self.abort_request(id);
        }
    }

    /// Fails every request with a sequence in the current step; the step's plan is then
    /// committed empty-handed (those sequences are gone, so nothing is applied).
    fn fail_step(&mut self, message: String) {
        tracing::error!("engine step failed: {message}");
        self.metrics.step_failures.increment(1);
        self.shared
            .stats
            .failed_steps
            .fetch_add(1, Ordering::Relaxed);
        let mut failed: Vec<RequestId> = self
            .scheduler
            .output()
            .scheduled()
            .iter()
            .map(|s| s.seq_id.request)
            .collect();
        failed.sort_unstable();
        failed.dedup();
        for id in failed {
            self.end_request(id, FinishReason::Error, Some(message.clone()));
        }
        self.tokens.clear();
        self.tokens.resize(self.scheduler.output().num_samples(), 0);
        if let Err(e) = self.scheduler.commit(&self.tokens) {
            tracing::error!("commit after a failed step: {e}");
        }
    }

    fn record_finish(&self, reason: FinishReason, arrival: Instant, now: Instant) {
        self.metrics.finished(reason).increment(1);
        self.metrics
            .e2e_latency
            .record((now - arrival).as_secs_f64());
    }

    fn finish_step(
        &mut self,
        start: Instant,
        forward: Duration,
        sample: Duration,
        num_tokens: usize,
    ) {
        let elapsed = start.elapsed();
        let s = &self.shared.stats;
        s.steps.fetch_add(1, Ordering::Relaxed);
        s.step_nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
        s.forward_nanos
            .fetch_add(forward.as_nanos() as u64, Ordering::Relaxed);
        s.sample_nanos
            .fetch_add(sample.as_nanos() as u64, Ordering::Relaxed);
        self.metrics.step_duration.record(elapsed.as_secs_f64());
        self.metrics.tokens_per_step.record(num_tokens as f64);
        self.publish();
    }

    /// Publishes queue and pool counts (cheap; after every change a client could observe).
    fn publish_counts(&self) {
        let s = &self.shared.stats;
        s.running
            .store(self.scheduler.num_running(), Ordering::Release);
        s.waiting
            .store(self.scheduler.num_waiting(), Ordering::Release);
        s.blocks_used
            .store(self.scheduler.num_used_blocks(), Ordering::Release);
    }

    /// Publishes everything, counters and gauges included.
    fn publish(&mut self) {
        self.publish_counts();
        let s = &self.shared.stats;
        let preemptions = self.scheduler.num_preemptions();
        s.preemptions.store(preemptions, Ordering::Release);
        self.metrics
            .preemptions
            .increment(preemptions - self.last_preemptions);
        self.last_preemptions = preemptions;
        let prefix = self.scheduler.prefix_cache_stats();
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
        self.metrics
            .running
            .set(self.scheduler.num_running() as f64);
        self.metrics
            .waiting
            .set((self.scheduler.num_waiting() + pending) as f64);
        self.metrics
            .blocks_used
            .set(self.scheduler.num_used_blocks() as f64);
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}
