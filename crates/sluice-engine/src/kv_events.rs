//! KV-cache events: what the prefix cache gained and lost, step by step, for routers that send a
//! request where its prompt's prefix is already cached (llm-d's precise prefix-cache scorer,
//! Dynamo's KV router). The block manager records them ([`crate::BlockManager::record_events`]);
//! the engine thread gathers each step's into one numbered [`KvEventBatch`] and hands it to a
//! [`KvEventSender`] without ever waiting; the server publishes the batches (vLLM's ZMQ wire
//! format).
//!
//! Replaying every batch in sequence order over an empty set rebuilds exactly the blocks the
//! prefix cache holds: [`KvCacheSnapshot`] is that set at a given sequence number, for a
//! subscriber that joins late or lost a batch.
//!
//! A block is named by its chain hash (the hash of its parent's hash and its own token ids), so
//! a hash names the whole prefix up to the block's end. The hash function is sluice's own:
//! routers that keep their own keys rebuild them from the token ids every `Stored` carries.

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{Receiver, Sender};

/// One change to the set of cached blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvCacheEvent {
    /// Consecutive full blocks of one sequence became findable in the prefix cache.
    Stored {
        /// In token order; each block's parent is the one before it.
        block_hashes: Vec<u64>,
        /// The first block's parent; `None` when the first block starts the sequence.
        parent_block_hash: Option<u64>,
        /// The blocks' tokens, `block_size` per block.
        token_ids: Vec<u32>,
        /// The LoRA adapter whose K/V they hold; `None`: the base model.
        lora_name: Option<std::sync::Arc<str>>,
    },
    /// Cached blocks whose memory was reused: no longer findable.
    Removed { block_hashes: Vec<u64> },
    /// The whole prefix cache was dropped.
    AllCleared,
}

/// The events of one engine step (or of the changes between steps), numbered in the order they
/// happened: `seq` counts up by one per batch from 0, so a gap means a lost batch.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventBatch {
    pub seq: u64,
    /// Seconds since the Unix epoch when the batch was made.
    pub timestamp: f64,
    pub events: Vec<KvCacheEvent>,
}

/// A cached block, as a `Stored` event of a single block would describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedBlock {
    pub hash: u64,
    pub parent_hash: Option<u64>,
    pub token_ids: Vec<u32>,
    /// The LoRA adapter whose K/V it holds; `None`: the base model.
    pub lora_name: Option<std::sync::Arc<str>>,
}

/// Every block in the prefix cache once the batches up to `last_seq` are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvCacheSnapshot {
    /// The last batch sent before the snapshot was taken (`None`: none yet, or events are off).
    pub last_seq: Option<u64>,
    pub block_size: usize,
    /// In no particular order.
    pub blocks: Vec<CachedBlock>,
}

/// How many batches may wait for the publisher before the engine drops new ones. A batch is
/// one step's events, so this is minutes of steps for a publisher that keeps up at all.
pub const KV_EVENT_QUEUE_BATCHES: usize = 16_384;

/// The engine thread's end of the event queue: numbers the batches and never blocks. A batch
/// that finds the queue full is dropped (the caller counts it, in the metrics); its number is
/// still spent, so subscribers see the gap.
#[derive(Debug)]
pub struct KvEventSender {
    tx: Sender<KvEventBatch>,
    next_seq: u64,
}

/// Makes the queue between the engine thread and the publisher.
pub fn kv_event_channel() -> (KvEventSender, Receiver<KvEventBatch>) {
    let (tx, rx) = tokio::sync::mpsc::channel(KV_EVENT_QUEUE_BATCHES);
    (KvEventSender { tx, next_seq: 0 }, rx)
}

impl KvEventSender {
    /// Sends `events` (left empty) as the next batch, unless there are none. Returns whether a
    /// batch was dropped because the queue was full or the publisher is gone.
    pub fn send(&mut self, events: &mut Vec<KvCacheEvent>) -> bool {
        if events.is_empty() {
            return false;
        }
        let batch = KvEventBatch {
            seq: self.next_seq,
            timestamp: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            events: std::mem::take(events),
        };
        self.next_seq += 1;
        match self.tx.try_send(batch) {
            Ok(()) => false,
            Err(TrySendError::Full(_) | TrySendError::Closed(_)) => true,
        }
    }

    /// The number of the last batch sent (or dropped).
    pub fn last_seq(&self) -> Option<u64> {
        self.next_seq.checked_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_numbered_and_a_full_queue_drops_without_blocking() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let mut sender = KvEventSender { tx, next_seq: 0 };
        let mut events = Vec::new();
        assert!(!sender.send(&mut events), "no events, no batch");
        assert_eq!(sender.last_seq(), None);
        events.push(KvCacheEvent::AllCleared);
        assert!(!sender.send(&mut events));
        assert!(events.is_empty());
        events.push(KvCacheEvent::AllCleared);
        assert!(
            sender.send(&mut events),
            "the queue holds one batch: dropped"
        );
        assert_eq!(sender.last_seq(), Some(1));
        assert_eq!(rx.try_recv().unwrap().seq, 0);
        events.push(KvCacheEvent::Removed {
            block_hashes: vec![7],
        });
        assert!(!sender.send(&mut events));
        assert_eq!(
            rx.try_recv().unwrap().seq,
            2,
            "the dropped batch left a gap"
        );
    }
}
