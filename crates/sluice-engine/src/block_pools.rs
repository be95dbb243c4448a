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
//! ([`BlockManager::find_cached_window`]). A recurrent state cannot be cut at a block
//! boundary after the fact, so a recurrent pool serves a prefix only from a checkpoint: the
//! state of a sequence saved as its prefill crossed the last full block of its tokens (the
//! model copies it, `StepBatch::push_group_state_with`), kept under that block's chain hash in
//! states of their own ([`RecurrentPool::num_checkpoints`]). A prompt then starts from the
//! deepest cached block that has a checkpoint and that every window pool serves too (else
//! from a shallower one, or from nothing), its state a copy of it, and computes the rest:
//! the cold run's bits, since a state moves token by token the same way in any chunking. A new
//! checkpoint takes a free checkpoint state, else the one whose block left the full pool's
//! cache, else the least recently used; a checkpoint whose block is gone is never used.
//!
//! With speculation, a recurrent state moves past every draft token a step verifies, and the
//! rejected ones cannot be taken back out of it. So each running sequence holds a second
//! state ([`RecurrentPool::rollback`]): a step with drafts saves the state after the
//! sequence's known tokens into it, and when a draft is rejected the next step starts from it
//! and computes the kept drafts again ([`BlockPools::roll_back`]): their K/V is rewritten
//! with the same bits, and the state is the one plain decoding would hold.

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
    /// States in the pool (the model's count): the running sequences' and the checkpoints'.
    pub num_states: usize,
    /// Of those, the last this many hold prefix checkpoints (0: no prefix is served); the
    /// other `num_states - num_checkpoints` are the running sequences'.
    pub num_checkpoints: usize,
    /// Each running sequence holds two states: its own, and its state before the draft tokens
    /// of its step, which a rejected draft rolls back to (speculation; see the module docs).
    pub rollback: bool,
}

impl RecurrentPool {
    /// `num_states` states split between at most `max_seqs` running sequences (each holding
    /// two with `rollback`) and prefix checkpoints: half each while that leaves room for fewer
    /// than `max_seqs` sequences (at least one), and past that every state beyond the running
    /// sequences' a checkpoint.
    pub fn split(num_states: usize, max_seqs: usize, rollback: bool) -> Self {
        let per = Self::per_sequence(rollback);
        let seqs = max_seqs.min((num_states - num_states / 2) / per).max(1);
        Self {
            num_states,
            num_checkpoints: num_states.saturating_sub(seqs * per),
            rollback,
        }
    }

    /// States for running sequences.
    pub fn running(&self) -> usize {
        self.num_states - self.num_checkpoints
    }

    /// Sequences that can hold their states at once.
    pub fn running_sequences(&self) -> usize {
        self.running() / Self::per_sequence(self.rollback)
    }

    /// States a running sequence holds.
    pub fn per_sequence(rollback: bool) -> usize {
        1 + usize::from(rollback)
    }
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
    /// The checkpoint its recurrent state starts from, until its first step commits.
    restore: Option<StateId>,
    /// The checkpoint its state is saved into when its computed tokens reach the position.
    save: Option<PendingSave>,
    /// Its second state in a recurrent pool with [`RecurrentPool::rollback`]: where a step
    /// with drafts saves the state before them.
    rollback: Option<StateId>,
}

/// A checkpoint a sequence's step will save.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PendingSave {
    state: StateId,
    /// The position (a block boundary) whose state it keeps.
    tokens: usize,
    /// The chain hash of the block that ends there.
    hash: u64,
}

