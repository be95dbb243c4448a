//! Randomised workloads against the block manager and the scheduler, checked step by step.

mod common;

use std::collections::{HashMap, HashSet};

use common::{chain, is_eos, next_token, sample, tokens, HashModel};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use sluice_engine::{
    BlockManager, BlockTable, KvCacheEvent, KvGroupSpec, Scheduler, SchedulerConfig, SeqId,
    SequenceStatus, WindowPool,
};
use sluice_model::StepBatch;

#[derive(Debug, Clone)]
struct Req {
    arrival: usize,
    /// Which shared token stream the prompt starts with, and how much of it.
    base: u64,
    shared: usize,
    tail: usize,
    max_tokens: usize,
    n: usize,
    /// Steps after arrival, and whether it lands between the forward and commit.
    abort: Option<(usize, bool)>,
}

#[derive(Debug, Clone)]
struct Case {
    num_blocks: usize,
    block_size: usize,
    max_num_seqs: usize,
    budget: usize,
    max_model_len: usize,
    eos: bool,
    reqs: Vec<Req>,
    /// Sliding-window layers with their own pool: the window, and where the pool's size lies
    /// between what one sequence needs and what every running one could (0..=1).
    window: Option<(usize, f64)>,
}

impl Case {
    fn window_pool(&self) -> Option<WindowPool> {
        self.window.map(|(window, size)| {
            let bs = self.block_size;
            let one = WindowPool::blocks_for_one(window, self.budget, bs).min(self.num_blocks);
            let all = WindowPool::blocks_for_all(window, self.max_num_seqs, self.budget, bs);
            WindowPool {
                num_blocks: one + (size * all.saturating_sub(one) as f64) as usize,
                window,
            }
        })
    }
}

fn req() -> impl Strategy<Value = Req> {
    (
        0usize..40,
        0u64..3,
        0usize..48,
        0usize..24,
        1usize..24,
        prop_oneof![4 => Just(1usize), 1 => 2usize..=3],
        option::weighted(0.2, (0usize..20, any::<bool>())),
    )
        .prop_map(|(arrival, base, shared, tail, max_tokens, n, abort)| Req {
            arrival,
            base,
            shared,
            tail,
            max_tokens,
            n,
            abort,
        })
}

fn case() -> impl Strategy<Value = Case> {
    (
        8usize..=64,
        prop_oneof![Just(1usize), Just(2), Just(4), Just(8), Just(16)],
        1usize..=8,
        1usize..=48,
        16usize..=200,
        any::<bool>(),
        vec(req(), 1..32),
        option::of((1usize..=40, 0.0f64..=1.0)),
    )
        .prop_map(
            |(num_blocks, block_size, max_num_seqs, budget, max_model_len, eos, reqs, window)| {
                Case {
                    num_blocks,
                    block_size,
                    max_num_seqs,
                    budget,
                    max_model_len,
                    eos,
                    reqs,
                    window,
                }
            },
        )
}

/// What the test knows about a sequence, independently of the scheduler.
struct Shadow {
    tokens: Vec<u32>,
    /// The mock K/V value each position must hold once computed.
    chain: Vec<u64>,
    prompt_len: usize,
    max_tokens: usize,
    /// Tokens in the cache, or None while waiting (new or preempted).
    computed: Option<usize>,
    ended: bool,
}

fn slot(table: &[u32], bs: usize, pos: usize) -> usize {
    table[pos / bs] as usize * bs + pos % bs
}

/// What `ValidRequest` guarantees the scheduler (it refuses the rest before they reach it):
/// a non-empty prompt, and prompt + max_tokens within the context and the whole cache.
fn admissible(c: &Case, prompt_len: usize, r: &Req) -> bool {
    let total = prompt_len + r.max_tokens;
    prompt_len > 0 && total <= c.max_model_len && total.div_ceil(c.block_size) <= c.num_blocks
}

/// The records this test keeps in the scheduler: each request's id and each sequence's, so
/// that every record handed back can be checked against whose it is.
type RecordingScheduler = Scheduler<u64, SeqId>;

