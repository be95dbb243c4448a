//! The running engine as its owner sees it: [`Engine::start`] sizes the scheduler from the
//! model and starts the engine thread ([`crate::engine_loop`], which owns the model and its
//! KV cache), [`Engine::shutdown`] drains it and joins it.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use sluice_model::Pooling;
use sluice_tokenizer::Tokenizer;

use crate::block_pools::KvGroupSpec;
use crate::draft_model::DraftModel;
use crate::engine_loop::EngineLoop;
use crate::handle::{Command, EngineHandle, Shared, SharedStats};
use crate::kv_events::{kv_event_channel, KvEventBatch};
use crate::metrics::EngineMetrics;
use crate::model::Model;
use crate::params::{MaxTokensPolicy, ModelLimits, MAX_N};
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerError};
use crate::speculation::{Proposer, SpeculationConfig};
use crate::telemetry::Telemetry;

/// Scheduling limits; the KV cache's geometry comes from the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens one step computes (prefill chunks and decodes together).
    pub max_num_batched_tokens: usize,
    /// Most sequences waiting; past it submissions fail with `SubmitError::Overloaded`. The
    /// handle enforces it, before a request reaches the engine thread.
    pub max_waiting: usize,
    /// Caps the model's context length (`None`: the model's own).
    pub max_model_len: Option<usize>,
    /// How embeddings pool the hidden states of their tokens.
    pub pooling: Pooling,
    /// Speculative decoding (`--speculative`): by n-gram lookup, or with the draft model
    /// given to [`Engine::start_with_draft`]; `None`: off.
    pub speculation: Option<SpeculationConfig>,
    /// Record KV-cache events and queue them for [`Engine::take_kv_events`] (`--kv-events`).
    pub kv_events: bool,
    /// LoRA adapters the model holds at once (`--max-loras`); 0: requests name none.
    pub max_loras: usize,
    /// A `max_tokens` past what the context leaves: lowered to it, or refused
    /// (`--max-tokens-policy`).
    pub max_tokens_policy: MaxTokensPolicy,
    /// The `model` label of this engine's metrics (the served name): several engines in one
    /// process each record their own series.
    pub metrics_model: String,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 256,
            max_num_batched_tokens: 512,
            max_waiting: 1024,
            max_model_len: None,
            pooling: Pooling::Mean,
            speculation: None,
            kv_events: false,
            max_loras: 0,
            max_tokens_policy: MaxTokensPolicy::Clamp,
            metrics_model: String::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Config(#[from] SchedulerError),
    #[error("{0}")]
    Speculation(String),
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
    kv_events: Option<tokio::sync::mpsc::Receiver<KvEventBatch>>,
}

impl Engine {
    /// Starts the engine thread. Logs the KV cache's capacity in tokens and the concurrency it
    /// allows at full context.
    pub fn start(
        model: Box<dyn Model>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        Self::start_inner(model, None, tokenizer, config)
    }

    /// [`Engine::start`] with a draft model for speculation (the `draft_model` module):
    /// `config.speculation` must ask for one ([`SpeculationConfig::draft_model`]). The draft
    /// model must share the target's tokenizer (the caller checks: the engine only sees ids);
    /// its own KV cache is its own geometry.
    pub fn start_with_draft(
        model: Box<dyn Model>,
        draft: Box<dyn Model>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        Self::start_inner(model, Some(draft), tokenizer, config)
    }

