//! The KV cache's pools as the scheduler sees them, one per layer group (as vLLM v1 describes
//! a cache by per-layer specs): the full-attention layers' pool, which every model has (the
//! sequences' capacity, and the prefix cache the routers see), and one pool for each further
//! group the model declares ([`KvGroupSpec`]):
//! - sliding-window layers (Gemma 3's local layers, gpt-oss's alternate ones), whose blocks a
//!   sequence gives back as they fall out of its window;
//! - recurrent layers (the hybrids' Gated DeltaNet layers), which keep one fixed-size state per
//!   sequence whatever its length.
//!
//! A sequence holds one table in each paged pool ([`SeqBlocks`]), indexed alike (entry `i`
//! holds tokens `i * block_size..`), so the step lays them out the same way and the model picks
//! one per layer; and one state in each recurrent pool. The full table grows with the sequence;
//! a window table grows the same way but drops its leading blocks once no later token's window
//! reaches them: at most about `window / block_size + 2` blocks, plus those of the chunk being
//! computed, stay live in it. That is where a sliding-window model's memory goes back: the full
//! pool's blocks hold only the full layers' K/V, and the window pool is sized for the running
//! sequences' windows, not their lengths.
//!
//! All pools change together: an allocation takes from every pool or from none, so the
//! scheduler's admission and preemption reason about one thing. The prefix cache works in
//! every paged pool: a cached prefix is used only as far as each window pool also holds the
//! blocks that the window of the first computed token reaches
//! ([`BlockManager::find_cached_window`]). A recurrent pool keeps no state per prefix (a
//! checkpoint of the state at a block boundary is what would let one be reused), so a model
//! with recurrent layers serves no cached prefix: every prompt is computed from its first
//! token, which keeps its state exact.

use std::sync::LazyLock;

use crate::block_manager::{AdapterKey, BlockManager, BlockTable, CachedPrefix, PrefixCacheStats};
use crate::kv_events::KvCacheEvent;

/// Groups a model may declare beside its full-attention layers (sizes [`PoolsPrefix`] without
/// allocating).
pub const MAX_GROUPS: usize = 4;

/// The pool of a model's sliding-window layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowPool {
    /// Blocks in the pool (each holds `block_size` tokens of every sliding-window layer).
    pub num_blocks: usize,
    /// The layers' window in tokens: the query at position `p` sees keys `p + 1 - window..=p`.
    pub window: usize,
}

impl WindowPool {
    /// Blocks that a sequence alone may need in the window pool at once: its window, the
    /// chunk a step computes (at most `max_chunk` tokens), and a partial block at each end.
    pub fn blocks_for_one(window: usize, max_chunk: usize, block_size: usize) -> usize {
        (window - 1 + max_chunk).div_ceil(block_size) + 1
    }

    /// Blocks that `max_seqs` running sequences need at most at once when one step computes at
    /// most `max_batched_tokens` tokens: with this many the window pool never runs out first.
    pub fn blocks_for_all(
        window: usize,
        max_seqs: usize,
        max_batched_tokens: usize,
        block_size: usize,
    ) -> usize {
        (max_seqs * (window - 1) + max_batched_tokens).div_ceil(block_size) + 2 * max_seqs
    }
}

/// The states of a model's recurrent layers: one a sequence, of a fixed size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrentPool {
    /// States in the pool: at most this many sequences hold one at once.
    pub num_states: usize,
}

/// What a group of layers keeps for a sequence, beside the full-attention layers' paged K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvGroupSpec {
    /// Paged K/V of the tokens in the layers' window.
    SlidingWindow(WindowPool),
    /// One fixed-size state a sequence.
    Recurrent(RecurrentPool),
}

/// A sequence's state in a recurrent pool.
pub type StateId = u32;

/// What a sequence holds in one group ([`SeqBlocks::holdings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding<'a> {
    /// Its table in a paged group, one entry per entry of its full table.
    Table(&'a [u32]),
    /// Its state in a recurrent group.
    State(StateId),
}

/// What one sequence holds in one group.
#[derive(Debug)]
enum GroupHold {
    Window(BlockTable),
    State(Option<StateId>),
}

