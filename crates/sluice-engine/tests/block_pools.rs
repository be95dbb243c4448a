//! The block pools' recurrent group with speculation's rollback state: held beside a
//! sequence's own state, saved into by a step with drafts, restored after a rejected draft,
//! freed with the sequence. (The pools' other unit and property tests are in
//! `src/block_pools.rs`; the rollback in the scheduler, against the mock's states, in
//! `speculation.rs`.)

use sluice_engine::block_pools::StateStep;
use sluice_engine::{BlockPools, KvGroupSpec, RecurrentPool, SeqBlocks};

#[test]
fn with_rollback_a_sequence_holds_a_second_state_that_a_rejected_draft_restores() {
    let spec = RecurrentPool::split(5, 8, true);
    assert_eq!((spec.running_sequences(), spec.num_checkpoints), (1, 3));
    let pools_spec = KvGroupSpec::Recurrent(RecurrentPool::split(4, 8, true));
    let mut pools = BlockPools::new(64, 4, &[pools_spec]);
    let tokens: Vec<u32> = (0..9).collect();
    let mut seqs: Vec<SeqBlocks> = (0..2).map(|_| SeqBlocks::default()).collect();
    assert!(pools.allocate(&mut seqs[0], 9));
    assert_eq!(
        pools.num_used_states(0),
        Some(2),
        "its own and its rollback state"
    );
    // Two states for running sequences: the second sequence waits, holding nothing.
    assert!(!pools.allocate(&mut seqs[1], 1));
    assert!(seqs[1].is_empty());
    pools.check_consistency(seqs.iter()).unwrap();
    // A step of 1 known token and 3 drafts saves the state after the known one; without
    // drafts it saves nothing.
    let own = seqs[0].state(0).unwrap();
    let step = pools.checkpoint_step(&seqs[0], 5, 4, 3);
    let (rollback, n) = step.save.expect("a save before the drafts");
    assert_ne!(rollback, own);
    assert_eq!((n, step.restore), (1, None));
    assert_eq!(
        pools.checkpoint_step(&seqs[0], 5, 1, 0),
        StateStep::default()
    );
    // A draft rejected: the next step starts from that state.
    assert!(seqs[0].rolls_back());
    pools.register_computed(&mut seqs[0], &tokens, 6);
    assert!(pools.roll_back(&mut seqs[0]));
    assert!(seqs[0].rolled_back());
    assert_eq!(
        pools.checkpoint_step(&seqs[0], 6, 3, 0).restore,
        Some(rollback)
    );
    // The step committed: no restore is left; freed, both states go back.
    pools.register_computed(&mut seqs[0], &tokens, 9);
    assert!(!seqs[0].rolled_back());
    pools.free(&mut seqs[0]);
    assert_eq!(pools.num_used_states(0), Some(0));
    pools.check_consistency(seqs.iter()).unwrap();
    // Without rollback there is nothing to roll back to.
    let mut plain = BlockPools::new(
        64,
        4,
        &[KvGroupSpec::Recurrent(RecurrentPool::split(2, 8, false))],
    );
    assert!(plain.allocate(&mut seqs[1], 3));
    assert!(!seqs[1].rolls_back() && !plain.roll_back(&mut seqs[1]));
    assert_eq!(plain.checkpoint_step(&seqs[1], 2, 4, 3).save, None);
}