    fn start_inner(
        model: Box<dyn Model>,
        draft: Option<Box<dyn Model>>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        let wants_draft = config
            .speculation
            .is_some_and(|s| s.proposer == Proposer::DraftModel);
        if wants_draft != draft.is_some() {
            return Err(EngineError::Speculation(if wants_draft {
                "speculation with a draft model needs the draft model".into()
            } else {
                "a draft model was given without speculation by a draft model".into()
            }));
        }
        let max_model_len = config
            .max_model_len
            .map_or(model.max_model_len(), |m| m.min(model.max_model_len()));
        let (block_size, num_blocks) = (model.block_size(), model.num_blocks());
        let kv_groups = model.kv_groups();
        let states = kv_groups.iter().find_map(|g| match g {
            KvGroupSpec::Recurrent(r) => Some(r.num_states),
            KvGroupSpec::SlidingWindow(_) => None,
        });
        if draft.as_ref().is_some_and(|d| {
            d.kv_groups()
                .iter()
                .any(|g| matches!(g, KvGroupSpec::Recurrent(_)))
        }) {
            // The draft model's cache is one paged pool: it keeps no recurrent state.
            return Err(EngineError::Speculation(
                "a draft model with recurrent (Gated DeltaNet) layers: a draft model keeps no \
                 recurrent state of its own; draft with a model without them, or use \
                 --speculative ngram"
                    .into(),
            ));
        }
        if let Some(states) = states {
            let rollback = config.speculation.is_some();
            let split =
                crate::block_pools::RecurrentPool::split(states, config.max_num_seqs, rollback);
            let (running, checkpoints) = (split.running_sequences(), split.num_checkpoints);
            tracing::info!(
                states,
                running,
                checkpoints,
                "recurrent layers: {states} states from the KV budget, {} a running sequence \
                 ({running}{}) and {checkpoints} for prefix checkpoints{}",
                if rollback { "two" } else { "one" },
                if rollback {
                    ", the second to roll rejected drafts back"
                } else {
                    ""
                },
                if checkpoints == 0 {
                    " (none: no prefix of this model is served from the cache; raise \
                     --kv-cache-memory)"
                } else {
                    ""
                }
            );
        }
        let mut scheduler = Scheduler::new(SchedulerConfig {
            max_num_seqs: config.max_num_seqs,
            max_num_batched_tokens: config.max_num_batched_tokens,
            block_size,
            num_blocks,
            max_model_len,
            speculation: config.speculation,
            kv_groups,
            max_loras: config.max_loras,
        })?;
        let images = model.image_input();
        if let Some(images) = images {
            if images.tokens_per_image > config.max_num_batched_tokens {
                // A chunk never ends inside an image, so an image must fit one step.
                return Err(EngineError::Config(SchedulerError::InvalidConfig(format!(
                    "an image takes {} tokens, more than a step's budget of {} \
                     (max_num_batched_tokens): raise it",
                    images.tokens_per_image, config.max_num_batched_tokens
                ))));
            }
            if draft.is_some() {
                // The draft model would read an image's cache keys as tokens.
                return Err(EngineError::Speculation(
                    "a draft model beside a model that takes images: use --speculative ngram"
                        .into(),
                ));
            }
        }
        let limits = ModelLimits {
            vocab_size: model.vocab_size(),
            max_model_len,
            kv_cache_tokens: num_blocks * block_size,
            max_n: MAX_N.min(config.max_waiting),
            max_loras: config.max_loras,
            max_tokens_policy: config.max_tokens_policy,
            images,
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
            pooling: config.pooling,
            hidden_size: model.hidden_size(),
            max_waiting: config.max_waiting,
            kv_events: config.kv_events,
            tokenizer: tokenizer.clone(),
            next_id: 1.into(),
            draining: false.into(),
            stopped: false.into(),
            lora_usage: Default::default(),
        });
        shared
            .stats
            .blocks_total
            .store(num_blocks, Ordering::Release);
        let (kv_event_sender, kv_events) = if config.kv_events {
            scheduler.record_kv_events();
            let (tx, rx) = kv_event_channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let (commands, command_rx) = channel();
        let (exited_tx, exited) = channel();
        let metrics = EngineMetrics::register(&config.metrics_model);
        metrics.blocks_total.set(num_blocks as f64);
        metrics.window_blocks_total.set(
            scheduler
                .block_pools()
                .windows()
                .map(|w| w.num_blocks())
                .sum::<usize>() as f64,
        );
        metrics.window_blocks_used.set(0.0);
        metrics.states_total.set(states.unwrap_or(0) as f64);
        metrics.states_used.set(0.0);
        let drafter = draft.map(|draft| {
            let cost_aware = config.speculation.is_none_or(|s| s.cost_aware);
            let drafter = DraftModel::new(
                draft,
                model.vocab_size(),
                config.max_num_batched_tokens,
                cost_aware,
            );
            // Its size is logged by whoever built it (the server, with its bytes).
            shared
                .stats
                .draft_blocks_total
                .store(drafter.num_blocks(), Ordering::Release);
            drafter
        });
        let engine_loop = EngineLoop::new(
            model,
            drafter,
            tokenizer,
            scheduler,
            shared.clone(),
            command_rx,
            Telemetry::new(shared.clone(), metrics),
            kv_event_sender,
        );
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
            kv_events,
        })
    }

    /// The batches of KV-cache events, in order, when the engine was started with
    /// [`EngineConfig::kv_events`]; `None` then after the first call. Read them promptly: the
    /// engine drops (and counts) batches while [`crate::kv_events::KV_EVENT_QUEUE_BATCHES`]
    /// wait.
    pub fn take_kv_events(&mut self) -> Option<tokio::sync::mpsc::Receiver<KvEventBatch>> {
        self.kv_events.take()
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