/// One sequence's tables: in the full pool, and what it holds in each further group.
#[derive(Debug, Default)]
pub struct SeqBlocks {
    full: BlockTable,
    /// One entry a group, in the pools' order; filled the first time the pools see the
    /// sequence.
    groups: Vec<GroupHold>,
}

static NO_TABLE: LazyLock<BlockTable> = LazyLock::new(BlockTable::new);

impl SeqBlocks {
    /// The full-attention layers' table: every block of the sequence.
    pub fn full(&self) -> &BlockTable {
        &self.full
    }

    /// The sliding-window layers' table: as long as the full one, its leading entries
    /// placeholders for blocks out of the window. Empty without a window pool.
    pub fn window(&self) -> &BlockTable {
        self.groups
            .iter()
            .find_map(|g| match g {
                GroupHold::Window(t) => Some(t),
                GroupHold::State(_) => None,
            })
            .unwrap_or(&NO_TABLE)
    }

    /// What it holds in each group, in the pools' order, as a step lays it out: its table in
    /// a paged group, its state in a recurrent one.
    ///
    /// # Panics
    /// If it holds no state in a recurrent group (a sequence is given one by its first
    /// allocation).
    pub fn holdings(&self) -> impl Iterator<Item = Holding<'_>> {
        self.groups.iter().map(|g| match g {
            GroupHold::Window(t) => Holding::Table(t.blocks()),
            GroupHold::State(s) => Holding::State(
                s.expect("an allocated sequence holds a state in every recurrent group"),
            ),
        })
    }

    /// Its state in group `group` (an index of the pools' groups), if that group is recurrent
    /// and the sequence holds one.
    pub fn state(&self, group: usize) -> Option<StateId> {
        match self.groups.get(group) {
            Some(GroupHold::State(s)) => *s,
            _ => None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.full.is_empty()
    }

    /// Keys every table's blocks under `adapter` ([`BlockTable::set_adapter`]): set before the
    /// sequence holds anything.
    pub fn set_adapter(&mut self, adapter: Option<AdapterKey>) {
        for g in &mut self.groups {
            if let GroupHold::Window(t) = g {
                t.set_adapter(adapter.clone());
            }
        }
        self.full.set_adapter(adapter);
    }

    /// Blocks of the sequence (entries of any of its tables).
    pub fn len(&self) -> usize {
        self.full.len()
    }
}

/// A prefix found in every pool, to hand back to [`BlockPools::allocate_with_prefix`] before
/// anything else changes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolsPrefix {
    full: CachedPrefix,
    /// Per group, its window pool's part (`None` for a recurrent group).
    groups: [Option<CachedPrefix>; MAX_GROUPS],
}

impl PoolsPrefix {
    /// Tokens whose K/V need no compute.
    pub fn num_tokens(&self, block_size: usize) -> usize {
        self.full.num_tokens(block_size)
    }
}

// A handful of groups a model: their sizes do not matter, boxing would only add a hop.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Group {
    Window { blocks: BlockManager, tokens: usize },
    Recurrent(StatePool),
}

/// The free states of a recurrent pool, the last freed taken first.
#[derive(Debug)]
struct StatePool {
    num_states: usize,
    free: Vec<StateId>,
}

impl StatePool {
    fn new(num_states: usize) -> Self {
        Self {
            num_states,
            free: (0..num_states as StateId).rev().collect(),
        }
    }
}

/// The pools and their prefix caches. See the module docs.
#[derive(Debug)]
pub struct BlockPools {
    full: BlockManager,
    groups: Vec<Group>,
}

impl BlockPools {
    /// A full pool of `num_blocks` blocks of `block_size` tokens, and a pool for each group of
    /// `groups`.
    ///
    /// # Panics
    /// As [`BlockManager::new`]; on a window of 0 tokens, a recurrent pool of no state or one
    /// of more than `u32::MAX` states, or more than [`MAX_GROUPS`] groups.
    pub fn new(num_blocks: usize, block_size: usize, groups: &[KvGroupSpec]) -> Self {
        assert!(groups.len() <= MAX_GROUPS, "more than {MAX_GROUPS} groups");
        let groups = groups
            .iter()
            .map(|g| match *g {
                KvGroupSpec::SlidingWindow(w) => {
                    assert!(w.window > 0, "a sliding window of 0 tokens");
                    Group::Window {
                        blocks: BlockManager::new(w.num_blocks, block_size),
                        tokens: w.window,
                    }
                }
                KvGroupSpec::Recurrent(r) => {
                    assert!(
                        r.num_states > 0 && r.num_states <= u32::MAX as usize,
                        "a recurrent pool of {} states",
                        r.num_states
                    );
                    Group::Recurrent(StatePool::new(r.num_states))
                }
            })
            .collect();
        Self {
            full: BlockManager::new(num_blocks, block_size),
            groups,
        }
    }

