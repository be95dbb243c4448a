//! The KV cache's block pools as the scheduler sees them: one pool for the full-attention
//! layers, and, for a model with sliding-window layers (Gemma 3's local layers, gpt-oss's
//! alternate ones), a second pool for those layers, whose blocks a sequence gives back as they
//! fall out of its window.
//!
//! A sequence holds one table in each pool ([`SeqBlocks`]), indexed alike (entry `i` holds
//! tokens `i * block_size..`), so the step lays both out the same way and the model picks one
//! per layer. The full table grows with the sequence; the window table grows the same way but
//! drops its leading blocks once no later token's window reaches them: at most about
//! `window / block_size + 2` blocks, plus those of the chunk being computed, stay live in it.
//! That is where a sliding-window model's memory goes back: the full pool's blocks hold only
//! the full layers' K/V, and the window pool is sized for the running sequences' windows, not
//! their lengths.
//!
//! Both pools change together: an allocation takes blocks from both or from neither, so the
//! scheduler's admission and preemption reason about one thing. The prefix cache works in
//! both: a cached prefix is used only as far as the window pool also holds the blocks that the
//! window of the first computed token reaches ([`BlockManager::find_cached_window`]).

use crate::block_manager::{AdapterKey, BlockManager, BlockTable, CachedPrefix, PrefixCacheStats};
use crate::kv_events::KvCacheEvent;

/// The second pool of a model with sliding-window layers.
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

/// One sequence's tables: in the full pool, and in the window pool when there is one (empty
/// otherwise).
#[derive(Debug, Default)]
pub struct SeqBlocks {
    full: BlockTable,
    window: BlockTable,
}

impl SeqBlocks {
    /// The full-attention layers' table: every block of the sequence.
    pub fn full(&self) -> &BlockTable {
        &self.full
    }

    /// The sliding-window layers' table: as long as the full one, its leading entries
    /// placeholders for blocks out of the window. Empty without a window pool.
    pub fn window(&self) -> &BlockTable {
        &self.window
    }

    pub fn is_empty(&self) -> bool {
        self.full.is_empty()
    }

    /// Keys both tables' blocks under `adapter` ([`BlockTable::set_adapter`]): set before the
    /// sequence holds anything.
    pub fn set_adapter(&mut self, adapter: Option<AdapterKey>) {
        self.full.set_adapter(adapter.clone());
        self.window.set_adapter(adapter);
    }

    /// Blocks of the sequence (entries of either table).
    pub fn len(&self) -> usize {
        self.full.len()
    }
}

/// A prefix found in both pools, to hand back to [`BlockPools::allocate_with_prefix`] before
/// anything else changes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolsPrefix {
    full: CachedPrefix,
    window: Option<CachedPrefix>,
}

impl PoolsPrefix {
    /// Tokens whose K/V need no compute.
    pub fn num_tokens(&self, block_size: usize) -> usize {
        self.full.num_tokens(block_size)
    }
}

#[derive(Debug)]
struct Window {
    blocks: BlockManager,
    tokens: usize,
}

/// The pools and their prefix caches. See the module docs.
#[derive(Debug)]
pub struct BlockPools {
    full: BlockManager,
    window: Option<Window>,
}

impl BlockPools {
    /// A full pool of `num_blocks` blocks of `block_size` tokens, and the window pool when
    /// the model has sliding-window layers.
    ///
    /// # Panics
    /// As [`BlockManager::new`], or on a window of 0 tokens.
    pub fn new(num_blocks: usize, block_size: usize, window: Option<WindowPool>) -> Self {
        let window = window.map(|w| {
            assert!(w.window > 0, "a sliding window of 0 tokens");
            Window {
                blocks: BlockManager::new(w.num_blocks, block_size),
                tokens: w.window,
            }
        });
        Self {
            full: BlockManager::new(num_blocks, block_size),
            window,
        }
    }

    /// The full-attention pool: the sequences' capacity, and the prefix cache the routers see.
    pub fn full(&self) -> &BlockManager {
        &self.full
    }

