//! sluice-engine: the continuous-batching core. The block manager tracks the paged KV cache,
//! the scheduler decides every step which tokens of which sequences one batched forward
//! computes, the sampler picks every sequence's next token at once, and the engine loop ties
//! them to a [`Model`] on its own thread, streaming each request's tokens back through an
//! [`EngineHandle`].

pub mod block_manager;
pub mod block_pools;
pub mod constraint;
mod draft_model;
pub mod engine;
mod engine_loop;
pub mod events;
pub mod grammar;
pub mod handle;
pub mod images;
pub mod kv_events;
pub mod logits;
pub mod metrics;
pub mod model;
pub mod params;
pub mod pooling;
mod request_state;
pub mod rng;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod speculation;
pub mod stop;
mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use block_manager::{
    AdapterKey, BlockId, BlockManager, BlockTable, CachedPrefix, PrefixCacheStats,
};
pub use block_pools::{
    BlockPools, Holding, KvGroupSpec, RecurrentPool, SeqBlocks, StateId, WindowPool,
};
pub use constraint::{Constraint, ConstraintCompiler, ConstraintError};
pub use engine::{Engine, EngineConfig, EngineError, ShutdownReport};
pub use events::{ErrorCause, Event, FinishEvent, Timing, TokenEvent, Usage};
pub use grammar::{FunctionSpec, GbnfError, Grammar, GrammarError};
pub use handle::{EngineHandle, EngineStats, LoraUsage, RequestStream, SubmitError};
pub use images::{ImageLimits, ImageSpan, PromptImage};
pub use kv_events::{
    kv_event_channel, CachedBlock, KvCacheEvent, KvCacheSnapshot, KvEventBatch, KvEventSender,
};
pub use model::{Model, ModelFailure};
pub use params::{
    InvalidRequest, LoraRequest, MaxTokensPolicy, ModelLimits, Request, SamplingParams, StopParams,
    ValidRequest,
};
pub use pooling::l2_normalize;
pub use sampler::{SampleRow, Sampled, Sampler, TokenCounts, TokenLogprobs};
pub use scheduler::{
    Aborted, DraftCandidate, Removed, ScheduledSeq, Scheduler, SchedulerConfig, SchedulerError,
    SchedulerOutput,
};
pub use sequence::{RequestId, SeqId, Sequence, SequenceStatus};
pub use sluice_model::Pooling;
pub use speculation::{Proposer, SpeculationConfig};
pub use stop::{FinishReason, StopReason};