/// What a sequence's recurrent state does in a step beside moving past its tokens
/// ([`BlockPools::checkpoint_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateStep {
    /// Start as a copy of this checkpoint.
    pub restore: Option<StateId>,
    /// `(checkpoint, n)`: save the state after the step's first `n` tokens there.
    pub save: Option<(StateId, usize)>,
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

    /// Whether it holds a rollback state ([`RecurrentPool::rollback`]): a rejected draft then
    /// rolls its state back and its kept drafts are computed again ([`BlockPools::roll_back`]).
    pub fn rolls_back(&self) -> bool {
        self.rollback.is_some()
    }

    /// Whether its next step starts from the state saved before a rejected draft
    /// ([`BlockPools::roll_back`]), computing the kept drafts again.
    pub fn rolled_back(&self) -> bool {
        self.restore.is_some() && self.restore == self.rollback
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
    /// The checkpoint a recurrent state starts from (a prefix that a model with recurrent
    /// layers serves).
    restore: Option<StateId>,
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

/// The free states of a recurrent pool, the last freed taken first, and its checkpoints.
#[derive(Debug)]
struct StatePool {
    num_states: usize,
    /// States for running sequences (the first ones; the rest are checkpoints').
    running: usize,
    /// Each sequence takes a second state for rolling back drafts.
    rollback: bool,
    free: Vec<StateId>,
    /// Checkpoint states no checkpoint or pending save holds.
    free_checkpoints: Vec<StateId>,
    /// Kept checkpoints: the chain hash of the block that ends at the saved position, its
    /// state, and when it was last saved or used.
    checkpoints: Vec<(u64, StateId, u64)>,
    /// Counts saves and uses, for the least recently used.
    clock: u64,
}

impl StatePool {
    fn new(spec: RecurrentPool) -> Self {
        let running = spec.num_states - spec.num_checkpoints;
        Self {
            num_states: spec.num_states,
            running,
            rollback: spec.rollback,
            free: (0..running as StateId).rev().collect(),
            free_checkpoints: (running as StateId..spec.num_states as StateId)
                .rev()
                .collect(),
            checkpoints: Vec::new(),
            clock: 0,
        }
    }

    /// A state for a new checkpoint: a free one, else the one whose block `cached` says left
    /// the cache, else the least recently used; `None` without checkpoint states.
    fn take_checkpoint(&mut self, cached: impl Fn(u64) -> bool) -> Option<StateId> {
        if let Some(state) = self.free_checkpoints.pop() {
            return Some(state);
        }
        let victim = self
            .checkpoints
            .iter()
            .position(|&(hash, _, _)| !cached(hash))
            .or_else(|| (0..self.checkpoints.len()).min_by_key(|&i| self.checkpoints[i].2))?;
        Some(self.checkpoints.swap_remove(victim).1)
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
                        r.running() >= RecurrentPool::per_sequence(r.rollback)
                            && r.num_states > r.num_checkpoints
                            && r.num_states <= u32::MAX as usize,
                        "a recurrent pool of {} states ({} checkpoints)",
                        r.num_states,
                        r.num_checkpoints
                    );
                    Group::Recurrent(StatePool::new(r))
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

    /// Groups beside the full pool.
    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// States of recurrent group `group` that sequences hold; `None` for another kind.
    pub fn num_used_states(&self, group: usize) -> Option<usize> {
        match self.groups.get(group) {
            Some(Group::Recurrent(p)) => Some(p.running - p.free.len()),
            _ => None,
        }
    }

    /// Prefix checkpoints kept in recurrent group `group`; `None` for another kind.
    pub fn num_checkpoints(&self, group: usize) -> Option<usize> {
        match self.groups.get(group) {
            Some(Group::Recurrent(p)) => Some(p.checkpoints.len()),
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

    /// The longest cached prefix of `tokens` that every pool can serve (with a recurrent
    /// group, only as far as its deepest checkpoint: see the module docs).
    ///
    /// # Panics
    /// If `seq` holds blocks.
    pub fn find_cached_prefix(&mut self, seq: &mut SeqBlocks, tokens: &[u32]) -> PoolsPrefix {
        self.join(seq);
        let full = self.full.find_cached_prefix(&mut seq.full, tokens);
        let mut limit = full.num_blocks;
        // Each pool serves a prefix no longer than the limit, and the limit falls to the
        // shortest: a recurrent pool to its deepest checkpoint within it, a window pool to the
        // blocks it holds for the window. Every pool is asked again until a pass leaves the
        // limit as it was (it only falls, so this ends), as a window pool may serve less than a
        // checkpoint's blocks and a recurrent pool then serves only a shallower checkpoint.
        let mut groups = [None; MAX_GROUPS];
        // Per recurrent group, the checkpoint that ends at the limit: (its index, its state).
        let mut restore: [Option<(usize, StateId)>; MAX_GROUPS] = [None; MAX_GROUPS];
        let full_pool = &self.full;
        loop {
            let before = limit;
            for (i, (g, hold)) in self.groups.iter_mut().zip(&mut seq.groups).enumerate() {
                match (g, hold) {
                    (Group::Window { blocks, tokens: w }, GroupHold::Window(table)) => {
                        let found = blocks.find_cached_window(table, tokens, *w, limit);
                        limit = limit.min(found.num_blocks);
                        groups[i] = Some(found);
                    }
                    (Group::Recurrent(p), _) => {
                        // The deepest block within the limit with a checkpoint of the state
                        // where it ends (the lookup memoised the blocks' hashes).
                        let found = (1..=limit).rev().find_map(|k| {
                            let hash = full_pool.ensure_hash(&mut seq.full, tokens, k - 1);
                            let c = p.checkpoints.iter().position(|c| c.0 == hash)?;
                            Some((k, c))
                        });
                        limit = found.map_or(0, |(k, _)| k);
                        restore[i] = found.map(|(_, c)| (c, p.checkpoints[c].1));
                    }
                    _ => unreachable!("a sequence's groups follow the pools'"),
                }
            }
            // A pass that left the limit as it was asked every pool at that limit, and each
            // served at least it and never more: all serve it (a recurrent pool through the
            // checkpoint that ends there, or none at 0).
            if limit == before {
                break;
            }
        }
        let full = if limit < full.num_blocks {
            self.full
                .find_cached_prefix_within(&mut seq.full, tokens, limit)
        } else {
            full
        };
        // The checkpoint used is the most recently used one (a prefix of none uses none).
        let mut state = None;
        for (g, found) in self.groups.iter_mut().zip(restore) {
            if let (Group::Recurrent(p), Some((c, s))) = (g, found.filter(|_| limit > 0)) {
                p.clock += 1;
                p.checkpoints[c].2 = p.clock;
                state = Some(s);
            }
        }
        PoolsPrefix {
            full,
            groups,
            restore: state,
        }
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
                (Group::Recurrent(p), GroupHold::State(s)) => {
                    s.is_some() || p.free.len() >= RecurrentPool::per_sequence(p.rollback)
                }
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
        for (i, (g, hold)) in self
            .groups
            .iter_mut()
            .zip(seq.groups.iter_mut())
            .enumerate()
        {
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
                        if p.rollback {
                            seq.rollback = p.free.pop();
                        }
                    }
                    s.is_some() && (!p.rollback || seq.rollback.is_some())
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
        if done {
            seq.restore = prefix.restore;
        }
        done
    }

    /// Plans a checkpoint of `seq`'s recurrent state at the last block boundary of `tokens`
    /// that a later lookup can reach (at least one token after it), when the pools have a
    /// recurrent group with checkpoint states, that boundary lies past the `start` it computes
    /// from, and no checkpoint of it is kept. The save happens in the step whose tokens cross
    /// it ([`BlockPools::checkpoint_step`]) and is kept once that step commits.
    pub fn plan_checkpoint(&mut self, seq: &mut SeqBlocks, tokens: &[u32], start: usize) {
        let bs = self.full.block_size();
        let boundary = tokens.len().saturating_sub(1) / bs * bs;
        if seq.save.is_some() || boundary == 0 || boundary <= start {
            return;
        }
        let full = &self.full;
        for g in &mut self.groups {
            let Group::Recurrent(p) = g else { continue };
            let hash = full.ensure_hash(&mut seq.full, tokens, boundary / bs - 1);
            if p.checkpoints.iter().any(|c| c.0 == hash) {
                return;
            }
            let cached = |h: u64| full.is_cached(h);
            if let Some(state) = p.take_checkpoint(cached) {
                seq.save = Some(PendingSave {
                    state,
                    tokens: boundary,
                    hash,
                });
            }
        }
    }

    /// What `seq`'s recurrent state does in the step that computes its tokens `start..start +
    /// len`, the last `draft` of them drafts: start from its checkpoint (its first step after a
    /// prefix hit) or from its rollback state (after a rejected draft), save one (the step that
    /// crosses its planned checkpoint), or save the state before the drafts into its rollback
    /// state.
    pub fn checkpoint_step(
        &self,
        seq: &SeqBlocks,
        start: usize,
        len: usize,
        draft: usize,
    ) -> StateStep {
        let checkpoint = seq
            .save
            .filter(|s| start < s.tokens && s.tokens <= start + len)
            .map(|s| (s.state, s.tokens - start));
        // A sequence drafts only once its prompt is computed, past any checkpoint it plans.
        debug_assert!(
            checkpoint.is_none() || draft == 0,
            "a checkpoint in a draft step"
        );
        let before_drafts = seq
            .rollback
            .filter(|_| draft > 0 && draft < len)
            .map(|r| (r, len - draft));
        StateStep {
            restore: seq.restore,
            save: checkpoint.or(before_drafts),
        }
    }

    /// After the commit of a step whose drafts were not all kept: `seq`'s next step starts
    /// from the state saved before them (its kept drafts computed again). Returns false, and
    /// changes nothing, when the pools hold no rollback state for it (no recurrent group, or
    /// one without [`RecurrentPool::rollback`]): its state needs no rolling back then.
    pub fn roll_back(&mut self, seq: &mut SeqBlocks) -> bool {
        if seq.rollback.is_none() {
            return false;
        }
        seq.restore = seq.rollback;
        true
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

    /// Returns every block and state of `seq` to the pools (a checkpoint it had yet to save
    /// too).
    pub fn free(&mut self, seq: &mut SeqBlocks) {
        self.full.free(&mut seq.full);
        seq.restore = None;
        let save = seq.save.take();
        for (g, hold) in self.groups.iter_mut().zip(seq.groups.iter_mut()) {
            match (g, hold) {
                (Group::Window { blocks, .. }, GroupHold::Window(table)) => blocks.free(table),
                (Group::Recurrent(p), GroupHold::State(s)) => {
                    p.free.extend(s.take());
                    p.free.extend(seq.rollback.take());
                    p.free_checkpoints.extend(save.map(|s| s.state));
                }
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
        // A step committed: its restore is done, and a checkpoint it saved is kept.
        seq.restore = None;
        if let Some(save) = seq.save.filter(|s| s.tokens <= num_computed) {
            seq.save = None;
            for g in &mut self.groups {
                if let Group::Recurrent(p) = g {
                    p.clock += 1;
                    // Another sequence of the same prefix may have saved it first.
                    if p.checkpoints.iter().any(|c| c.0 == save.hash) {
                        p.free_checkpoints.push(save.state);
                    } else {
                        p.checkpoints.push((save.hash, save.state, p.clock));
                    }
                }
            }
        }
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
                        .chain(seqs.clone().filter_map(|s| s.save.map(|v| v.state)))
                        .chain(seqs.clone().filter_map(|s| s.rollback))
                        .chain(p.free.iter().copied())
                        .chain(p.free_checkpoints.iter().copied())
                        .chain(p.checkpoints.iter().map(|c| c.1));
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
mod tests;
