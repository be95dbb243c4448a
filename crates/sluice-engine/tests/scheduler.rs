mod common;

use common::{reference_generate, tokens, Driver};
use sluice_engine::{
    KvGroupSpec, PrefixCacheStats, RecurrentPool, Scheduler, SchedulerConfig, SchedulerError,
    SeqId, SequenceStatus, WindowPool,
};
use sluice_model::GroupTables;

fn config(num_blocks: usize, block_size: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 256,
        block_size,
        num_blocks,
        max_model_len: 1024,
        speculation: None,
        kv_groups: Vec::new(),
        max_loras: 0,
    }
}

/// How many sequences `abort` removed (0 for a request that is not there).
fn aborted(sched: &mut Scheduler, request: u64) -> usize {
    sched.abort(request).map_or(0, |a| a.sequences.len())
}

fn seq(request: u64) -> SeqId {
    SeqId::new(request, 0)
}

#[test]
fn a_shared_long_prefix_is_served_from_the_cache() {
    let mut d = Driver::new(config(64, 16));
    let shared = tokens(1, 96);
    let mut a = shared.clone();
    a.extend(tokens(2, 4));
    d.sched.add_request(1, a.clone(), 8, 1);
    d.step();
    assert_eq!(d.sched.get(seq(1)).unwrap().num_computed(), 100);

    let mut b = shared.clone();
    b.extend(tokens(3, 10));
    d.sched.add_request(2, b.clone(), 8, 1);
    let out = d.sched.schedule();
    let sb = out.scheduled().iter().find(|s| s.seq_id == seq(2)).unwrap();
    assert_eq!((sb.start, sb.len), (96, 10), "B computes only its own tail");
    assert_eq!(
        d.sched.prefix_cache_stats(),
        PrefixCacheStats {
            queries: 100 + 106,
            hits: 96
        }
    );
    // A: 101 tokens in 7 blocks; B: its first 6 blocks are A's, plus one of its own.
    assert_eq!(d.sched.num_used_blocks(), 8);
    let sa = d.sched.get(seq(1)).unwrap().block_table().to_vec();
    let sbt = d.sched.get(seq(2)).unwrap().block_table().to_vec();
    assert_eq!(sa[..6], sbt[..6]);
    // Both are aborted right away, so the tokens committed here do not matter.
    d.sched.commit(&[1, 2]).unwrap();
    d.sched.abort(1);
    d.sched.abort(2);
    assert_eq!(d.sched.num_used_blocks(), 0);

    // Nothing is running now, but the freed blocks are still cached.
    d.sched.add_request(3, b.clone(), 8, 1);
    d.run_to_completion(100);
    assert_eq!(d.sched.prefix_cache_stats().hits, 96 + 96);
    assert_eq!(
        d.generated[&seq(3)],
        reference_generate(seq(3), &b, 8, false)
    );
}

#[test]
fn an_identical_prompt_still_computes_its_last_token() {
    let mut d = Driver::new(config(64, 16));
    let p = tokens(7, 64);
    d.sched.add_request(1, p.clone(), 4, 1);
    d.run_to_completion(100);
    d.sched.add_request(2, p.clone(), 4, 1);
    let s = d.sched.schedule().scheduled()[0].clone();
    assert_eq!((s.start, s.len, s.sample), (48, 16, true));
    d.sched.commit(&[5]).unwrap();
    d.sched.abort(2);
}

#[test]
fn a_tight_pool_preempts_and_everything_still_completes_with_the_same_tokens() {
    // 12 blocks of 4 tokens; each request needs up to 6 blocks, so at most two fit at once.
    let mut cfg = config(12, 4);
    cfg.max_num_batched_tokens = 32;
    let mut d = Driver::new(cfg);
    let prompts: Vec<Vec<u32>> = (0..6).map(|r| tokens(100 + r, 6 + r as usize)).collect();
    for (r, p) in prompts.iter().enumerate() {
        d.sched.add_request(r as u64, p.clone(), 14, 1);
    }
    d.run_to_completion(1000);
    assert!(
        d.sched.num_preemptions() > 0,
        "the pool was meant to be tight"
    );
    d.assert_same_as_alone(&prompts, 14);
    d.sched.check_invariants().unwrap();
}

