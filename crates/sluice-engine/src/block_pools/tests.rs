//! The pools' unit tests: groups changing together, states, checkpoints and rollback.

use proptest::prelude::*;

use super::*;

const BS: usize = 4;

fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|t| t * 7 % 50).collect()
}

fn recurrent(num_states: usize) -> KvGroupSpec {
    KvGroupSpec::Recurrent(RecurrentPool {
        num_states,
        num_checkpoints: 0,
        rollback: false,
    })
}

fn window(num_blocks: usize, window: usize) -> KvGroupSpec {
    KvGroupSpec::SlidingWindow(WindowPool { num_blocks, window })
}

#[test]
fn a_recurrent_group_gives_each_sequence_one_state_whatever_its_length() {
    let mut pools = BlockPools::new(64, BS, &[recurrent(2)]);
    let mut seqs: Vec<SeqBlocks> = (0..3).map(|_| SeqBlocks::default()).collect();
    assert!(pools.allocate(&mut seqs[0], 5));
    assert!(
        pools.allocate(&mut seqs[0], 40),
        "growing keeps the one state"
    );
    assert!(pools.allocate(&mut seqs[1], 1));
    assert_eq!(pools.num_used_states(0), Some(2));
    assert_ne!(seqs[0].state(0), seqs[1].state(0));
    // No state left: the third sequence gets nothing, in no pool.
    let used = pools.num_used_blocks();
    assert!(!pools.allocate(&mut seqs[2], 1));
    assert_eq!((pools.num_used_blocks(), seqs[2].state(0)), (used, None));
    assert!(seqs[2].is_empty());
    pools.check_consistency(seqs.iter()).unwrap();
    // Freed (finished or preempted), its state goes to the next.
    pools.free(&mut seqs[0]);
    assert_eq!(seqs[0].state(0), None);
    assert!(pools.allocate(&mut seqs[2], 1));
    assert_eq!(pools.num_used_states(0), Some(2));
    pools.check_consistency(seqs.iter()).unwrap();
}

/// A sequence of `t` admitted through the prefix cache, every token computed.
fn computed(pools: &mut BlockPools, t: &[u32]) -> SeqBlocks {
    let mut seq = SeqBlocks::default();
    let p = pools.find_cached_prefix(&mut seq, t);
    assert!(pools.allocate_with_prefix(&mut seq, &p, t.len()));
    pools.register_computed(&mut seq, t, t.len());
    seq
}

#[test]
fn a_model_with_recurrent_layers_serves_no_cached_prefix() {
    let t = tokens(30);
    for groups in [vec![recurrent(4)], vec![window(32, 6), recurrent(4)]] {
        let mut pools = BlockPools::new(64, BS, &groups);
        let first = computed(&mut pools, &t);
        let mut second = SeqBlocks::default();
        let p = pools.find_cached_prefix(&mut second, &t);
        assert_eq!(p.num_tokens(BS), 0, "{groups:?}");
        assert!(pools.allocate_with_prefix(&mut second, &p, t.len()));
        pools
            .check_consistency([&first, &second].into_iter())
            .unwrap();
    }
    // The same prompt without the recurrent group: its full blocks are reused.
    let mut pools = BlockPools::new(64, BS, &[window(32, 6)]);
    computed(&mut pools, &t);
    let mut second = SeqBlocks::default();
    assert_eq!(pools.find_cached_prefix(&mut second, &t).num_tokens(BS), 28);
}

fn with_checkpoints(running: usize, checkpoints: usize) -> KvGroupSpec {
    KvGroupSpec::Recurrent(RecurrentPool {
        num_states: running + checkpoints,
        num_checkpoints: checkpoints,
        rollback: false,
    })
}

/// [`computed`] as the scheduler runs it for a model with checkpoints: a checkpoint
/// planned at admission, saved by the step (which must ask for it at `save_at`).
fn computed_saving(pools: &mut BlockPools, t: &[u32], save_at: Option<usize>) -> SeqBlocks {
    let mut seq = SeqBlocks::default();
    let p = pools.find_cached_prefix(&mut seq, t);
    let start = p.num_tokens(BS);
    assert!(pools.allocate_with_prefix(&mut seq, &p, t.len()));
    pools.plan_checkpoint(&mut seq, t, start);
    let step = pools.checkpoint_step(&seq, start, t.len() - start, 0);
    assert_eq!(step.save.map(|(_, n)| start + n), save_at);
    pools.register_computed(&mut seq, t, t.len());
    seq
}

