//! KV-cache events through the whole engine: a subscriber that applies every batch in order
//! holds exactly the blocks the prefix cache holds, across a storm that evicts and preempts.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use sluice_engine::testing::{byte_prompt, tiny_tokenizer, MockModel, TINY_VOCAB};
use sluice_engine::{
    Engine, EngineConfig, EngineHandle, KvCacheEvent, KvCacheSnapshot, KvEventBatch, Request,
    StopParams,
};
use tokio::sync::mpsc::Receiver;

const BLOCK_SIZE: usize = 16;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// What a subscriber knows: block hash -> (parent, tokens), and the last batch applied.
#[derive(Default)]
struct Replica {
    blocks: HashMap<u64, (Option<u64>, Vec<u32>)>,
    last_seq: Option<u64>,
    stored: usize,
    removed: usize,
    cleared: usize,
}

impl Replica {
    fn apply(&mut self, batch: &KvEventBatch) {
        let expected = self.last_seq.map_or(0, |s| s + 1);
        assert_eq!(batch.seq, expected, "batches arrive numbered without gaps");
        self.last_seq = Some(batch.seq);
        for event in &batch.events {
            match event {
                KvCacheEvent::Stored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    ..
                } => {
                    assert_eq!(token_ids.len(), block_hashes.len() * BLOCK_SIZE);
                    let mut parent = *parent_block_hash;
                    for (hash, tokens) in block_hashes.iter().zip(token_ids.chunks(BLOCK_SIZE)) {
                        let old = self.blocks.insert(*hash, (parent, tokens.to_vec()));
                        assert!(old.is_none(), "block {hash:#x} stored twice");
                        parent = Some(*hash);
                        self.stored += 1;
                    }
                }
                KvCacheEvent::Removed { block_hashes } => {
                    for hash in block_hashes {
                        assert!(
                            self.blocks.remove(hash).is_some(),
                            "block {hash:#x} removed but never stored"
                        );
                        self.removed += 1;
                    }
                }
                KvCacheEvent::AllCleared => {
                    self.blocks.clear();
                    self.cleared += 1;
                }
            }
        }
    }

    /// Applies batches until the one the snapshot was taken at, then compares.
    fn catch_up_and_compare(&mut self, rx: &mut Receiver<KvEventBatch>, snap: &KvCacheSnapshot) {
        while self.last_seq != snap.last_seq {
            let batch = rx.blocking_recv().expect("the engine is running");
            self.apply(&batch);
        }
        let server: HashMap<u64, (Option<u64>, Vec<u32>)> = snap
            .blocks
            .iter()
            .map(|b| (b.hash, (b.parent_hash, b.token_ids.clone())))
            .collect();
        let missing = server
            .keys()
            .filter(|h| !self.blocks.contains_key(h))
            .count();
        let extra = self
            .blocks
            .keys()
            .filter(|h| !server.contains_key(h))
            .count();
        assert_eq!((missing, extra), (0, 0), "rebuilt cache differs");
        assert_eq!(self.blocks, server, "same parents and tokens");
    }
}

fn request(shared_prefix: &[u32], seed: u64, own: usize, max_tokens: usize) -> Request {
    let mut prompt = shared_prefix.to_vec();
    prompt.extend(byte_prompt(seed, own));
    Request {
        stop: StopParams {
            ignore_eos: true,
            ..StopParams::default()
        },
        ..Request::new(prompt, max_tokens)
    }
}

fn storm(handle: &EngineHandle, clients: u64) {
    let prefixes: Vec<Vec<u32>> = (0..3).map(|p| byte_prompt(1000 + p, 40)).collect();
    let prefixes = Arc::new(prefixes);
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let h = handle.clone();
            let prefixes = prefixes.clone();
            thread::spawn(move || {
                for r in 0..4 {
                    let req = request(&prefixes[((c + r) % 3) as usize], c * 10 + r, 30, 40);
                    let stream = h.submit(h.validate(req).unwrap()).unwrap();
                    stream.collect_blocking();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_replica_built_from_the_events_equals_the_prefix_cache_after_a_storm() {
    // 24 blocks of 16 tokens: far fewer than 12 clients of ~110 tokens need, so blocks are
    // evicted and sequences preempted all along.
    let model = MockModel::new(TINY_VOCAB, 512, 24, BLOCK_SIZE);
    let mut engine = Engine::start(
        Box::new(model),
        tiny_tokenizer(),
        EngineConfig {
            kv_events: true,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let mut rx = engine.take_kv_events().expect("events are on");
    assert!(engine.take_kv_events().is_none());
    let h = engine.handle();
    assert!(h.records_kv_events());
    let rt = runtime();
    let mut replica = Replica::default();

    storm(&h, 12);
    assert!(h.stats().preemptions > 0, "the storm preempted");
    let snap = rt.block_on(h.kv_cache_snapshot()).unwrap();
    assert_eq!(snap.block_size, BLOCK_SIZE);
    assert!(!snap.blocks.is_empty());
    replica.catch_up_and_compare(&mut rx, &snap);
    assert!(replica.removed > 0, "the storm evicted cached blocks");

    // A reset is one AllCleared; the cache and the replica are empty after it.
    let cleared = rt.block_on(h.reset_prefix_cache()).unwrap();
    assert_eq!(cleared, snap.blocks.len());
    let snap = rt.block_on(h.kv_cache_snapshot()).unwrap();
    assert!(snap.blocks.is_empty());
    replica.catch_up_and_compare(&mut rx, &snap);
    assert_eq!(replica.cleared, 1);

    // And it goes on matching afterwards.
    storm(&h, 4);
    let snap = rt.block_on(h.kv_cache_snapshot()).unwrap();
    replica.catch_up_and_compare(&mut rx, &snap);
    assert!(replica.stored > replica.removed);
    assert_eq!(
        engine.shutdown(Duration::from_secs(10)).aborted,
        0,
        "nothing left in flight"
    );
}

#[test]
fn without_kv_events_nothing_is_queued_and_snapshots_still_work() {
    let model = MockModel::new(TINY_VOCAB, 512, 64, BLOCK_SIZE);
    let mut engine =
        Engine::start(Box::new(model), tiny_tokenizer(), EngineConfig::default()).unwrap();
    assert!(engine.take_kv_events().is_none());
    let h = engine.handle();
    assert!(!h.records_kv_events());
    storm(&h, 2);
    let snap = runtime().block_on(h.kv_cache_snapshot()).unwrap();
    assert_eq!(snap.last_seq, None);
    assert!(
        !snap.blocks.is_empty(),
        "the prefix cache works without events"
    );
}