/// What the engine loop keeps beside the scheduler's records stays with them: written during
/// steps, kept through a preemption, handed back when the sequence (and, with the last one,
/// its request) leaves.
#[test]
fn records_stay_with_their_sequence_and_leave_with_it() {
    let mut cfg = config(4, 2);
    cfg.max_num_batched_tokens = 64;
    // Request record: a name; sequence record: the tokens it was scheduled for.
    let mut s: Scheduler<&str, usize> = Scheduler::new(cfg).unwrap();
    s.queue_request(1, vec![1, 2, 3], 5, "one", vec![0]);
    s.queue_request(2, vec![4, 5, 6], 5, "two", vec![0, 0]);
    let step = |s: &mut Scheduler<&str, usize>, sampled: &[u32]| {
        s.schedule();
        s.for_each_scheduled_mut(|entry, records| {
            let (_, computed) = records.expect("a scheduled sequence has its records");
            *computed += entry.len;
        });
        s.commit(sampled).unwrap();
    };
    // 1 and 2.0 fit (2 blocks each); 2.1 waits for blocks.
    step(&mut s, &[10, 11]);
    step(&mut s, &[12, 13]);
    // 1 needs a third block: 2.0, the newest, is preempted and keeps its record.
    step(&mut s, &[14]);
    assert_eq!(s.output().preempted(), &[SeqId::new(2, 0)]);
    assert_eq!(s.get(SeqId::new(2, 0)).unwrap().state(), &4);
    let one = s.finish(seq(1)).expect("1 is here");
    assert_eq!(one.state, 3 + 1 + 1, "its prompt, then one token a step");
    assert_eq!(one.request, Some("one"), "its request's only sequence");
    let first = s.finish(SeqId::new(2, 0)).expect("2.0 is here");
    assert_eq!(
        (first.state, first.request),
        (4, None),
        "2.1 is still there"
    );
    let aborted = s.abort(2).expect("2 is here");
    assert_eq!(aborted.state, "two");
    assert_eq!(aborted.sequences, vec![(1, 0)], "2.1 never ran");
    assert!(s.abort(2).is_none());
    s.check_invariants().unwrap();
}

#[test]
fn preemption_takes_the_newest_and_requeues_it_first() {
    let mut cfg = config(4, 2);
    cfg.max_num_batched_tokens = 64;
    let mut s = Scheduler::new(cfg).unwrap();
    s.add_request(1, vec![1, 2, 3], 5, 1);
    s.add_request(2, vec![4, 5, 6], 5, 1);
    s.add_request(3, vec![7], 5, 1);
    // Step 1: both prompts fit (2 blocks each); 3 does not.
    assert_eq!(s.schedule().scheduled().len(), 2);
    s.commit(&[10, 11]).unwrap();
    assert_eq!(s.num_waiting(), 1);
    // Step 2: each sequence now has 4 tokens, 3 computed, all blocks in use: 1 fits in its
    // second block, then 2 too.
    s.schedule();
    s.commit(&[12, 13]).unwrap();
    // Step 3: 1 needs a third block: 2 (newest) is preempted and goes before 3.
    let out = s.schedule();
    assert_eq!(out.preempted(), &[seq(2)]);
    assert_eq!(out.scheduled().len(), 1);
    s.commit(&[14]).unwrap();
    assert_eq!(s.num_preemptions(), 1);
    let two = s.get(seq(2)).unwrap();
    assert_eq!(two.status(), SequenceStatus::Waiting);
    assert_eq!(
        two.tokens(),
        &[4, 5, 6, 11, 13],
        "a preempted sequence keeps its tokens"
    );
    assert_eq!(two.num_preemptions(), 1);
    s.finish(seq(1));
    let out = s.schedule();
    assert_eq!(
        out.scheduled()[0].seq_id,
        seq(2),
        "the preempted sequence is readmitted first"
    );
    assert!(out.scheduled()[0].sample);
}