fn abort(sched: &mut RecordingScheduler, shadows: &mut HashMap<SeqId, Shadow>, request: u64) {
    let mut live: Vec<SeqId> = shadows
        .iter()
        .filter(|(id, s)| id.request == request && !s.ended)
        .map(|(&id, _)| id)
        .collect();
    live.sort_unstable();
    match sched.abort(request) {
        Some(aborted) => {
            assert_eq!(aborted.state, request, "another request's record");
            let records: Vec<SeqId> = aborted.sequences.iter().map(|&(_, id)| id).collect();
            assert_eq!(records, live, "the live sequences' records, in index order");
            for (index, id) in &aborted.sequences {
                assert_eq!(*index, id.index);
            }
        }
        None => assert!(live.is_empty(), "{request} had live sequences"),
    }
    for (_, s) in shadows.iter_mut().filter(|(id, _)| id.request == request) {
        s.ended = true;
    }
}

fn run_case(c: &Case) {
    let config = SchedulerConfig {
        max_num_seqs: c.max_num_seqs,
        max_num_batched_tokens: c.budget,
        block_size: c.block_size,
        num_blocks: c.num_blocks,
        max_model_len: c.max_model_len,
        speculation: None,
        kv_groups: c
            .window_pool()
            .map(KvGroupSpec::SlidingWindow)
            .into_iter()
            .collect(),
        max_loras: 0,
    };
    let bs = c.block_size;
    let mut sched: RecordingScheduler = Scheduler::new(config).unwrap();
    let mut model = HashModel::new(c.num_blocks, bs);
    // The sliding-window layers' K/V, written through the window tables: each slot holds the
    // value of the position last written to it.
    let mut window_kv: Vec<Option<u64>> =
        vec![None; c.window_pool().map_or(0, |w| w.num_blocks) * bs];
    let mut batch = StepBatch::new(bs);
    let bases: Vec<Vec<u32>> = (0..3).map(|b| tokens(b, 48)).collect();
    let mut shadows: HashMap<SeqId, Shadow> = HashMap::new();
    let mut accepted: Vec<(u64, &Req)> = Vec::new();
    let last_arrival = c.reqs.iter().map(|r| r.arrival).max().unwrap_or(0);
    let mut saw_preempted: HashMap<SeqId, Vec<u32>> = HashMap::new();

    for step in 0.. {
        for (rid, r) in c.reqs.iter().enumerate().filter(|(_, r)| r.arrival == step) {
            let rid = rid as u64;
            let mut prompt = bases[r.base as usize][..r.shared].to_vec();
            prompt.extend(tokens(1000 + rid, r.tail));
            if admissible(c, prompt.len(), r) {
                let seqs = (0..r.n as u32).map(|i| SeqId::new(rid, i)).collect();
                sched.queue_request(rid, prompt.clone(), r.max_tokens, rid, seqs);
                accepted.push((rid, r));
                for index in 0..r.n as u32 {
                    shadows.insert(
                        SeqId::new(rid, index),
                        Shadow {
                            chain: chain(&prompt),
                            tokens: prompt.clone(),
                            prompt_len: prompt.len(),
                            max_tokens: r.max_tokens,
                            computed: None,
                            ended: false,
                        },
                    );
                }
            }
        }
        let aborts_now = |mid: bool| -> Vec<u64> {
            accepted
                .iter()
                .filter(|(_, r)| {
                    r.abort
                        .is_some_and(|(d, m)| m == mid && r.arrival + d == step)
                })
                .map(|(rid, _)| *rid)
                .collect()
        };
        for rid in aborts_now(false) {
            abort(&mut sched, &mut shadows, rid);
        }
        if step > last_arrival && !sched.has_unfinished() {
            break;
        }
        assert!(
            step < 20_000,
            "no progress: {} running, {} waiting",
            sched.num_running(),
            sched.num_waiting()
        );

        let out = sched.schedule();
        assert!(out.num_tokens() <= c.budget, "token budget exceeded");
        assert!(
            out.scheduled().len() <= c.max_num_seqs,
            "max_num_seqs exceeded"
        );
        assert_eq!(
            out.num_tokens(),
            out.scheduled().iter().map(|s| s.len).sum::<usize>()
        );
        for id in out.preempted() {
            let sh = shadows.get_mut(id).unwrap();
            assert!(sh.computed.is_some(), "{id} preempted while not running");
            sh.computed = None;
            saw_preempted.insert(*id, sh.tokens.clone());
            assert!(
                out.scheduled().iter().all(|s| s.seq_id != *id),
                "{id} preempted and scheduled"
            );
        }
        let mut seen = Vec::new();
        for s in out.scheduled() {
            assert!(!seen.contains(&s.seq_id), "{} scheduled twice", s.seq_id);
            seen.push(s.seq_id);
            let sh = &shadows[&s.seq_id];
            assert!(!sh.ended);
            assert!(s.len >= 1);
            match sh.computed {
                Some(computed) => {
                    assert_eq!(s.start, computed, "{}: chunks are contiguous", s.seq_id)
                }
                None => assert!(
                    s.start.is_multiple_of(bs) && s.start < sh.tokens.len(),
                    "{}: admitted at {}",
                    s.seq_id,
                    s.start
                ),
            }
            assert!(s.start + s.len <= sh.tokens.len());
            assert_eq!(
                s.sample,
                s.start + s.len == sh.tokens.len(),
                "{}: samples iff it reaches the end",
                s.seq_id
            );
            assert!(
                sh.tokens.len() - sh.prompt_len < sh.max_tokens,
                "{} runs past max_tokens",
                s.seq_id
            );
        }
        let num_tokens = out.num_tokens();
        assert!(sched.num_running() <= c.max_num_seqs);

        sched.fill_step_batch(&mut batch);
        assert_eq!(batch.num_tokens(), num_tokens);
        for (s, slice) in sched.output().scheduled().iter().zip(&batch.sequences) {
            let sh = &shadows[&s.seq_id];
            let q = slice.query_start..slice.query_start + slice.query_len;
            assert_eq!(
                batch.input_ids[q.clone()],
                sh.tokens[s.start..s.start + s.len]
            );
            let positions: Vec<u32> = (s.start as u32..(s.start + s.len) as u32).collect();
            assert_eq!(batch.positions[q], positions[..]);
            // Everything this sequence attends to from earlier steps (or the prefix cache) is
            // exactly its own tokens' K/V.
            let table = batch.block_table(slice);
            for p in 0..s.start {
                assert_eq!(
                    model.kv[slot(table, bs, p)],
                    Some(sh.chain[p]),
                    "{}: K/V at {p}",
                    s.seq_id
                );
            }
            // A sliding-window layer's table holds what its first query's window reaches,
            // and hardly more.
            if let Some((window, _)) = c.window {
                // The window pool is the scheduler's only group.
                let wtable = slice.block_table(batch.tables(Some(0)).1);
                let seq = sched.get(s.seq_id).unwrap();
                assert_eq!(wtable, seq.blocks().window().blocks());
                for p in (s.start + 1).saturating_sub(window)..s.start {
                    assert_eq!(
                        window_kv[slot(wtable, bs, p)],
                        Some(sh.chain[p]),
                        "{}: window K/V at {p}",
                        s.seq_id
                    );
                }
                let live = seq.blocks().window().live_blocks().len();
                assert!(
                    live <= WindowPool::blocks_for_one(window, s.len, bs),
                    "{}: {live} window blocks live for a window of {window} and {} new tokens",
                    s.seq_id,
                    s.len
                );
            }
        }
        for (s, records) in sched.scheduled_records() {
            let id = s.seq_id;
            assert_eq!(
                records,
                Some((&id.request, &id)),
                "{id} met another's records"
            );
        }
        let logits = model.forward(&batch);
        if c.window.is_some() {
            for (q, &slot) in batch.tables(Some(0)).0.iter().enumerate() {
                window_kv[slot as usize] = model.kv[batch.slot_mapping[q] as usize];
            }
        }
        let rows: Vec<SeqId> = sched.output().sampling().map(|s| s.seq_id).collect();
        let sampled: Vec<u32> = logits
            .iter()
            .zip(&rows)
            .map(|(&l, &id)| sample(l, id))
            .collect();
        let scheduled: Vec<(SeqId, usize, usize, bool)> = sched
            .output()
            .scheduled()
            .iter()
            .map(|s| (s.seq_id, s.start, s.len, s.sample))
            .collect();

        for rid in aborts_now(true) {
            abort(&mut sched, &mut shadows, rid);
        }
        sched.commit(&sampled).unwrap();
        let mut row = 0;
        for (id, start, len, sample) in scheduled {
            let token = sample.then(|| {
                row += 1;
                sampled[row - 1]
            });
            let sh = shadows.get_mut(&id).unwrap();
            if sh.ended {
                continue;
            }
            sh.computed = Some(start + len);
            if let Some(t) = token {
                assert_eq!(
                    t,
                    next_token(id, &sh.tokens),
                    "{id}: output differs from running alone"
                );
                sh.tokens.push(t);
                sh.chain = chain(&sh.tokens);
                if sh.tokens.len() - sh.prompt_len == sh.max_tokens || (c.eos && is_eos(t)) {
                    let removed = sched.finish(id).expect("a live sequence");
                    sh.ended = true;
                    assert_eq!(removed.state, id, "another sequence's record");
                    let last = !shadows
                        .iter()
                        .any(|(other, s)| other.request == id.request && !s.ended);
                    assert_eq!(
                        removed.request,
                        last.then_some(id.request),
                        "{id}: the request's record leaves with its last sequence"
                    );
                }
            }
        }

        sched
            .check_invariants()
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        for (id, sh) in &shadows {
            match sched.get(*id) {
                None => assert!(sh.ended, "{id} vanished"),
                Some(seq) => {
                    assert!(!sh.ended, "{id} outlived its end");
                    assert_eq!(seq.tokens(), &sh.tokens[..], "{id} lost tokens");
                    assert_eq!(
                        seq.status() == SequenceStatus::Running,
                        sh.computed.is_some()
                    );
                    if let Some(computed) = sh.computed {
                        assert_eq!(seq.num_computed(), computed);
                    }
                }
            }
        }
        let in_tables: HashSet<u32> = shadows
            .keys()
            .filter_map(|id| sched.get(*id))
            .flat_map(|s| s.block_table().iter().copied())
            .collect();
        assert_eq!(
            in_tables.len(),
            sched.num_used_blocks(),
            "used blocks are exactly those in tables"
        );
    }

    assert!(!sched.has_unfinished());
    assert_eq!(sched.num_used_blocks(), 0, "blocks leaked");
    assert!(
        shadows.values().all(|s| s.ended),
        "a sequence never finished"
    );
    sched.check_invariants().unwrap();
    let stats = sched.prefix_cache_stats();
    assert!(stats.hits <= stats.queries);
    // Preempted sequences kept their tokens: each one's final tokens extend those it had.
    for (id, before) in &saw_preempted {
        assert!(shadows[id].tokens.starts_with(before));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn scheduler_keeps_its_invariants(c in case()) {
        run_case(&c);
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Admit table `i` (if empty) with `len` tokens of stream `base`, through the prefix cache
    /// (as a sliding-window pool's table when `window` is set: only what its window reaches).
    Admit {
        i: usize,
        base: u64,
        len: usize,
        window: Option<usize>,
    },
    /// Give back table `i`'s blocks out of a window of `window` tokens past its computed ones.
    Slide {
        i: usize,
        window: usize,
    },
    /// Grow table `i` by `extra` tokens.
    Grow {
        i: usize,
        extra: usize,
    },
    /// Mark all of table `i`'s tokens computed.
    Compute {
        i: usize,
    },
    Free {
        i: usize,
    },
    /// Empty the prefix cache.
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0usize..6, 0u64..2, 1usize..40, option::of(1usize..20))
            .prop_map(|(i, base, len, window)| Op::Admit { i, base, len, window }),
        3 => (0usize..6, 1usize..20).prop_map(|(i, window)| Op::Slide { i, window }),
        8 => (0usize..6, 1usize..12).prop_map(|(i, extra)| Op::Grow { i, extra }),
        8 => (0usize..6).prop_map(|i| Op::Compute { i }),
        8 => (0usize..6).prop_map(|i| Op::Free { i }),
        1 => Just(Op::Clear),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn block_manager_counts_every_reference(
        num_blocks in 1usize..24,
        block_size in prop_oneof![Just(1usize), Just(2), Just(4), Just(8)],
        ops in vec(op(), 1..80),
    ) {
        let mut bm = BlockManager::new(num_blocks, block_size);
        bm.record_events();
        // What a KV-event subscriber rebuilds: hash -> (parent, tokens).
        let mut replica: HashMap<u64, (Option<u64>, Vec<u32>)> = HashMap::new();
        let mut events = Vec::new();
        let streams: Vec<Vec<u32>> = (0..2).map(|b| tokens(b, 100)).collect();
        let mut tables: Vec<BlockTable> = (0..6).map(|_| BlockTable::new()).collect();
        // Per table: its token stream, its length and how many are computed (a table belongs
        // to one token sequence, so a freed one is replaced). Per block: the tokens computed
        // into it.
        let mut seqs: Vec<(usize, usize, usize)> = vec![(0, 0, 0); 6];
        let mut content: Vec<Vec<Option<u32>>> = vec![vec![None; block_size]; num_blocks];
        for op in ops {
            match op {
                Op::Admit { i, base, len, window } => {
                    if !tables[i].is_empty() {
                        continue;
                    }
                    let toks = &streams[base as usize][..len];
                    tables[i] = BlockTable::new();
                    let prefix = match window {
                        None => bm.find_cached_prefix(&mut tables[i], toks),
                        Some(w) => bm.find_cached_window(&mut tables[i], toks, w, usize::MAX),
                    };
                    let hit = prefix.num_tokens(block_size);
                    prop_assert!(hit < len);
                    prop_assert_eq!(
                        prefix.first_block,
                        window.map_or(0, |w| bm.window_start_block(prefix.num_blocks, w))
                    );
                    let free_before = bm.num_free_blocks();
                    if bm.allocate_with_prefix(&mut tables[i], &prefix, len) {
                        prop_assert_eq!(tables[i].first_live(), prefix.first_block);
                        for p in prefix.first_block * block_size..hit {
                            let b = tables[i].blocks()[p / block_size] as usize;
                            prop_assert_eq!(content[b][p % block_size], Some(toks[p]), "a hit returned other tokens");
                        }
                        seqs[i] = (base as usize, len, hit);
                    } else {
                        prop_assert!(tables[i].is_empty());
                        prop_assert_eq!(bm.num_free_blocks(), free_before);
                        prop_assert!(len.div_ceil(block_size) - prefix.num_blocks > free_before - prefix.num_evictable);
                    }
                }
                Op::Grow { i, extra } => {
                    if tables[i].is_empty() {
                        continue;
                    }
                    let len = (seqs[i].1 + extra).min(100);
                    let free_before = bm.num_free_blocks();
                    let need = len.div_ceil(block_size).saturating_sub(tables[i].len());
                    let ok = bm.allocate(&mut tables[i], len);
                    prop_assert_eq!(ok, need <= free_before);
                    if ok {
                        seqs[i].1 = len;
                    }
                }
                Op::Compute { i } => {
                    if tables[i].is_empty() {
                        continue;
                    }
                    let (base, len, computed) = seqs[i];
                    let toks = &streams[base][..len];
                    for p in computed..len {
                        let b = tables[i].blocks()[p / block_size] as usize;
                        content[b][p % block_size] = Some(toks[p]);
                    }
                    seqs[i].2 = len;
                    bm.register_computed(&mut tables[i], toks, len);
                }
                Op::Slide { i, window } => {
                    if tables[i].is_empty() {
                        continue;
                    }
                    let computed = seqs[i].2;
                    let before = tables[i].first_live();
                    let first_kept = (computed + 1).saturating_sub(window) / block_size;
                    bm.release_before(&mut tables[i], first_kept);
                    // Only computed (registered) blocks go, and never one the window reaches.
                    prop_assert_eq!(
                        tables[i].first_live(),
                        before.max(first_kept.min(computed / block_size))
                    );
                    prop_assert!(tables[i].blocks()[..tables[i].first_live()].iter().all(|&b| b == 0));
                }
                Op::Free { i } => {
                    bm.free(&mut tables[i]);
                }
                Op::Clear => {
                    bm.clear_prefix_cache();
                }
            }
            bm.check_consistency(tables.iter()).map_err(TestCaseError::fail)?;
            bm.drain_events(&mut events);
            for event in events.drain(..) {
                match event {
                    KvCacheEvent::Stored { block_hashes, parent_block_hash, token_ids, .. } => {
                        let mut parent = parent_block_hash;
                        for (h, chunk) in block_hashes.iter().zip(token_ids.chunks(block_size)) {
                            prop_assert!(replica.insert(*h, (parent, chunk.to_vec())).is_none());
                            parent = Some(*h);
                        }
                    }
                    KvCacheEvent::Removed { block_hashes } => {
                        for h in block_hashes {
                            prop_assert!(replica.remove(&h).is_some(), "removed, never stored");
                        }
                    }
                    KvCacheEvent::AllCleared => replica.clear(),
                }
            }
            let cached: HashMap<u64, (Option<u64>, Vec<u32>)> = bm
                .cached_blocks()
                .into_iter()
                .map(|b| (b.hash, (b.parent_hash, b.token_ids)))
                .collect();
            prop_assert_eq!(&replica, &cached, "the events rebuild the prefix cache");
            let used: HashSet<u32> = tables.iter().flat_map(|t| t.live_blocks().iter().copied()).collect();
            prop_assert_eq!(used.len(), bm.num_used_blocks());
        }
        for t in &mut tables {
            bm.free(t);
        }
        prop_assert_eq!(bm.num_used_blocks(), 0);
        bm.check_consistency(tables.iter()).map_err(TestCaseError::fail)?;
    }
}