    /// The full-attention pool: the sequences' capacity, and the prefix cache the routers see.
    pub fn full(&self) -> &BlockManager {
        &self.full
    }

    /// The (first) sliding-window pool, if the model has one.
    pub fn window(&self) -> Option<&BlockManager> {
        self.windows().next()
    }

    /// Every sliding-window pool, in the groups' order.
    pub fn windows(&self) -> impl Iterator<Item = &BlockManager> {
        self.groups.iter().filter_map(|g| match g {
            Group::Window { blocks, .. } => Some(blocks),
            Group::Recurrent(_) => None,
        })
    }

    /// States of recurrent group `group` that sequences hold; `None` for another kind.
    pub fn num_used_states(&self, group: usize) -> Option<usize> {
        match self.groups.get(group) {
            Some(Group::Recurrent(p)) => Some(p.num_states - p.free.len()),
            _ => None,
        }
    }

    pub fn block_size(&self) -> usize {
        self.full.block_size()
    }

    /// Blocks of the full pool.
    pub fn num_blocks(&self) -> usize {
        self.full.num_blocks()
    }

    /// Blocks of the full pool in use.
    pub fn num_used_blocks(&self) -> usize {
        self.full.num_used_blocks()
    }

    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        self.full.blocks_for(num_tokens)
    }

    /// The full pool's prefix-cache counters: a lookup's hit is what every pool gave.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.full.prefix_cache_stats()
    }

    /// Records the full pool's cache events ([`BlockManager::record_events`]): a router
    /// routes by whole prefixes, which the full pool holds.
    pub fn record_events(&mut self) {
        self.full.record_events();
    }

    pub fn drain_events(&mut self, out: &mut Vec<KvCacheEvent>) {
        self.full.drain_events(out);
    }

    /// Empties every prefix cache; returns how many blocks the full pool's held.
    pub fn clear_prefix_cache(&mut self) -> usize {
        for g in &mut self.groups {
            if let Group::Window { blocks, .. } = g {
                blocks.clear_prefix_cache();
            }
        }
        self.full.clear_prefix_cache()
    }

    /// Gives `seq` its entry in each group, the first time the pools see it.
    fn join(&self, seq: &mut SeqBlocks) {
        if seq.groups.len() == self.groups.len() {
            return;
        }
        debug_assert!(seq.groups.is_empty(), "a sequence from other pools");
        seq.groups = self
            .groups
            .iter()
            .map(|g| match g {
                Group::Window { .. } => {
                    let mut t = BlockTable::new();
                    t.set_adapter(seq.full.adapter().cloned());
                    GroupHold::Window(t)
                }
                Group::Recurrent(_) => GroupHold::State(None),
            })
            .collect();
    }

    /// The longest cached prefix of `tokens` that every pool can serve (none with a recurrent
    /// group: see the module docs).
    ///
    /// # Panics
    /// If `seq` holds blocks.
    pub fn find_cached_prefix(&mut self, seq: &mut SeqBlocks, tokens: &[u32]) -> PoolsPrefix {
        self.join(seq);
        let full = self.full.find_cached_prefix(&mut seq.full, tokens);
        let recurrent = self.groups.iter().any(|g| matches!(g, Group::Recurrent(_)));
        let mut limit = if recurrent { 0 } else { full.num_blocks };
        let mut groups = [None; MAX_GROUPS];
        // Each window pool serves a prefix no longer than the limit; the limit falls to the
        // shortest, and the pools are asked again until every one serves the same length.
        loop {
            let before = limit;
            for (i, (g, hold)) in self.groups.iter_mut().zip(&mut seq.groups).enumerate() {
                if let (Group::Window { blocks, tokens: w }, GroupHold::Window(table)) = (g, hold) {
                    let found = blocks.find_cached_window(table, tokens, *w, limit);
                    limit = limit.min(found.num_blocks);
                    groups[i] = Some(found);
                }
            }
            if limit == before && groups.iter().flatten().all(|p| p.num_blocks == limit) {
                break;
            }
        }
        let full = if limit < full.num_blocks {
            self.full
                .find_cached_prefix_within(&mut seq.full, tokens, limit)
        } else {
            full
        };
        PoolsPrefix { full, groups }
    }

    /// Whether every group can give `seq` what `num_tokens` tokens need (`prefix`: its window
    /// pools' parts of a prefix it starts from).
    fn groups_can_allocate(
        &self,
        seq: &SeqBlocks,
        num_tokens: usize,
        prefix: Option<&PoolsPrefix>,
    ) -> bool {
        self.groups
            .iter()
            .zip(&seq.groups)
            .enumerate()
            .all(|(i, (g, hold))| match (g, hold) {
                (Group::Window { blocks, .. }, GroupHold::Window(table)) => {
                    match prefix.and_then(|p| p.groups[i].as_ref()) {
                        Some(p) => blocks.can_allocate_with_prefix(p, num_tokens),
                        None => blocks.can_allocate(table, num_tokens),
                    }
                }
                (Group::Recurrent(p), GroupHold::State(s)) => s.is_some() || !p.free.is_empty(),
                _ => unreachable!("a sequence's groups follow the pools'"),
            })
    }

    /// Takes from each group what `groups_can_allocate` found available.
    fn groups_allocate(
        &mut self,
        seq: &mut SeqBlocks,
        num_tokens: usize,
        prefix: Option<&PoolsPrefix>,
    ) {
        for (i, (g, hold)) in self.groups.iter_mut().zip(&mut seq.groups).enumerate() {
            let done = match (g, hold) {
                (Group::Window { blocks, .. }, GroupHold::Window(table)) => {
                    match prefix.and_then(|p| p.groups[i].as_ref()) {
                        Some(p) => blocks.allocate_with_prefix(table, p, num_tokens),
                        None => blocks.allocate(table, num_tokens),
                    }
                }
                (Group::Recurrent(p), GroupHold::State(s)) => {
                    if s.is_none() {
                        *s = p.free.pop();
                    }
                    s.is_some()
                }
                _ => unreachable!("a sequence's groups follow the pools'"),
            };
            assert!(done, "checked by groups_can_allocate");
        }
    }

    /// Gives an empty `seq` the blocks of `prefix` plus fresh ones up to `num_tokens` tokens
    /// in every pool (and a state in each recurrent one), or changes nothing and returns false
    /// when one is too small.
    ///
    /// # Panics
    /// If a pool changed since `prefix` was found, or `seq` holds blocks.
    pub fn allocate_with_prefix(
        &mut self,
        seq: &mut SeqBlocks,
        prefix: &PoolsPrefix,
        num_tokens: usize,
    ) -> bool {
        self.join(seq);
        if !self.groups.is_empty() {
            if !self.full.can_allocate_with_prefix(&prefix.full, num_tokens)
                || !self.groups_can_allocate(seq, num_tokens, Some(prefix))
            {
                return false;
            }
            self.groups_allocate(seq, num_tokens, Some(prefix));
        }
        let done = self
            .full
            .allocate_with_prefix(&mut seq.full, &prefix.full, num_tokens);
        debug_assert!(done || self.groups.is_empty(), "checked above");
        done
    }

    /// Grows `seq` to hold `num_tokens` tokens in every pool, or changes nothing and returns
    /// false when one is too small.
    pub fn allocate(&mut self, seq: &mut SeqBlocks, num_tokens: usize) -> bool {
        self.join(seq);
        if !self.groups.is_empty() {
            if !self.full.can_allocate(&seq.full, num_tokens)
                || !self.groups_can_allocate(seq, num_tokens, None)
            {
                return false;
            }
            self.groups_allocate(seq, num_tokens, None);
        }
        let done = self.full.allocate(&mut seq.full, num_tokens);
        debug_assert!(done || self.groups.is_empty(), "checked above");
        done
    }

    /// Returns every block and state of `seq` to the pools.
    pub fn free(&mut self, seq: &mut SeqBlocks) {
        self.full.free(&mut seq.full);
        for (g, hold) in self.groups.iter_mut().zip(&mut seq.groups) {
            match (g, hold) {
                (Group::Window { blocks, .. }, GroupHold::Window(table)) => blocks.free(table),
                (Group::Recurrent(p), GroupHold::State(s)) => p.free.extend(s.take()),
                _ => unreachable!("a sequence's groups follow the pools'"),
            }
        }
    }

    /// Records that the first `num_computed` of `tokens` are in the cache (newly full blocks
    /// join every prefix cache), then gives back the window blocks that no token from
    /// `num_computed` on reads.
    pub fn register_computed(&mut self, seq: &mut SeqBlocks, tokens: &[u32], num_computed: usize) {
        self.full
            .register_computed(&mut seq.full, tokens, num_computed);
        for (g, hold) in self.groups.iter_mut().zip(&mut seq.groups) {
            if let (Group::Window { blocks, tokens: w }, GroupHold::Window(table)) = (g, hold) {
                blocks.register_computed(table, tokens, num_computed);
                let first_kept = (num_computed + 1).saturating_sub(*w) / blocks.block_size();
                blocks.release_before(table, first_kept);
            }
        }
    }

    /// [`BlockManager::check_consistency`] of every paged pool, that each sequence's window
    /// tables have one entry per block, and that every state of a recurrent pool is either
    /// free or held by exactly one sequence.
    pub fn check_consistency<'a>(
        &self,
        seqs: impl Iterator<Item = &'a SeqBlocks> + Clone,
    ) -> Result<(), String> {
        self.full.check_consistency(seqs.clone().map(|s| &s.full))?;
        for s in seqs.clone() {
            if !s.groups.is_empty() && s.groups.len() != self.groups.len() {
                return Err(format!(
                    "a sequence in {} groups of pools with {}",
                    s.groups.len(),
                    self.groups.len()
                ));
            }
            if s.groups.is_empty() && !s.full.is_empty() && !self.groups.is_empty() {
                return Err("a sequence holding blocks outside the groups".into());
            }
        }
        for (i, g) in self.groups.iter().enumerate() {
            match g {
                Group::Window { blocks, .. } => {
                    let mut tables = Vec::new();
                    for s in seqs.clone() {
                        if let Some(GroupHold::Window(t)) = s.groups.get(i) {
                            if t.len() != s.full.len() {
                                return Err(format!(
                                    "a window table of {} entries beside a full one of {}",
                                    t.len(),
                                    s.full.len()
                                ));
                            }
                            tables.push(t);
                        }
                    }
                    blocks
                        .check_consistency(tables)
                        .map_err(|e| format!("window pool (group {i}): {e}"))?;
                }
                Group::Recurrent(p) => {
                    let mut held = vec![false; p.num_states];
                    let states = seqs
                        .clone()
                        .filter_map(|s| match s.groups.get(i) {
                            Some(GroupHold::State(state)) => *state,
                            _ => None,
                        })
                        .chain(p.free.iter().copied());
                    let mut count = 0;
                    for s in states {
                        let slot = held
                            .get_mut(s as usize)
                            .ok_or_else(|| format!("state {s} out of range (group {i})"))?;
                        if *slot {
                            return Err(format!("state {s} held twice (group {i})"));
                        }
                        *slot = true;
                        count += 1;
                    }
                    if count != p.num_states {
                        return Err(format!(
                            "{} of {} states free or held (group {i})",
                            count, p.num_states
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const BS: usize = 4;

    fn tokens(n: usize) -> Vec<u32> {
        (0..n as u32).map(|t| t * 7 % 50).collect()
    }

    fn recurrent(num_states: usize) -> KvGroupSpec {
        KvGroupSpec::Recurrent(RecurrentPool { num_states })
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

    #[derive(Debug, Clone)]
    enum Op {
        Admit { seq: usize, len: usize },
        Grow { seq: usize, extra: usize },
        Compute { seq: usize },
        Free { seq: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..6usize, 1..40usize).prop_map(|(seq, len)| Op::Admit { seq, len }),
            (0..6usize, 1..9usize).prop_map(|(seq, extra)| Op::Grow { seq, extra }),
            (0..6usize).prop_map(|seq| Op::Compute { seq }),
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
            window_tokens in 1..12usize,
        ) {
            let groups = [window(24, window_tokens), recurrent(states)];
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
        }
    }
}