#[test]
fn long_prompts_prefill_in_chunks_beside_decodes() {
    let mut cfg = config(64, 4);
    cfg.max_num_batched_tokens = 8;
    let mut d = Driver::new(cfg);
    d.sched.add_request(1, vec![1, 2, 3], 10, 1);
    d.step();
    let long = tokens(9, 20);
    d.sched.add_request(2, long.clone(), 3, 1);
    let mut chunks = Vec::new();
    for _ in 0..3 {
        let out = d.sched.schedule();
        assert!(out.num_tokens() <= 8);
        let s = out.scheduled();
        assert_eq!(
            (s[0].seq_id, s[0].len, s[0].sample),
            (seq(1), 1, true),
            "decode goes first"
        );
        chunks.push((s[1].start, s[1].len, s[1].sample));
        let (start, len, num_samples) = (s[1].start, s[1].len, out.num_samples());
        d.sched.fill_step_batch(&mut d.batch);
        let expected: Vec<u32> = (start as u32..(start + len) as u32).collect();
        assert_eq!(
            d.batch.positions[1..],
            expected[..],
            "chunk positions are contiguous"
        );
        assert_eq!(d.batch.logits_indices.len(), num_samples);
        d.execute();
    }
    assert_eq!(
        chunks,
        vec![(0, 7, false), (7, 7, false), (14, 6, true)],
        "(start, len, sample)"
    );
    d.sched.finish(seq(1));
    d.run_to_completion(100);
    assert_eq!(
        d.generated[&seq(2)],
        reference_generate(seq(2), &long, 3, false)
    );
}

#[test]
fn abort_frees_blocks_at_once_even_mid_step() {
    let mut d = Driver::new(config(64, 4));
    d.sched.add_request(1, tokens(1, 10), 20, 1);
    d.sched.add_request(2, tokens(2, 10), 20, 1);
    d.step();
    assert_eq!(d.sched.num_used_blocks(), 6);
    d.sched.add_request(3, tokens(3, 10), 20, 1);
    // Waiting: removed without touching the pool.
    assert_eq!(aborted(&mut d.sched, 3), 1);
    assert_eq!(d.sched.num_used_blocks(), 6);
    // Running, between fill_step_batch and commit: blocks back now, its row ignored at commit.
    d.sched.schedule();
    d.sched.fill_step_batch(&mut d.batch);
    let logits = d.model.forward(&d.batch);
    let sampled = [
        common::sample(logits[0], seq(1)),
        common::sample(logits[1], seq(2)),
    ];
    assert_eq!(aborted(&mut d.sched, 1), 1);
    assert_eq!(d.sched.num_used_blocks(), 3);
    d.sched.commit(&sampled).unwrap();
    d.generated.get_mut(&seq(2)).unwrap().push(sampled[1]);
    assert_eq!(
        d.sched.get(seq(2)).unwrap().generated().last(),
        Some(&sampled[1])
    );
    assert_eq!(aborted(&mut d.sched, 1), 0);
    assert!(d.sched.finish(seq(1)).is_none());
    d.sched.check_invariants().unwrap();
    d.run_to_completion(100);
    assert_eq!(
        d.generated[&seq(2)],
        reference_generate(seq(2), &tokens(2, 10), 20, false)
    );
}

#[test]
fn n_sequences_share_the_prompt_blocks() {
    let mut d = Driver::new(config(64, 16));
    let prompt = tokens(5, 40);
    d.sched.add_request(1, prompt.clone(), 6, 4);
    let out = d.sched.schedule();
    assert_eq!(
        out.scheduled().len(),
        1,
        "siblings wait for sequence 0's prompt"
    );
    d.execute();
    let out = d.sched.schedule();
    let s = out.scheduled();
    assert_eq!(s.len(), 4);
    for sib in &s[1..] {
        assert_eq!(
            (sib.start, sib.len),
            (32, 8),
            "each sibling recomputes only the partial tail"
        );
    }
    assert_eq!(
        d.sched.prefix_cache_stats(),
        PrefixCacheStats {
            queries: 40 + 3 * 40,
            hits: 3 * 32
        }
    );
    // Sequence 0: 3 blocks; each sibling: the 2 shared ones plus its own tail block.
    assert_eq!(d.sched.num_used_blocks(), 3 + 3);
    let t0 = d.sched.get(seq(1)).unwrap().block_table().to_vec();
    for index in 1..4 {
        let t = d
            .sched
            .get(SeqId::new(1, index))
            .unwrap()
            .block_table()
            .to_vec();
        assert_eq!(t[..2], t0[..2]);
        assert_ne!(t[2], t0[2]);
    }
    d.execute();
    d.run_to_completion(100);
    for index in 0..4 {
        let id = SeqId::new(1, index);
        assert_eq!(d.generated[&id], reference_generate(id, &prompt, 6, false));
    }
}

