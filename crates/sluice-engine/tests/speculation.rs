//! Speculative decoding in the scheduler: sequences that verify n-gram drafts generate exactly
//! the tokens plain decoding does (the oracle runs each alone, no cache, no drafts), whatever
//! the crowd, the budget, the block size or the pool; drafts are kept and taken back at
//! commit without leaving a wrong K/V slot, a wrong prefix-cache block or a leaked block.
//! With recurrent layers a rejected draft rolls the state back to its value before the drafts
//! (the mock checks every state against its sequence's tokens at every token).

mod common;

use common::{next_token_periodic, reference_generate_with, tokens, Driver};
use proptest::prelude::*;
use sluice_engine::{
    KvGroupSpec, RecurrentPool, Scheduler, SchedulerConfig, SeqId, SpeculationConfig, WindowPool,
};
use sluice_model::GroupTables;

fn config(num_blocks: usize, block_size: usize, budget: usize, k: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 16,
        max_num_batched_tokens: budget,
        block_size,
        num_blocks,
        max_model_len: 1024,
        speculation: Some(SpeculationConfig {
            max_running: 16,
            ..SpeculationConfig::ngram(k)
        }),
        kv_groups: Vec::new(),
        max_loras: 0,
    }
}

/// A prompt that already shows the periodic sampler's cycle, so drafts start early.
fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut p = tokens(seed, len / 2);
    let mut t = p.last().copied().unwrap_or(1);
    while p.len() < len {
        t = (t * 7 + 3) % 50;
        p.push(t);
    }
    p
}

/// Runs `prompts` (each a request of one sequence allowed to speculate) and checks every
/// sequence against the oracle; returns the steps taken.
fn run(config: SchedulerConfig, prompts: &[Vec<u32>], max_tokens: usize, eos: bool) -> usize {
    let mut d = Driver::new(config);
    d.periodic = true;
    d.eos = eos;
    for (r, p) in prompts.iter().enumerate() {
        d.sched.add_request(r as u64, p.clone(), max_tokens, 1);
        d.sched.allow_speculation(r as u64);
    }
    d.run_to_completion(10_000);
    for (r, p) in prompts.iter().enumerate() {
        let id = SeqId::new(r as u64, 0);
        let want = reference_generate_with(next_token_periodic, id, p, max_tokens, eos);
        assert_eq!(d.generated[&id], want, "request {r}");
    }
    d.steps
}

#[test]
fn drafts_come_true_and_change_no_token() {
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(i, 40)).collect();
    let plain = {
        let mut c = config(256, 4, 256, 4);
        c.speculation = None;
        run(c, &prompts, 64, false)
    };
    let speculative = run(config(256, 4, 256, 4), &prompts, 64, false);
    // The periodic sampler repeats a 50-token cycle four rows in five: drafts of up to 4
    // tokens come true often enough to save steps, and each kept draft is a step saved.
    assert!(
        speculative < plain,
        "speculation took {speculative} steps, plain decoding {plain}"
    );
}

fn recurrent(num_states: usize) -> KvGroupSpec {
    KvGroupSpec::Recurrent(RecurrentPool {
        num_states,
        num_checkpoints: 0,
        rollback: false,
    })
}

#[test]
fn a_rejected_draft_rolls_a_recurrent_state_back_and_changes_no_token() {
    // Distinct prompts (no prefix hit): every restore a step makes is a rollback.
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(20 + i, 40)).collect();
    let mut c = config(256, 4, 256, 4);
    c.kv_groups = vec![recurrent(8)];
    let mut d = common::Driver::new(c);
    d.periodic = true;
    for (r, p) in prompts.iter().enumerate() {
        d.sched.add_request(r as u64, p.clone(), 64, 1);
        d.sched.allow_speculation(r as u64);
    }
    let (mut rollbacks, mut drafts) = (0, 0);
    while d.sched.has_unfinished() {
        let out = d.sched.schedule();
        drafts += out.scheduled().iter().map(|s| s.draft).sum::<usize>();
        d.sched.fill_step_batch(&mut d.batch);
        let GroupTables::Recurrent { restore, save, .. } = &d.batch.groups[0] else {
            panic!("group 0 is recurrent");
        };
        rollbacks += restore.iter().flatten().count();
        // Every sequence with drafts saves its state before them (the others save only a
        // prompt's prefix checkpoint).
        for (s, save) in d.sched.output().scheduled().iter().zip(save) {
            if s.draft > 0 {
                assert_eq!(save.map(|(_, n)| n as usize), Some(s.len - s.draft));
            }
        }
        d.execute();
        assert!(d.steps < 1000, "not done");
    }
    assert!(
        drafts > 0 && rollbacks > 0,
        "{drafts} drafts, {rollbacks} rollbacks"
    );
    for (r, p) in prompts.iter().enumerate() {
        let id = SeqId::new(r as u64, 0);
        let want = reference_generate_with(next_token_periodic, id, p, 64, false);
        assert_eq!(d.generated[&id], want, "request {r}");
    }
    assert_eq!(
        d.sched.block_pools().num_used_states(0),
        Some(0),
        "a state leaked"
    );
}

