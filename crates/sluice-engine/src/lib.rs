//! sluice-engine: the continuous-batching core. The block manager tracks the paged KV cache,
//! the scheduler decides every step which tokens of which sequences one batched forward
//! computes, and fills the model's flat [`sluice_model::StepBatch`] from that plan.

pub mod block_manager;
pub mod scheduler;
pub mod sequence;

pub use block_manager::{BlockId, BlockManager, BlockTable, CachedPrefix, PrefixCacheStats};
pub use scheduler::{ScheduledSeq, Scheduler, SchedulerConfig, SchedulerError, SchedulerOutput};
pub use sequence::{RequestId, SeqId, Sequence, SequenceStatus};