#[test]
fn a_checkpoint_serves_the_prefix_it_saved_and_nothing_past_it() {
    let mut pools = BlockPools::new(64, BS, &[with_checkpoints(4, 2)]);
    let t = tokens(30);
    // The first run saves the state after its last block boundary a lookup can reach.
    let first = computed_saving(&mut pools, &t, Some(28));
    // The same prompt: served up to that checkpoint, the state restored from it; the
    // step that computes the rest starts from it and saves nothing (kept already).
    let mut again = SeqBlocks::default();
    let p = pools.find_cached_prefix(&mut again, &t);
    assert_eq!(p.num_tokens(BS), 28);
    assert!(pools.allocate_with_prefix(&mut again, &p, t.len()));
    pools.plan_checkpoint(&mut again, &t, 28);
    let step = pools.checkpoint_step(&again, 28, 2, 0);
    assert!(step.restore.is_some() && step.save.is_none(), "{step:?}");
    pools.register_computed(&mut again, &t, t.len());
    assert_eq!(
        pools.checkpoint_step(&again, 30, 1, 0),
        StateStep::default()
    );
    // A longer prompt sharing it: served to the checkpoint, and it plans its own further.
    let longer: Vec<u32> = t
        .iter()
        .copied()
        .chain(tokens(50)[30..].iter().copied())
        .collect();
    let mut third = SeqBlocks::default();
    let p = pools.find_cached_prefix(&mut third, &longer);
    assert_eq!(p.num_tokens(BS), 28);
    assert!(pools.allocate_with_prefix(&mut third, &p, longer.len()));
    pools.plan_checkpoint(&mut third, &longer, 28);
    assert_eq!(
        pools.checkpoint_step(&third, 28, 22, 0).save.map(|s| s.1),
        Some(48 - 28)
    );
    pools
        .check_consistency([&first, &again, &third].into_iter())
        .unwrap();
    // A prompt that only shares blocks before the checkpoint's gets nothing: no state is
    // kept where it parts.
    let mut other = SeqBlocks::default();
    let parted: Vec<u32> = t[..20].iter().copied().chain([999; 10]).collect();
    assert_eq!(
        pools.find_cached_prefix(&mut other, &parted).num_tokens(BS),
        0
    );
}

#[test]
fn a_prefix_that_a_window_pool_cuts_short_of_a_checkpoint_has_no_state_and_is_not_served() {
    // A checkpoint at 28 of a 30-token prompt, then prompts that share some of its blocks
    // or none and evict some of the window pool's. Where the window pool alone would then
    // serve part of the prompt, short of the checkpoint's 7 blocks, no state of that length
    // is kept: the prefix falls to 0, never to the window pool's length with the state
    // left as it was.
    let t = tokens(30);
    let mut cut_short = 0;
    for shared in [0, 8, 16, 24] {
        // At most the window pool's 12 blocks in all.
        for filler in 1..=48 - shared {
            let mut pools = BlockPools::new(64, BS, &[window(12, 6), with_checkpoints(2, 2)]);
            let mut first = computed_saving(&mut pools, &t, Some(28));
            pools.free(&mut first);
            let f: Vec<u32> = t[..shared]
                .iter()
                .copied()
                .chain(tokens(filler).iter().map(|x| x + 500))
                .collect();
            let mut other = computed(&mut pools, &f);
            pools.free(&mut other);
            let Group::Window { blocks, tokens: w } = &mut pools.groups[0] else {
                panic!("group 0 is the window pool");
            };
            let window_alone = blocks
                .find_cached_window(&mut BlockTable::new(), &t, *w, usize::MAX)
                .num_tokens(BS);
            let mut probe = SeqBlocks::default();
            let p = pools.find_cached_prefix(&mut probe, &t);
            let served = p.num_tokens(BS);
            if (1..28).contains(&window_alone) {
                cut_short += 1;
                assert_eq!(served, 0, "shared {shared}, filler {filler}: {p:?}");
            } else {
                assert!(
                    served == 0 || (served == 28 && p.restore.is_some()),
                    "shared {shared}, filler {filler}: {p:?}"
                );
            }
        }
    }
    assert!(
        cut_short > 0,
        "no prompt cut the window pool's prefix short"
    );
}

#[test]
fn checkpoints_are_replaced_least_recently_used_and_freed_with_their_sequence() {
    let mut pools = BlockPools::new(64, BS, &[with_checkpoints(2, 1)]);
    let (a, b) = (
        tokens(30),
        tokens(31).iter().map(|t| t + 1).collect::<Vec<u32>>(),
    );
    let mut sa = computed_saving(&mut pools, &a, Some(28));
    pools.free(&mut sa);
    // b's checkpoint takes the only checkpoint state: a's prefix is no longer served.
    let mut sb = computed_saving(&mut pools, &b, Some(28));
    pools.free(&mut sb);
    let mut probe = SeqBlocks::default();
    assert_eq!(pools.find_cached_prefix(&mut probe, &a).num_tokens(BS), 0);
    let mut probe = SeqBlocks::default();
    assert_eq!(pools.find_cached_prefix(&mut probe, &b).num_tokens(BS), 28);
    // A sequence freed before its step saved gives its planned checkpoint state back.
    let c: Vec<u32> = tokens(30).iter().map(|t| t + 3).collect();
    let mut sc = SeqBlocks::default();
    let p = pools.find_cached_prefix(&mut sc, &c);
    assert!(pools.allocate_with_prefix(&mut sc, &p, c.len()));
    pools.plan_checkpoint(&mut sc, &c, 0);
    pools.free(&mut sc);
    pools.check_consistency([&sc].into_iter()).unwrap();
    assert_eq!(pools.num_used_states(0), Some(0));
}