#[test]
fn the_sequence_cap_is_kept_and_admission_is_first_come_first_served() {
    let mut cfg = config(256, 4);
    cfg.max_num_seqs = 3;
    let mut d = Driver::new(cfg);
    for r in 0..8 {
        d.sched.add_request(r, tokens(r, 5), 3, 1);
    }
    let mut admitted = Vec::new();
    while d.sched.has_unfinished() {
        let out = d.sched.schedule();
        assert!(out.scheduled().len() <= 3);
        for s in out.scheduled() {
            if s.start == 0 {
                admitted.push(s.seq_id.request);
            }
        }
        d.execute();
        assert!(d.sched.num_running() <= 3);
    }
    assert_eq!(admitted, (0..8).collect::<Vec<_>>());
}

/// Six prompts sharing a 40-token prefix on a recurrent pool of `states` states.
fn recurrent_run(states: usize) -> (Driver, Vec<(u64, usize)>, Vec<Vec<u32>>) {
    let mut cfg = config(256, 4);
    cfg.kv_groups = vec![KvGroupSpec::Recurrent(RecurrentPool {
        num_states: states,
        num_checkpoints: 0,
        rollback: false,
    })];
    let running = RecurrentPool::split(states, cfg.max_num_seqs, false).running();
    let mut d = Driver::new(cfg);
    let shared = tokens(9, 40);
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|r| {
            let mut p = shared.clone();
            p.extend(tokens(r, 3));
            p
        })
        .collect();
    for (r, p) in prompts.iter().enumerate() {
        d.sched.add_request(r as u64, p.clone(), 6, 1);
    }
    // Each request's first scheduled position.
    let mut admitted: Vec<(u64, usize)> = Vec::new();
    while d.sched.has_unfinished() {
        let out = d.sched.schedule();
        for s in out.scheduled() {
            if !admitted.iter().any(|a| a.0 == s.seq_id.request) {
                admitted.push((s.seq_id.request, s.start));
            }
        }
        d.execute();
        assert!(d.sched.num_running() <= running);
        assert!(d.sched.block_pools().num_used_states(0).unwrap() <= running);
        d.sched.check_invariants().unwrap();
    }
    assert_eq!(
        admitted.iter().map(|a| a.0).collect::<Vec<_>>(),
        (0..6).collect::<Vec<_>>(),
        "first come, first served"
    );
    assert_eq!(d.sched.block_pools().num_used_states(0), Some(0));
    d.assert_same_as_alone(&prompts, 6);
    (d, admitted, prompts)
}

#[test]
fn a_recurrent_group_without_checkpoint_states_serves_no_cached_prefix() {
    // One state: one running sequence, no checkpoint.
    let (d, admitted, _) = recurrent_run(1);
    assert!(admitted.iter().all(|a| a.1 == 0), "{admitted:?}");
    assert_eq!(d.sched.prefix_cache_stats().hits, 0);
}

#[test]
fn a_recurrent_group_serves_a_shared_prefix_from_its_checkpoint() {
    // Four states for at most 64 sequences: two running, two checkpoints. The first prompt
    // is computed from its first token and saves its state at its last block boundary (40);
    // every later one starts there, with the tokens each gets alone.
    let (d, admitted, _) = recurrent_run(4);
    assert_eq!(admitted[0], (0, 0));
    assert!(admitted[2..].iter().all(|a| a.1 == 40), "{admitted:?}");
    assert_eq!(d.sched.block_pools().num_checkpoints(0), Some(1));
    assert!(d.sched.prefix_cache_stats().hits >= 4 * 40);
}

