//! The loop of the engine thread, as docs/design.md draws it: take in submissions and aborts, then
//! per step
//!
//! ```text
//! plan   = scheduler.schedule()          // who runs this step
//! batch  = scheduler.fill_step_batch()   // flat tokens + metadata
//! logits = model.forward(batch)          // ONE forward, all sequences
//! tokens = sampler.sample(logits, rows)  // batched sampling (or the model's own, below)
//! scheduler.commit(tokens); emit events; finished sequences leave and free their blocks
//! ```
//!
//! The thread owns the model (and so its KV cache). With nothing to do it blocks on its
//! command channel. Per-request and per-sequence bookkeeping ([`crate::request_state`]) is
//! kept by the scheduler beside its own records, one record per sequence; publishing
//! counters and metrics lives in [`crate::telemetry`].
//!
//! Its parts, one job each: taking requests in and out ([`admit`]), the step from plan to
//! finish ([`step`]), the rows an embedding pools ([`pooling`]), sampling with the model's own
//! rows and the grammars' masks ([`sample`]), and streaming each token with its stop checks
//! ([`emit`]).
//!
//! A model that samples rows itself ([`Model::samples_rows`], a GPU) gets the rows that need
//! nothing but temperature, `top_k`, `top_p`, `min_p` and logprobs marked in the batch before
//! the forward, with their random numbers drawn from each sequence's generator as the sampler
//! would draw them; it hands back their tokens instead of their logits, and the sampler takes
//! the rest. Which rows go where depends only on each row's own request.
//!
//! Failure model: a forward that errors (or panics) fails only the requests in that step,
//! with an error finish event; the engine goes on with the next step. A client that goes away
//! (its [`crate::RequestStream`] dropped) is noticed by the end of the step at the latest,
//! through the abort its stream sends or the closed event channel, and its blocks are freed
//! then.

use std::sync::mpsc::Receiver;
use std::sync::Arc;

use sluice_model::{Pooling, StepBatch, StepOutput};
use sluice_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::constraint::SeqConstraint;
use crate::draft_model::DraftModel;
use crate::events::Event;
use crate::handle::{Command, Shared};
use crate::kv_events::{KvCacheEvent, KvCacheSnapshot, KvEventSender};
use crate::model::Model;
use crate::request_state::{RequestState, SeqState};
use crate::rng::SeqRng;
use crate::sampler::{SampleRow, Sampled, Sampler};
use crate::scheduler::Scheduler;
use crate::sequence::{RequestId, SeqId};
use crate::telemetry::Telemetry;

mod admit;
mod emit;
mod images;
mod pooling;
mod sample;
mod step;

pub(crate) struct EngineLoop {
    model: Box<dyn Model>,
    /// The draft model and its cache (`--speculative draft:PATH`), run before each step.
    drafter: Option<DraftModel>,
    tokenizer: Arc<Tokenizer>,
    /// Holds every request's and sequence's records beside its own.
    scheduler: Scheduler<RequestState, SeqState>,
    shared: Arc<Shared>,
    commands: Receiver<Command>,
    telemetry: Telemetry,
    draining: bool,
    // Buffers reused every step.
    batch: StepBatch,
    /// The forward's logits and pooled hidden states.
    output: StepOutput,
    sampling: StepSampling,
    outcomes: StepOutcomes,
    /// What kinds of request the scheduler holds.
    kinds: RequestKinds,
    embedding: EmbeddingShape,
    kv_events: KvEventOutlet,
    images: images::StepImages,
}

/// The step's sampling: the sampler, and the buffers it fills and reads every step.
struct StepSampling {
    sampler: Sampler,
    /// The sampler's rows; empty between steps (they borrow the step's request states).
    rows: Vec<SampleRow<'static>>,
    sampled: Vec<Sampled>,
    /// Whether the model samples the rows it can itself ([`Model::samples_rows`]).
    model_samples_rows: bool,
    /// Per sampling row of a step whose model samples rows: what the engine keeps of a row the
    /// model samples (`None` for the sampler's rows).
    model_rows: Vec<Option<ModelRow>>,
    /// The sampler's results of a step the model shares, merged into `sampled` in row order.
    host_sampled: Vec<Sampled>,
    tokens: Vec<u32>,
    rngs: Vec<SeqRng>,
    /// The step's constrained sequences, whose masks are computed in parallel; empty between
    /// steps (it borrows the request states).
    mask_jobs: Vec<&'static mut SeqConstraint>,
}

/// What became of the step's sequences and requests, gathered while it streams and handled
/// at its end.
#[derive(Default)]
struct StepOutcomes {
    finished: Vec<SeqId>,
    /// Finish events held until the step has freed the finished sequences' blocks.
    finish_events: Vec<(UnboundedSender<Event>, Event)>,
    closed: Vec<RequestId>,
    /// Requests whose grammar failed this step, with why; they end with an error.
    constraint_failures: Vec<(RequestId, String)>,
}

/// How the loop's embeddings pool, and the width of the hidden states they pool.
struct EmbeddingShape {
    pooling: Pooling,
    hidden_size: usize,
}

/// Where the KV-cache events go (`--kv-events`), and the buffer that gathers one batch.
struct KvEventOutlet {
    sender: Option<KvEventSender>,
    buffer: Vec<KvCacheEvent>,
}

/// How many requests of the loop carry a grammar, and how many are embeddings: while there
/// are none of a kind, a step spends nothing on it (masks, pooling).
#[derive(Default)]
struct RequestKinds {
    constrained: usize,
    embeddings: usize,
    with_images: usize,
}