    /// The sliding-window pool, if the model has one.
    pub fn window(&self) -> Option<&BlockManager> {
        self.window.as_ref().map(|w| &w.blocks)
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

    /// The full pool's prefix-cache counters: a lookup's hit is what both pools gave.
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

    /// Empties both prefix caches; returns how many blocks the full pool's held.
    pub fn clear_prefix_cache(&mut self) -> usize {
        if let Some(w) = &mut self.window {
            w.blocks.clear_prefix_cache();
        }
        self.full.clear_prefix_cache()
    }

    /// The longest cached prefix of `tokens` that both pools can serve.
    ///
    /// # Panics
    /// If `seq` holds blocks.
    pub fn find_cached_prefix(&mut self, seq: &mut SeqBlocks, tokens: &[u32]) -> PoolsPrefix {
        let full = self.full.find_cached_prefix(&mut seq.full, tokens);
        let Some(w) = &mut self.window else {
            return PoolsPrefix { full, window: None };
        };
        let window =
            w.blocks
                .find_cached_window(&mut seq.window, tokens, w.tokens, full.num_blocks);
        let full = if window.num_blocks < full.num_blocks {
            self.full
                .find_cached_prefix_within(&mut seq.full, tokens, window.num_blocks)
        } else {
            full
        };
        PoolsPrefix {
            full,
            window: Some(window),
        }
    }

    /// Gives an empty `seq` the blocks of `prefix` plus fresh ones up to `num_tokens` tokens
    /// in both pools, or changes nothing and returns false when either is too small.
    ///
    /// # Panics
    /// If either pool changed since `prefix` was found, or `seq` holds blocks.
    pub fn allocate_with_prefix(
        &mut self,
        seq: &mut SeqBlocks,
        prefix: &PoolsPrefix,
        num_tokens: usize,
    ) -> bool {
        if let (Some(w), Some(wp)) = (&mut self.window, &prefix.window) {
            if !self.full.can_allocate_with_prefix(&prefix.full, num_tokens)
                || !w
                    .blocks
                    .allocate_with_prefix(&mut seq.window, wp, num_tokens)
            {
                return false;
            }
        }
        let done = self
            .full
            .allocate_with_prefix(&mut seq.full, &prefix.full, num_tokens);
        debug_assert!(done || self.window.is_none(), "checked above");
        done
    }

    /// Grows `seq` to hold `num_tokens` tokens in both pools, or changes nothing and returns
    /// false when either is too small.
    pub fn allocate(&mut self, seq: &mut SeqBlocks, num_tokens: usize) -> bool {
        if let Some(w) = &mut self.window {
            if !self.full.can_allocate(&seq.full, num_tokens)
                || !w.blocks.allocate(&mut seq.window, num_tokens)
            {
                return false;
            }
        }
        let done = self.full.allocate(&mut seq.full, num_tokens);
        debug_assert!(done || self.window.is_none(), "checked above");
        done
    }

    /// Returns every block of `seq` to both pools.
    pub fn free(&mut self, seq: &mut SeqBlocks) {
        self.full.free(&mut seq.full);
        if let Some(w) = &mut self.window {
            w.blocks.free(&mut seq.window);
        }
    }

    /// Records that the first `num_computed` of `tokens` are in the cache (newly full blocks
    /// join both prefix caches), then gives back the window blocks that no token from
    /// `num_computed` on reads.
    pub fn register_computed(&mut self, seq: &mut SeqBlocks, tokens: &[u32], num_computed: usize) {
        self.full
            .register_computed(&mut seq.full, tokens, num_computed);
        if let Some(w) = &mut self.window {
            w.blocks
                .register_computed(&mut seq.window, tokens, num_computed);
            let first_kept = (num_computed + 1).saturating_sub(w.tokens) / w.blocks.block_size();
            w.blocks.release_before(&mut seq.window, first_kept);
        }
    }

    /// [`BlockManager::check_consistency`] of both pools, and that each sequence's tables
    /// have one entry per block.
    pub fn check_consistency<'a>(
        &self,
        seqs: impl Iterator<Item = &'a SeqBlocks> + Clone,
    ) -> Result<(), String> {
        self.full.check_consistency(seqs.clone().map(|s| &s.full))?;
        match &self.window {
            Some(w) => {
                for s in seqs.clone() {
                    if s.window.len() != s.full.len() {
                        return Err(format!(
                            "a window table of {} entries beside a full one of {}",
                            s.window.len(),
                            s.full.len()
                        ));
                    }
                }
                w.blocks
                    .check_consistency(seqs.map(|s| &s.window))
                    .map_err(|e| format!("window pool: {e}"))
            }
            None if seqs.clone().any(|s| !s.window.is_empty()) => {
                Err("a window table without a window pool".into())
            }
            None => Ok(()),
        }
    }
}