#[test]
fn speculation_on_one_recurrent_state_is_refused() {
    let mut c = config(256, 4, 256, 4);
    c.kv_groups = vec![recurrent(1)];
    let err = match Scheduler::<(), ()>::new(c) {
        Ok(_) => panic!("speculation on one recurrent state was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("at least 2 states"), "{err}");
}

#[test]
fn drafts_never_preempt_and_respect_budget_and_max_tokens() {
    // 12 blocks of 4 for three sequences of up to 16 + 24 tokens: the pool is tight, drafts
    // only use free blocks; a budget of 3 tokens caps drafts at 2; max_tokens caps the rest.
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(10 + i, 16)).collect();
    run(config(12, 4, 3, 8), &prompts, 24, true);
    run(config(40, 1, 64, 8), &prompts, 5, false);
}

#[test]
fn a_request_not_allowed_to_speculate_drafts_nothing() {
    let mut d = Driver::new(config(256, 4, 256, 4));
    d.periodic = true;
    d.sched.add_request(0, prompt(3, 40), 32, 1);
    while d.sched.has_unfinished() {
        let out = d.sched.schedule();
        assert!(out.scheduled().iter().all(|s| s.draft == 0));
        d.execute();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn speculation_generates_what_plain_decoding_does(
        k in 1usize..=8,
        block_size in prop_oneof![Just(1usize), Just(2), Just(4), Just(16)],
        spare_blocks in 0usize..40,
        budget in 1usize..=64,
        max_tokens in 1usize..48,
        eos in any::<bool>(),
        lens in proptest::collection::vec(1usize..40, 1..6),
        window in proptest::option::of((1usize..=24, 0usize..8)),
        states in proptest::option::of(2usize..10),
    ) {
        let prompts: Vec<Vec<u32>> =
            lens.iter().enumerate().map(|(i, &len)| prompt(100 + i as u64, len)).collect();
        // Every request fits the pool alone (the engine's admission guarantees it).
        let longest = lens.iter().max().unwrap() + max_tokens;
        let num_blocks = longest.div_ceil(block_size) + spare_blocks;
        let mut c = config(num_blocks, block_size, budget, k);
        // A sliding-window pool: drafts taken back must leave each window's K/V in place
        // (the model checks it at every read), from the least one sequence needs up.
        c.kv_groups = window
            .map(|(window, spare)| {
                KvGroupSpec::SlidingWindow(WindowPool {
                    num_blocks: WindowPool::blocks_for_one(window, budget, block_size)
                        .min(num_blocks)
                        + spare,
                    window,
                })
            })
            .into_iter()
            .collect();
        // A recurrent group (two states a running sequence: fewer running than prompts
        // where states are few): a rejected draft rolls its state back.
        c.kv_groups.extend(states.map(recurrent));
        run(c, &prompts, max_tokens, eos);
    }
}

/// A sequence whose verified drafts bring it to exactly `max_tokens` is marked as having
/// reached its length in that very commit (the engine ends it there; unmarked, it would never
/// be scheduled again nor finished). Drafts count as generated only once they are kept.
#[test]
fn drafts_that_reach_max_tokens_mark_the_length_reached() {
    let mut s: Scheduler = Scheduler::new(config(256, 4, 256, 4)).unwrap();
    // A prompt that repeats, so n-gram lookup drafts its continuation, and "sampling" that
    // continues the period, so every draft comes true.
    let prompt: Vec<u32> = (0..40).map(|i| i % 5).collect();
    s.add_request(1, prompt, 11, 1);
    s.allow_speculation(1);
    let id = SeqId::new(1, 0);
    let mut drafted = 0;
    for _ in 0..50 {
        let rows: Vec<u32> = s
            .schedule()
            .sampling()
            .flat_map(|e| {
                let known = e.start + e.len - e.draft;
                (0..e.num_rows()).map(move |i| ((known + i) % 5) as u32)
            })
            .collect();
        s.commit(&rows).unwrap();
        let e = s.output().scheduled()[0].clone();
        drafted += e.draft;
        let seq = s.get(id).unwrap();
        assert_eq!(
            e.reached_length,
            seq.num_generated() >= seq.max_tokens(),
            "generated {} of {} (drafts {})",
            seq.num_generated(),
            seq.max_tokens(),
            e.draft
        );
        if e.reached_length {
            assert!(drafted > 0, "the case needs drafts");
            return;
        }
    }
    panic!("never reached max_tokens");
}