#[test]
fn many_requests_at_once_give_the_same_tokens_as_each_alone() {
    let mut cfg = config(128, 16);
    cfg.max_num_batched_tokens = 64;
    cfg.max_num_seqs = 16;
    let mut d = Driver::new(cfg);
    d.eos = true;
    let prompts: Vec<Vec<u32>> = (0..32)
        .map(|r| tokens(1000 + r, 1 + (r as usize * 37) % 150))
        .collect();
    for (r, p) in prompts.iter().enumerate() {
        d.sched.add_request(r as u64, p.clone(), 24, 1);
    }
    d.run_to_completion(10_000);
    assert_eq!(d.finished.len(), 32);
    d.assert_same_as_alone(&prompts, 24);
}

#[test]
fn commit_checks_its_input() {
    let mut s = Scheduler::new(config(16, 4)).unwrap();
    assert_eq!(s.commit(&[]), Err(SchedulerError::NothingScheduled));
    s.add_request(1, vec![1, 2], 4, 1);
    s.schedule();
    assert_eq!(
        s.commit(&[]),
        Err(SchedulerError::SampleCountMismatch {
            got: 0,
            expected: 1
        })
    );
    s.commit(&[3]).unwrap();
    assert_eq!(s.commit(&[3]), Err(SchedulerError::NothingScheduled));
    assert!(<Scheduler>::new(SchedulerConfig {
        max_num_batched_tokens: 0,
        ..config(16, 4)
    })
    .is_err());
}

fn adapter(id: u64) -> sluice_engine::AdapterKey {
    sluice_engine::AdapterKey {
        id,
        name: format!("adapter-{id}").into(),
    }
}

/// One adapter slot, three requests: adapter 1, adapter 2, the base. Adapter 2 waits (counted
/// in the queue) while adapter 1's sequence runs, the base request goes past it, and each
/// token row names its sequence's slot.
#[test]
fn an_adapter_waits_for_a_free_slot_and_never_evicts_a_running_one() {
    let mut d = Driver::new(SchedulerConfig {
        max_loras: 1,
        ..config(64, 16)
    });
    d.sched.add_request(1, tokens(1, 20), 6, 1);
    d.sched.assign_adapter(1, adapter(1));
    d.sched.add_request(2, tokens(2, 20), 6, 1);
    d.sched.assign_adapter(2, adapter(2));
    d.sched.add_request(3, tokens(3, 20), 6, 1);
    let out = d.sched.schedule();
    let ids: Vec<SeqId> = out.scheduled().iter().map(|s| s.seq_id).collect();
    assert_eq!(
        ids,
        [seq(1), seq(3)],
        "adapter 2 waits, the base goes past it"
    );
    assert_eq!(out.adapter_loads(), [(1, seq(1))]);
    d.execute();
    assert_eq!(
        d.batch.lora_slots,
        [vec![1u16; 20], vec![0u16; 20]].concat()
    );
    assert_eq!(d.sched.num_waiting(), 1);
    let (mut running, mut waiting) = (Vec::new(), Vec::new());
    d.sched.adapters_in_use(&mut running, &mut waiting);
    assert_eq!((&*running[0], &*waiting[0]), ("adapter-1", "adapter-2"));
    assert_eq!((running.len(), waiting.len()), (1, 1));
    // While adapter 1 runs, its slot is never handed to adapter 2.
    while d.sched.get(seq(1)).is_some() {
        let out = d.sched.schedule();
        assert!(out.scheduled().iter().all(|s| s.seq_id != seq(2)));
        assert!(out.adapter_loads().is_empty());
        d.execute();
    }
    let out = d.sched.schedule();
    assert_eq!(out.adapter_loads(), [(1, seq(2))]);
    d.execute();
    assert_eq!(d.batch.lora_slots[..20], [1u16; 20]);
    d.run_to_completion(100);
    assert_eq!(
        d.sched.adapter_slots().collect::<Vec<_>>(),
        [(1, 2, 0)],
        "the slot keeps adapter 2, used by no one"
    );
}