impl RequestKinds {
    fn add(&mut self, state: &RequestState) {
        self.constrained += usize::from(state.constrained);
        self.embeddings += usize::from(state.pooled.is_some());
        self.with_images += usize::from(!state.images.is_empty());
    }

    fn remove(&mut self, state: &RequestState) {
        self.constrained -= usize::from(state.constrained);
        self.embeddings -= usize::from(state.pooled.is_some());
        self.with_images -= usize::from(!state.images.is_empty());
    }
}

/// A row the model samples: its generator past the draw the model was given, and whether its
/// request reports logprobs (the model computes the top ones the rule asks for).
#[derive(Clone, Copy)]
struct ModelRow {
    rng: SeqRng,
    logprob: bool,
}

enum Flow {
    Continue,
    Exit,
}

impl EngineLoop {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: Box<dyn Model>,
        drafter: Option<DraftModel>,
        tokenizer: Arc<Tokenizer>,
        scheduler: Scheduler<RequestState, SeqState>,
        shared: Arc<Shared>,
        commands: Receiver<Command>,
        telemetry: Telemetry,
        kv_events: Option<KvEventSender>,
    ) -> Self {
        Self {
            sampling: StepSampling {
                sampler: Sampler::new(model.vocab_size()),
                rows: Vec::new(),
                sampled: Vec::new(),
                model_samples_rows: model.samples_rows(),
                model_rows: Vec::new(),
                host_sampled: Vec::new(),
                tokens: Vec::new(),
                rngs: Vec::new(),
                mask_jobs: Vec::new(),
            },
            batch: StepBatch::new(model.block_size()),
            embedding: EmbeddingShape {
                pooling: shared.pooling,
                hidden_size: model.hidden_size(),
            },
            model,
            drafter,
            tokenizer,
            scheduler,
            shared,
            commands,
            telemetry,
            draining: false,
            output: StepOutput::default(),
            outcomes: StepOutcomes::default(),
            kinds: RequestKinds::default(),
            images: images::StepImages::default(),
            kv_events: KvEventOutlet {
                sender: kv_events,
                buffer: Vec::new(),
            },
        }
    }

    /// Runs until stopped, drained, or every sender is gone; returns how many sequences were
    /// aborted on the way out.
    pub fn run(mut self) -> usize {
        loop {
            if !self.scheduler.has_unfinished() {
                if self.draining {
                    // Submissions that raced with the drain get an abort, not silence.
                    return self.abort_everything();
                }
                self.telemetry.publish(&self.scheduler);
                self.send_kv_events();
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

    /// Sends the prefix cache's changes since the last call as one batch, if there are any:
    /// at the end of each step, before idling and before a snapshot.
    pub(super) fn send_kv_events(&mut self) {
        let Some(sender) = &mut self.kv_events.sender else {
            return;
        };
        self.scheduler.drain_kv_events(&mut self.kv_events.buffer);
        if self.kv_events.buffer.is_empty() {
            return;
        }
        self.telemetry.metrics.kv_event_batches.increment(1);
        if sender.send(&mut self.kv_events.buffer) {
            self.telemetry.metrics.kv_events_dropped.increment(1);
        }
    }

    /// Frees the draft cache of the sequences that stopped running (finished, aborted,
    /// cancelled, preempted) and publishes what it holds. Called where sequences stop: the
    /// end of each step (after its finishes, and after the plan's preemptions) and each
    /// request ended outside a step.
    pub(super) fn release_draft_blocks(&mut self) {
        if let Some(drafter) = &mut self.drafter {
            drafter.release_stopped(&self.scheduler);
            self.telemetry
                .publish_draft_blocks(drafter.num_used_blocks());
        }
    }

    /// The draft model's guesses for this step's drafting sequences ([`crate::draft_model`]);
    /// a failure only costs the step its drafts.
    pub(super) fn propose_drafts(&mut self) {
        let Some(drafter) = &mut self.drafter else {
            return;
        };
        let start = std::time::Instant::now();
        if let Err(e) = drafter.propose(&mut self.scheduler) {
            tracing::warn!("{e}; this step runs without drafts");
            self.telemetry.metrics.draft_model_failures.increment(1);
        }
        self.telemetry.drafted(start.elapsed());
    }

    fn kv_cache_snapshot(&mut self) -> KvCacheSnapshot {
        // Everything the snapshot includes has been sent first, so `last_seq` is exact.
        self.send_kv_events();
        let blocks = self.scheduler.block_manager();
        KvCacheSnapshot {
            last_seq: self
                .kv_events
                .sender
                .as_ref()
                .and_then(KvEventSender::last_seq),
            block_size: blocks.block_size(),
            blocks: blocks.cached_blocks(),
        }
    }

    fn handle(&mut self, command: Command) -> Flow {
        match command {
            Command::Submit(submission) => self.admit(*submission),
            Command::Abort(id) => {
                self.abort_request(id);
            }
            Command::Drain => self.draining = true,
            Command::Stop => return Flow::Exit,
            Command::KvCacheSnapshot(reply) => {
                let _ = reply.send(self.kv_cache_snapshot());
            }
            Command::ResetPrefixCache(reply) => {
                let cleared = self.scheduler.clear_prefix_cache();
                tracing::info!(blocks = cleared, "prefix cache reset");
                let _ = reply.send(cleared);
            }
        }
        Flow::Continue
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