#[derive(Debug, Clone)]
enum Op {
    Admit {
        seq: usize,
        len: usize,
    },
    Grow {
        seq: usize,
        extra: usize,
    },
    Compute {
        seq: usize,
    },
    /// A rejected draft's rollback (with `rollback` states).
    RollBack {
        seq: usize,
    },
    Free {
        seq: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..6usize, 1..40usize).prop_map(|(seq, len)| Op::Admit { seq, len }),
        (0..6usize, 1..9usize).prop_map(|(seq, extra)| Op::Grow { seq, extra }),
        (0..6usize).prop_map(|seq| Op::Compute { seq }),
        (0..6usize).prop_map(|seq| Op::RollBack { seq }),
        (0..6usize).prop_map(|seq| Op::Free { seq }),
    ]
}

proptest! {
    /// Any mix of admissions (through the prefix cache), growth, computed tokens and
    /// frees, over a full pool, a window pool and a recurrent pool with fewer states than
    /// sequences: every pool stays consistent after every operation, an allocation that
    /// fails changes no pool, and a sequence holds a state exactly while it holds blocks.
    #[test]
    fn every_group_changes_together(
        ops in proptest::collection::vec(op(), 1..80),
        states in 1..5usize,
        checkpoints in 0..3usize,
        window_tokens in 1..12usize,
        rollback in any::<bool>(),
    ) {
        let running = if rollback { 2 * states } else { states };
        let groups = [
            window(24, window_tokens),
            KvGroupSpec::Recurrent(RecurrentPool {
                num_states: running + checkpoints,
                num_checkpoints: checkpoints,
                rollback,
            }),
        ];
        let mut pools = BlockPools::new(40, BS, &groups);
        let mut seqs: Vec<(SeqBlocks, Vec<u32>, usize)> =
            (0..6).map(|i| (SeqBlocks::default(), tokens(60 + i), 0)).collect();
        for op in ops {
            let before = (
                pools.num_used_blocks(),
                pools.window().unwrap().num_used_blocks(),
                pools.num_used_states(1),
            );
            let (ok, seq) = match op {
                Op::Admit { seq, len } if seqs[seq].0.is_empty() => {
                    let (blocks, toks, computed) = &mut seqs[seq];
                    let p = pools.find_cached_prefix(blocks, &toks[..len]);
                    let ok = pools.allocate_with_prefix(blocks, &p, len);
                    if ok {
                        *computed = p.num_tokens(BS);
                        pools.plan_checkpoint(blocks, &toks[..len], *computed);
                    }
                    (Some(ok), seq)
                }
                Op::Grow { seq, extra } if !seqs[seq].0.is_empty() => {
                    let (blocks, _, _) = &mut seqs[seq];
                    let len = blocks.len() * BS + extra;
                    (Some(pools.allocate(blocks, len)), seq)
                }
                Op::Compute { seq } if !seqs[seq].0.is_empty() => {
                    let (blocks, toks, computed) = &mut seqs[seq];
                    let upto = (blocks.len() * BS).min(toks.len());
                    pools.register_computed(blocks, toks, upto.max(*computed));
                    *computed = upto.max(*computed);
                    (None, seq)
                }
                Op::RollBack { seq } if !seqs[seq].0.is_empty() => {
                    let (blocks, _, _) = &mut seqs[seq];
                    prop_assert_eq!(pools.roll_back(blocks), rollback);
                    (None, seq)
                }
                Op::Free { seq } => {
                    pools.free(&mut seqs[seq].0);
                    seqs[seq].2 = 0;
                    (None, seq)
                }
                _ => continue,
            };
            if ok == Some(false) {
                let after = (
                    pools.num_used_blocks(),
                    pools.window().unwrap().num_used_blocks(),
                    pools.num_used_states(1),
                );
                prop_assert_eq!(before, after, "a failed allocation changed a pool");
            }
            let s = &seqs[seq].0;
            prop_assert_eq!(s.state(1).is_some(), !s.is_empty());
            pools
                .check_consistency(seqs.iter().map(|(b, _, _)| b))
                .map_err(TestCaseError::fail)?;
        }
        // Every sequence gone: no state leaked (checkpoints stay, each in its own state,
        // which check_consistency counts).
        for (blocks, _, _) in &mut seqs {
            pools.free(blocks);
        }
        prop_assert_eq!(pools.num_used_states(1), Some(0));
        pools
            .check_consistency(seqs.iter().map(|(b, _, _)| b))
            .map_err(TestCaseError::fail)?;
    }
}