/// The same prompt under the base model, adapter 1 and adapter 2: no prefix is shared
/// between them, and each finds its own the second time.
#[test]
fn the_prefix_cache_keys_blocks_by_adapter() {
    let mut d = Driver::new(SchedulerConfig {
        max_loras: 2,
        ..config(64, 16)
    });
    let prompt = tokens(9, 80);
    let mut id = 0;
    let mut run = |d: &mut Driver, lora: Option<u64>| {
        id += 1;
        d.sched.add_request(id, prompt.clone(), 2, 1);
        if let Some(lora) = lora {
            d.sched.assign_adapter(id, adapter(lora));
        }
        let start = d.sched.schedule().scheduled()[0].start;
        d.execute();
        d.run_to_completion(50);
        start
    };
    assert_eq!(run(&mut d, None), 0);
    assert_eq!(
        run(&mut d, Some(1)),
        0,
        "the base's blocks are not adapter 1's"
    );
    assert_eq!(run(&mut d, Some(2)), 0, "nor adapter 1's adapter 2's");
    assert_eq!(run(&mut d, Some(1)), 64);
    assert_eq!(run(&mut d, None), 64);
    assert_eq!(run(&mut d, Some(2)), 64);
}

/// A preempted sequence gives its adapter slot back: another adapter may take it while the
/// sequence waits, and the sequence gets a slot again when it is readmitted.
#[test]
fn preemption_frees_the_adapter_slot() {
    let mut d = Driver::new(SchedulerConfig {
        max_loras: 1,
        max_num_batched_tokens: 64,
        ..config(6, 16)
    });
    d.sched.add_request(1, tokens(1, 40), 40, 1);
    d.sched.assign_adapter(1, adapter(1));
    d.sched.add_request(2, tokens(2, 8), 30, 1);
    d.run_to_completion(400);
    assert!(
        d.sched.num_preemptions() > 0,
        "the pool is too small for both"
    );
    assert_eq!(d.generated[&seq(1)].len(), 40);
    assert_eq!(d.generated[&seq(2)].len(), 30);
}

#[test]
fn every_group_gets_its_tables_in_the_step_batch() {
    // Two windows and a recurrent group between them: each sequence of a step has a table in
    // each paged group, beside its full one, that covers its window, and a state of its own
    // in the recurrent one.
    let (bs, windows) = (4, [6, 13]);
    let mut cfg = config(256, bs);
    let window = |window| {
        KvGroupSpec::SlidingWindow(WindowPool {
            num_blocks: 160,
            window,
        })
    };
    cfg.kv_groups = vec![
        window(windows[0]),
        KvGroupSpec::Recurrent(RecurrentPool {
            num_states: 3,
            num_checkpoints: 0,
            rollback: false,
        }),
        window(windows[1]),
    ];
    let mut d = Driver::new(cfg);
    let prompts: Vec<Vec<u32>> = (0..5).map(|r| tokens(r, 20 + 7 * r as usize)).collect();
    for (r, p) in prompts.iter().enumerate() {
        d.sched.add_request(r as u64, p.clone(), 9, 1);
    }
    while d.sched.has_unfinished() {
        d.sched.schedule();
        d.sched.fill_step_batch(&mut d.batch);
        let b = &d.batch;
        assert_eq!(b.groups.len(), 3);
        let GroupTables::Recurrent { states, .. } = &b.groups[1] else {
            panic!("group 1 is recurrent");
        };
        assert_eq!(states.len(), b.sequences.len());
        let mut distinct = states.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), states.len(), "one state a sequence");
        assert!(states.iter().all(|&s| s < 3));
        for (g, window) in [(0, windows[0]), (2, windows[1])] {
            let (slots, tables) = b.tables(Some(g));
            assert_eq!(slots.len(), b.num_tokens());
            assert_eq!(tables.len(), b.block_tables.len());
            for seq in &b.sequences {
                let table = seq.block_table(tables);
                let first = seq.context_len - seq.query_len;
                // The blocks the first query's window reaches are live in this group's pool.
                let live = &table[(first + 1).saturating_sub(window) / bs..];
                assert!(
                    live.iter().all(|&blk| (blk as usize) < 160),
                    "group {g}: {live:?}"
                );
                let rows = seq.query_start..seq.query_start + seq.query_len;
                for (&slot, &pos) in slots[rows.clone()].iter().zip(&b.positions[rows]) {
                    let pos = pos as usize;
                    let expected = table[pos / bs] * bs as u32 + (pos % bs) as u32;
                    assert_eq!(slot, expected, "group {g}, position {pos}");
                }
            }
        }
        d.execute();
        assert!(d.steps < 500, "not done");
    }
    d.assert_same_as_alone(&prompts, 9);
}
