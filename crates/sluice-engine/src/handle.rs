//! The engine as the server sees it: a cloneable [`EngineHandle`] to submit requests, abort
//! them and read counters, and the [`RequestStream`] of events each submission returns.
//!
//! Submission takes only a [`ValidRequest`] (checked once, where it was built), checks the
//! waiting-queue bound without the engine thread, and fails fast with a typed [`SubmitError`]; the
//! request then travels to the engine thread over a channel and its events come back over an
//! unbounded tokio channel, whose `send` never blocks the engine.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use sluice_model::Pooling;
use sluice_tokenizer::Tokenizer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;

use crate::block_manager::PrefixCacheStats;
use crate::events::Event;
use crate::kv_events::KvCacheSnapshot;
use crate::params::{InvalidRequest, ModelLimits, Request, ValidRequest};
use crate::sequence::RequestId;

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// The waiting queue is full (HTTP 429: retry later).
    #[error(
        "overloaded: {waiting} sequences are waiting and the queue holds at most \
         {max_waiting}; retry later"
    )]
    Overloaded { waiting: usize, max_waiting: usize },
    /// The request was validated against another engine's limits (a bug of the caller).
    #[error("the request was validated against other limits than this engine's")]
    ForeignLimits,
    /// The engine is draining for shutdown or has stopped (HTTP 503).
    #[error("the engine is shutting down")]
    ShuttingDown,
}

pub(crate) struct Submission {
    pub id: RequestId,
    pub request: ValidRequest,
    pub events: UnboundedSender<Event>,
    pub arrival: Instant,
}

pub(crate) enum Command {
    Submit(Box<Submission>),
    Abort(RequestId),
    /// Stop taking requests; exit once everything in flight has finished.
    Drain,
    /// Abort everything and exit.
    Stop,
    /// Answer with the prefix cache's blocks, after sending the events so far.
    KvCacheSnapshot(oneshot::Sender<KvCacheSnapshot>),
    /// Empty the prefix cache; answer with how many blocks it held.
    ResetPrefixCache(oneshot::Sender<usize>),
}

/// Counters the engine thread publishes after every change, read without a round trip.
#[derive(Default)]
pub(crate) struct SharedStats {
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    /// Sequences submitted but not yet taken in by the engine thread.
    pub pending: AtomicUsize,
    pub blocks_used: AtomicUsize,
    pub blocks_total: AtomicUsize,
    pub preemptions: AtomicU64,
    pub prefix_queries: AtomicU64,
    pub prefix_hits: AtomicU64,
    pub steps: AtomicU64,
    pub failed_steps: AtomicU64,
    pub step_nanos: AtomicU64,
    pub forward_nanos: AtomicU64,
    pub sample_nanos: AtomicU64,
    pub spec_drafts: AtomicU64,
    pub spec_draft_tokens: AtomicU64,
    pub spec_accepted_tokens: AtomicU64,
    pub draft_nanos: AtomicU64,
    pub draft_blocks_used: AtomicUsize,
    pub draft_blocks_total: AtomicUsize,
}

pub(crate) struct Shared {
    pub stats: SharedStats,
    pub limits: ModelLimits,
    pub pooling: Pooling,
    pub hidden_size: usize,
    pub max_waiting: usize,
    /// Whether the engine records KV-cache events (`EngineConfig::kv_events`).
    pub kv_events: bool,
    pub tokenizer: Arc<Tokenizer>,
    pub next_id: AtomicU64,
    pub draining: AtomicBool,
    /// Set when the engine thread has exited, however it exited (a panic included).
    pub stopped: AtomicBool,
    /// The LoRA adapters running and waiting sequences use, as of the last step that changed
    /// them.
    pub lora_usage: std::sync::Mutex<LoraUsage>,
}

/// The LoRA adapters in use: by running sequences, and asked for by waiting ones (names,
/// sorted, without repeats), as vLLM's `vllm:lora_requests_info` reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraUsage {
    pub running: Vec<Arc<str>>,
    pub waiting: Vec<Arc<str>>,
}

/// A snapshot of the engine's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// Sequences holding KV blocks.
    pub running: usize,
    /// Sequences queued, including submissions the engine thread has not taken in yet.
    pub waiting: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    pub preemptions: u64,
    pub prefix_cache: PrefixCacheStats,
    /// Engine steps run, and how many of them failed in the forward.
    pub steps: u64,
    pub failed_steps: u64,
    /// Summed over all steps: the whole step, the model's forward, and sampling.
    pub step_time: Duration,
    pub forward_time: Duration,
    pub sample_time: Duration,
    /// Speculative decoding: times a sequence drafted for a step, tokens drafted, and of those
    /// the ones kept.
    pub spec_drafts: u64,
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    /// Speculation with a draft model: time spent guessing (part of `step_time`), and the
    /// blocks of its own KV cache in use and in all (0 without a draft model).
    pub draft_time: Duration,
    pub draft_kv_blocks_used: usize,
    pub draft_kv_blocks_total: usize,
}

impl EngineStats {
    /// Sequences submitted and not finished.
    pub fn in_flight(&self) -> usize {
        self.running + self.waiting
    }
}

/// The server's handle on the engine. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
    commands: Sender<Command>,
}

impl EngineHandle {
    pub(crate) fn new(shared: Arc<Shared>, commands: Sender<Command>) -> Self {
        Self { shared, commands }
    }

    /// Checks `request` against this engine's limits ([`ValidRequest::new`]).
    pub fn validate(&self, request: Request) -> Result<ValidRequest, InvalidRequest> {
        ValidRequest::new(request, &self.shared.limits)
    }

    /// Checks an embedding's input against this engine's limits
    /// ([`ValidRequest::embedding`]).
    pub fn validate_embedding(&self, input: Vec<u32>) -> Result<ValidRequest, InvalidRequest> {
        ValidRequest::embedding(input, &self.shared.limits)
    }

    /// Most sequences that may wait at once: a request of more can never be queued whole.
    pub fn max_waiting(&self) -> usize {
        self.shared.max_waiting
    }

    /// How this engine pools an embedding's hidden states.
    pub fn pooling(&self) -> Pooling {
        self.shared.pooling
    }

    /// The length of an embedding vector (the model's hidden size).
    pub fn embedding_size(&self) -> usize {
        self.shared.hidden_size
    }

    /// Queues a request; its events arrive on the returned stream. Fails at once, without
    /// queueing anything, if the waiting queue is full or the engine is shutting down.
    pub fn submit(&self, request: ValidRequest) -> Result<RequestStream, SubmitError> {
        if self.shared.draining.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        if *request.limits() != self.shared.limits {
            return Err(SubmitError::ForeignLimits);
        }
        // `n <= max_waiting` is part of the limits (`max_n`), so an empty queue takes any
        // valid request.
        let n = request.n();
        let max_waiting = self.shared.max_waiting;
        let stats = &self.shared.stats;
        let pending_before = stats.pending.fetch_add(n, Ordering::AcqRel);
        let waiting = pending_before + stats.waiting.load(Ordering::Acquire);
        if waiting + n > max_waiting {
            stats.pending.fetch_sub(n, Ordering::AcqRel);
            return Err(SubmitError::Overloaded {
                waiting,
                max_waiting,
            });
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let prompt_tokens = request.prompt_len();
        let (tx, rx) = unbounded_channel();
        let submission = Submission {
            id,
            request,
            events: tx,
            arrival: Instant::now(),
        };
        if self
            .commands
            .send(Command::Submit(Box::new(submission)))
            .is_err()
        {
            stats.pending.fetch_sub(n, Ordering::AcqRel);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(RequestStream {
            id,
            n,
            prompt_tokens,
            finished: 0,
            events: rx,
            commands: self.commands.clone(),
        })
    }

    /// Cancels a request: its sequences leave the batch at the end of the current step with
    /// [`crate::FinishReason::Abort`], and their blocks are freed at once. Unknown or finished
    /// ids are ignored.
    pub fn abort(&self, id: RequestId) {
        let _ = self.commands.send(Command::Abort(id));
    }

    /// The LoRA adapters running and waiting sequences use ([`LoraUsage`]).
    pub fn lora_usage(&self) -> LoraUsage {
        self.shared
            .lora_usage
            .lock()
            .map(|u| u.clone())
            .unwrap_or_default()
    }

    pub fn stats(&self) -> EngineStats {
        let s = &self.shared.stats;
        let nanos = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed));
        EngineStats {
            running: s.running.load(Ordering::Acquire),
            waiting: s.waiting.load(Ordering::Acquire) + s.pending.load(Ordering::Acquire),
            kv_blocks_used: s.blocks_used.load(Ordering::Acquire),
            kv_blocks_total: s.blocks_total.load(Ordering::Acquire),
            preemptions: s.preemptions.load(Ordering::Acquire),
            prefix_cache: PrefixCacheStats {
                queries: s.prefix_queries.load(Ordering::Acquire),
                hits: s.prefix_hits.load(Ordering::Acquire),
            },
            steps: s.steps.load(Ordering::Acquire),
            failed_steps: s.failed_steps.load(Ordering::Acquire),
            step_time: nanos(&s.step_nanos),
            forward_time: nanos(&s.forward_nanos),
            sample_time: nanos(&s.sample_nanos),
            spec_drafts: s.spec_drafts.load(Ordering::Relaxed),
            spec_draft_tokens: s.spec_draft_tokens.load(Ordering::Relaxed),
            spec_accepted_tokens: s.spec_accepted_tokens.load(Ordering::Relaxed),
            draft_time: nanos(&s.draft_nanos),
            draft_kv_blocks_used: s.draft_blocks_used.load(Ordering::Acquire),
            draft_kv_blocks_total: s.draft_blocks_total.load(Ordering::Acquire),
        }
    }

    /// The model's tokenizer (the server tokenizes prompts and renders chat templates).
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.shared.tokenizer
    }

    /// Vocabulary, context length and KV-cache size that bound requests.
    pub fn limits(&self) -> ModelLimits {
        self.shared.limits
    }

    /// Stops admitting requests (later submissions fail with [`SubmitError::ShuttingDown`]);
    /// what is in flight runs to completion, after which the engine thread exits.
    /// Whether the engine records KV-cache events (started with `EngineConfig::kv_events`).
    pub fn records_kv_events(&self) -> bool {
        self.shared.kv_events
    }

    /// The blocks the prefix cache holds, with the number of the last KV-event batch they
    /// include; `None` when the engine has stopped.
    pub async fn kv_cache_snapshot(&self) -> Option<KvCacheSnapshot> {
        self.ask(Command::KvCacheSnapshot).await
    }

    /// Empties the prefix cache (vLLM's `reset_prefix_cache`); returns how many blocks it
    /// held, or `None` when the engine has stopped. Requests in flight keep their blocks.
    pub async fn reset_prefix_cache(&self) -> Option<usize> {
        self.ask(Command::ResetPrefixCache).await
    }

    /// Sends the command `command` builds around a reply channel and awaits the engine
    /// thread's answer; `None` when the engine has stopped.
    async fn ask<T>(&self, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(command(tx)).ok()?;
        rx.await.ok()
    }

    pub fn begin_drain(&self) {
        self.shared.draining.store(true, Ordering::Release);
        let _ = self.commands.send(Command::Drain);
    }

    pub fn is_draining(&self) -> bool {
        self.shared.draining.load(Ordering::Acquire)
    }

    /// Whether the engine thread is still serving: false once it has exited (after a drain,
    /// or because it died), so a health check can stop routing traffic here.
    pub fn is_running(&self) -> bool {
        !self.shared.stopped.load(Ordering::Acquire)
    }
}

/// The events of one request. Dropping it before every sequence finished aborts the request.
pub struct RequestStream {
    id: RequestId,
    n: usize,
    prompt_tokens: usize,
    finished: usize,
    events: UnboundedReceiver<Event>,
    commands: Sender<Command>,
}

impl RequestStream {
    pub fn id(&self) -> RequestId {
        self.id
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Whether every sequence has sent its finish event.
    pub fn is_finished(&self) -> bool {
        self.finished == self.n
    }

    /// The next event; `None` once every sequence has finished (or the engine is gone).
    pub async fn recv(&mut self) -> Option<Event> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// [`RequestStream::recv`] as a poll, for implementing `Stream` adapters.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let polled = self.events.poll_recv(cx);
        if let Poll::Ready(Some(event)) = &polled {
            self.count(event);
        }
        polled
    }

    /// [`RequestStream::recv`] for threads outside an async runtime.
    ///
    /// # Panics
    /// When called from within an async runtime (tokio forbids blocking there).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        let event = self.events.blocking_recv();
        if let Some(e) = &event {
            self.count(e);
        }
        event
    }

    /// Every event until the end, blocking; for tests and command-line use.
    pub fn collect_blocking(mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.blocking_recv()).collect()
    }

    fn count(&mut self, event: &Event) {
        if matches!(event, Event::Finished(_)) {
            self.finished += 1;
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.is_finished() {
            let _ = self.commands.send(Command::Abort(self.id));
        }
    }
}

impl std::fmt::Debug for RequestStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestStream")
            .field("id", &self.id)
            .field("n", &self.n)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}
