//! The paged KV cache's bookkeeping: which fixed-size blocks each sequence owns, which are free,
//! and which full blocks can be shared through the prefix cache. No tensors live here; the model
//! reads the block ids this module hands out.
//!
//! Blocks are reference counted. A block is *free* when its count is zero; free blocks sit in one
//! intrusive queue that doubles as the LRU list of the prefix cache:
//!
//! ```text
//! head (taken first)                                                     tail
//!   [ free, no cached content ... ][ free, cached: least ... most recently used ]
//! ```
//!
//! Blocks without cached content go to the head when freed, so a fresh allocation never throws
//! away a cached block while a useless one is available; cached blocks go to the tail, so the
//! cached block taken (and evicted) first is the one freed longest ago. A prefix-cache hit on a
//! free block unlinks it from the middle of the queue. Every operation is O(1) per block.
//!
//! Prefix caching keys a FULL block by `hash(parent block's key, its token ids)`, so a key names
//! the whole prefix up to the end of the block. A sequence's first block hangs from a root: one
//! for the base model and one per LoRA adapter ([`AdapterKey`]), so the K/V a prefix got under
//! one adapter is never found by a sequence of another. Only blocks whose tokens are all computed are
//! registered, and a sequence only ever writes K/V at positions past its computed tokens, so a
//! shared block is never written: sharing needs no copy-on-write.
//!
//! A table of a sliding-window pool (`crate::block_pools`) gives back its blocks that fall out
//! of the window while the sequence runs ([`BlockManager::release_before`]). Its leading
//! entries are then placeholders: block 0, which the table no longer references and attention
//! never reads (every query's window starts past them). The same holds for a table that took a
//! cached window from the prefix cache ([`BlockManager::find_cached_window`]): only the blocks
//! the first computed token's window reaches are taken.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use crate::kv_events::{CachedBlock, KvCacheEvent};

/// Index of a block in the KV cache; the model's slot for a token is
/// `block_id * block_size + offset`.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// Key of the (nonexistent) block before the first one; any constant works, it only has to be
/// the same for every sequence.
const ROOT_HASH: u64 = 0x736c_7569_6365_0001;

/// The LoRA adapter a sequence runs with, as the prefix cache keys it: `id` is unique to one
/// load of an adapter (the same name loaded again gets a new id, since its weights may differ),
/// `name` is what events report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterKey {
    pub id: u64,
    pub name: Arc<str>,
}

impl AdapterKey {
    /// The root its sequences' first blocks hang from.
    fn root(&self) -> u64 {
        chain_hash(ROOT_HASH, &[self.id as u32, (self.id >> 32) as u32])
    }
}

/// The keys of the cache map are already hashes, so hashing them again would only cost time.
#[derive(Default)]
struct PrehashedU64(u64);

impl Hasher for PrehashedU64 {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type CacheMap = HashMap<u64, BlockId, BuildHasherDefault<PrehashedU64>>;

/// Chain hash of one full block. `DefaultHasher::new()` uses fixed keys, so the value is the
/// same for every sequence in the process, which is all the cache needs.
fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write_u64(parent);
    for &t in tokens {
        h.write_u32(t);
    }
    h.finish()
}

/// The blocks of one sequence, in token order. Only a [`BlockManager`] changes it, so the ref
/// counts always match the tables; it deliberately does not implement `Clone`, because a copy
/// would hold references the manager does not know about.
///
/// A table belongs to one token sequence whose tokens only ever grow: it memoises the chain
/// hashes of that sequence's full blocks, and keeps them when its blocks are freed (preemption),
/// so a re-admitted sequence looks itself up in the prefix cache without rehashing.
#[derive(Debug, Default)]
pub struct BlockTable {
    /// One entry per block of the sequence; those before `first_live` are placeholders (0).
    blocks: Vec<BlockId>,
    /// Leading entries that hold no reference: blocks out of a sliding window.
    first_live: usize,
    /// `hashes[i]` is the chain hash of the sequence's tokens `0..(i + 1) * block_size`.
    hashes: Vec<u64>,
    /// Leading blocks already offered to the prefix cache (hits, or registered after compute).
    num_registered: usize,
    /// The adapter its sequence runs with, and that adapter's root; `None`: the base model.
    adapter: Option<(AdapterKey, u64)>,
}

impl BlockTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// One entry per block, in token order; the first [`BlockTable::first_live`] are
    /// placeholders (block 0, not referenced) in a sliding-window pool's table.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// The leading entries that are placeholders for blocks out of the window.
    pub fn first_live(&self) -> usize {
        self.first_live
    }

    /// The blocks this table references.
    pub fn live_blocks(&self) -> &[BlockId] {
        &self.blocks[self.first_live..]
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Keys its blocks under `adapter` (`None`: the base model). Set before the table holds or
    /// hashes anything.
    ///
    /// # Panics
    /// If the table already holds blocks or hashes.
    pub fn set_adapter(&mut self, adapter: Option<AdapterKey>) {
        assert!(
            self.blocks.is_empty() && self.hashes.is_empty(),
            "an adapter set on a table in use"
        );
        self.adapter = adapter.map(|a| {
            let root = a.root();
            (a, root)
        });
    }

    /// The adapter its sequence runs with.
    pub fn adapter(&self) -> Option<&AdapterKey> {
        self.adapter.as_ref().map(|(a, _)| a)
    }

    fn root(&self) -> u64 {
        self.adapter.as_ref().map_or(ROOT_HASH, |&(_, root)| root)
    }
}

/// Prefix-cache counters, in tokens: `queries` counts the known tokens of every sequence at
/// (re)admission, `hits` those of them whose K/V came from cached blocks instead of compute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub queries: u64,
    pub hits: u64,
}

/// The result of [`BlockManager::find_cached_prefix`], to hand back to
/// [`BlockManager::allocate_with_prefix`] before anything else changes the manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedPrefix {
    /// Leading full blocks whose tokens need no compute.
    pub num_blocks: usize,
    /// The first of them taken from the cache: 0, or for a sliding-window pool the first block
    /// the window of token `num_blocks * block_size` reaches (those before are placeholders).
    pub first_block: usize,
    /// How many of the blocks taken are free (ref count 0): taking them shrinks the free pool.
    pub num_evictable: usize,
    num_query_tokens: usize,
    epoch: u64,
}

impl CachedPrefix {
    /// Tokens whose K/V the found blocks already hold.
    pub fn num_tokens(&self, block_size: usize) -> usize {
        self.num_blocks * block_size
    }
}

/// Ref-counted allocator of KV-cache blocks with a prefix cache. See the module docs.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    ref_counts: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    num_free: usize,
    cache: CacheMap,
    /// The key under which a block is in `cache`, if it is.
    block_key: Vec<Option<u64>>,
    /// What a cached block holds, to tell a real hit from a 64-bit hash collision.
    block_parent: Vec<u64>,
    block_tokens: Vec<u32>,
    /// A cached block that starts its sequence (its parent is a root, which events do not
    /// name), and the adapter it was computed with: what events and snapshots report.
    block_starts: Vec<bool>,
    block_adapter: Vec<Option<Arc<str>>>,
    stats: PrefixCacheStats,
    /// Bumped by every change to ref counts or the cache, so a stale [`CachedPrefix`] is caught.
    epoch: u64,
    /// The cache's changes since the last [`BlockManager::drain_events`], when recorded.
    events: Option<Vec<KvCacheEvent>>,
}

impl BlockManager {
    /// A pool of `num_blocks` blocks of `block_size` tokens, all free.
    ///
    /// # Panics
    /// If either is zero, or `num_blocks` does not fit a `u32` block id.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(num_blocks > 0, "the KV cache needs at least one block");
        assert!(block_size > 0, "block_size must be positive");
        assert!(
            num_blocks < NIL as usize,
            "too many blocks for u32 block ids"
        );
        let n = num_blocks as u32;
        Self {
            block_size,
            ref_counts: vec![0; num_blocks],
            prev: (0..n).map(|b| if b == 0 { NIL } else { b - 1 }).collect(),
            next: (0..n)
                .map(|b| if b + 1 == n { NIL } else { b + 1 })
                .collect(),
            head: 0,
            tail: n - 1,
            num_free: num_blocks,
            cache: CacheMap::default(),
            block_key: vec![None; num_blocks],
            block_parent: vec![0; num_blocks],
            block_tokens: vec![0; num_blocks * block_size],
            block_starts: vec![false; num_blocks],
            block_adapter: vec![None; num_blocks],
            stats: PrefixCacheStats::default(),
            epoch: 0,
            events: None,
        }
    }

    /// From now on, records every block that enters or leaves the prefix cache as a
    /// [`KvCacheEvent`], for [`BlockManager::drain_events`] to collect. Off by default: then
    /// nothing is recorded and nothing allocated.
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// Moves the events recorded since the last call to the end of `out`, in the order they
    /// happened.
    pub fn drain_events(&mut self, out: &mut Vec<KvCacheEvent>) {
        if let Some(events) = &mut self.events {
            out.append(events);
        }
    }

    /// Every block findable in the prefix cache, in use or not: what replaying all events so
    /// far gives.
    pub fn cached_blocks(&self) -> Vec<CachedBlock> {
        let bs = self.block_size;
        self.cache
            .iter()
            .map(|(&hash, &b)| {
                let bu = b as usize;
                CachedBlock {
                    hash,
                    parent_hash: (!self.block_starts[bu]).then_some(self.block_parent[bu]),
                    token_ids: self.block_tokens[bu * bs..(bu + 1) * bs].to_vec(),
                    lora_name: self.block_adapter[bu].clone(),
                }
            })
            .collect()
    }

    /// Drops every block from the prefix cache (their contents stay with the sequences that
    /// hold them, but no new sequence finds them); returns how many there were.
    pub fn clear_prefix_cache(&mut self) -> usize {
        let n = self.cache.len();
        self.cache.clear();
        self.block_key.fill(None);
        self.epoch += 1;
        if let Some(events) = &mut self.events {
            events.push(KvCacheEvent::AllCleared);
        }
        n
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks with ref count 0, including those that still hold cached prefixes.
    pub fn num_free_blocks(&self) -> usize {
        self.num_free
    }

    /// Blocks referenced by at least one sequence.
    pub fn num_used_blocks(&self) -> usize {
        self.num_blocks() - self.num_free
    }

    /// Blocks findable in the prefix cache, in use or not.
    pub fn num_cached_blocks(&self) -> usize {
        self.cache.len()
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// Finds the longest run of leading full blocks of `tokens` in the cache, without taking
    /// them. Never covers all of `tokens`: at least one token is left to compute so the forward
    /// has logits to sample from.
    ///
    /// # Panics
    /// If `table` holds blocks.
    pub fn find_cached_prefix(&mut self, table: &mut BlockTable, tokens: &[u32]) -> CachedPrefix {
        self.find_cached_prefix_within(table, tokens, usize::MAX)
    }

    /// [`BlockManager::find_cached_prefix`] of at most `limit` blocks.
    pub fn find_cached_prefix_within(
        &mut self,
        table: &mut BlockTable,
        tokens: &[u32],
        limit: usize,
    ) -> CachedPrefix {
        let max_blocks = self.lookup_limit(table, tokens, limit);
        let mut num_blocks = 0;
        let mut num_evictable = 0;
        while num_blocks < max_blocks {
            match self.cached_block(table, tokens, num_blocks) {
                Some(b) => {
                    if self.ref_counts[b as usize] == 0 {
                        num_evictable += 1;
                    }
                    num_blocks += 1;
                }
                None => break,
            }
        }
        self.prefix(num_blocks, 0, num_evictable, tokens)
    }

    /// For a sliding-window pool of `window` tokens: the most leading blocks (at most `limit`)
    /// that a sequence may skip computing because this pool holds what the window of its first
    /// computed token reaches, the blocks from [`BlockManager::window_start_block`] on. The
    /// blocks before are not needed, cached or not.
    ///
    /// # Panics
    /// If `table` holds blocks.
    pub fn find_cached_window(
        &mut self,
        table: &mut BlockTable,
        tokens: &[u32],
        window: usize,
        limit: usize,
    ) -> CachedPrefix {
        let max_blocks = self.lookup_limit(table, tokens, limit);
        let mut num_blocks = 0;
        // The first block of the run of cached blocks that ends at the block looked at.
        let mut run_start = 0;
        for i in 0..max_blocks {
            if self.cached_block(table, tokens, i).is_none() {
                run_start = i + 1;
            } else if run_start <= self.window_start_block(i + 1, window) {
                num_blocks = i + 1;
            }
        }
        let first_block = self.window_start_block(num_blocks, window);
        let num_evictable = (first_block..num_blocks)
            .filter(|&i| {
                let b = self.cache[&table.hashes[i]];
                self.ref_counts[b as usize] == 0
            })
            .count();
        self.prefix(num_blocks, first_block, num_evictable, tokens)
    }

    /// The first block that the window of `window` tokens of the token at position
    /// `num_blocks * block_size` reaches: a sequence whose next computed token is that one
    /// never reads the blocks before it again.
    pub fn window_start_block(&self, num_blocks: usize, window: usize) -> usize {
        (num_blocks * self.block_size + 1).saturating_sub(window) / self.block_size
    }

    /// Full blocks a lookup for an empty `table` may cover: at most `limit`, and never the
    /// last token's (it is left to compute, for the logits).
    ///
    /// # Panics
    /// If `table` holds blocks.
    fn lookup_limit(&self, table: &BlockTable, tokens: &[u32], limit: usize) -> usize {
        assert!(
            table.blocks.is_empty(),
            "prefix lookup on a table that holds blocks"
        );
        (tokens.len().saturating_sub(1) / self.block_size).min(limit)
    }

    /// A lookup's result, valid until the manager next changes.
    fn prefix(
        &self,
        num_blocks: usize,
        first_block: usize,
        num_evictable: usize,
        tokens: &[u32],
    ) -> CachedPrefix {
        CachedPrefix {
            num_blocks,
            first_block,
            num_evictable,
            num_query_tokens: tokens.len(),
            epoch: self.epoch,
        }
    }

    /// The cached block holding block `i` of `tokens`, if any.
    fn cached_block(
        &mut self,
        table: &mut BlockTable,
        tokens: &[u32],
        i: usize,
    ) -> Option<BlockId> {
        let key = self.ensure_hash(table, tokens, i);
        let parent = Self::parent_key(table, i);
        let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
        match self.cache.get(&key) {
            Some(&b) if self.holds(b, parent, chunk) => Some(b),
            _ => None,
        }
    }

    /// Whether a block of chain hash `hash` is in the prefix cache.
    pub fn is_cached(&self, hash: u64) -> bool {
        self.cache.contains_key(&hash)
    }

    /// Whether [`BlockManager::allocate_with_prefix`] would succeed.
    pub fn can_allocate_with_prefix(&self, prefix: &CachedPrefix, num_tokens: usize) -> bool {
        let total = self.blocks_for(num_tokens).max(prefix.num_blocks);
        total - prefix.num_blocks <= self.num_free - prefix.num_evictable
    }

    /// Gives an empty `table` the cached blocks of `prefix` (shared by reference; placeholders
    /// before its `first_block`) plus fresh blocks up to `num_tokens` tokens, or changes
    /// nothing and returns false when the free pool is too small. Counts the lookup in the
    /// prefix-cache stats when it succeeds.
    ///
    /// # Panics
    /// If the manager changed since `prefix` was found, or `table` holds blocks.
    pub fn allocate_with_prefix(
        &mut self,
        table: &mut BlockTable,
        prefix: &CachedPrefix,
        num_tokens: usize,
    ) -> bool {
        assert_eq!(prefix.epoch, self.epoch, "stale CachedPrefix");
        assert!(
            table.blocks.is_empty(),
            "allocate_with_prefix on a table that holds blocks"
        );
        if !self.can_allocate_with_prefix(prefix, num_tokens) {
            return false;
        }
        let total = self.blocks_for(num_tokens).max(prefix.num_blocks);
        table.blocks.reserve(total);
        table.blocks.resize(prefix.first_block, 0);
        table.first_live = prefix.first_block;
        for i in prefix.first_block..prefix.num_blocks {
            let b = self.cache[&table.hashes[i]];
            self.acquire(b);
            table.blocks.push(b);
        }
        for _ in prefix.num_blocks..total {
            let b = self.take_free();
            table.blocks.push(b);
        }
        table.num_registered = prefix.num_blocks;
        self.stats.queries += prefix.num_query_tokens as u64;
        self.stats.hits += (prefix.num_blocks * self.block_size) as u64;
        self.epoch += 1;
        true
    }

    /// Whether [`BlockManager::allocate`] would succeed.
    pub fn can_allocate(&self, table: &BlockTable, num_tokens: usize) -> bool {
        self.blocks_for(num_tokens)
            .saturating_sub(table.blocks.len())
            <= self.num_free
    }

    /// Grows `table` to hold `num_tokens` tokens, or changes nothing and returns false when the
    /// free pool is too small.
    pub fn allocate(&mut self, table: &mut BlockTable, num_tokens: usize) -> bool {
        let need = self
            .blocks_for(num_tokens)
            .saturating_sub(table.blocks.len());
        if need == 0 {
            return true;
        }
        if need > self.num_free {
            return false;
        }
        for _ in 0..need {
            let b = self.take_free();
            table.blocks.push(b);
        }
        self.epoch += 1;
        true
    }

    /// Gives back the blocks of `table` before block `first_kept` (a sliding window's blocks
    /// that no later token reads), leaving placeholders. Only registered blocks go: they are
    /// full and computed, and stay findable in the prefix cache until reused.
    pub fn release_before(&mut self, table: &mut BlockTable, first_kept: usize) {
        let end = first_kept.min(table.num_registered);
        if end <= table.first_live {
            return;
        }
        for i in table.first_live..end {
            self.release(table.blocks[i]);
            table.blocks[i] = 0;
        }
        table.first_live = end;
        self.epoch += 1;
    }

    /// Returns every block of `table` to the pool (blocks shared with others just lose one
    /// reference). Cached content stays findable until the block is reused.
    pub fn free(&mut self, table: &mut BlockTable) {
        // Reverse order: a sequence's last blocks are the least likely to be shared by a later
        // prompt, so they should be the first cached ones evicted.
        for i in (table.first_live..table.blocks.len()).rev() {
            self.release(table.blocks[i]);
        }
        table.blocks.clear();
        table.first_live = 0;
        table.num_registered = 0;
        self.epoch += 1;
    }

    /// Records that the first `num_computed` of `tokens` have their K/V in `table`'s blocks,
    /// and offers each newly full block to the prefix cache. A block whose key is already cached
    /// (another sequence computed the same prefix) stays private.
    ///
    /// # Panics
    /// If `table` does not cover `num_computed` tokens, or `tokens` is shorter.
    pub fn register_computed(
        &mut self,
        table: &mut BlockTable,
        tokens: &[u32],
        num_computed: usize,
    ) {
        assert!(
            num_computed <= tokens.len(),
            "more tokens computed than known"
        );
        let full = num_computed / self.block_size;
        assert!(
            full <= table.blocks.len(),
            "table does not cover the computed tokens"
        );
        let bs = self.block_size;
        // Whether the last event recorded is this call's `Stored` ending at block `i - 1`, so
        // block `i` extends it.
        let mut extends_run = false;
        while table.num_registered < full {
            let i = table.num_registered;
            let key = self.ensure_hash(table, tokens, i);
            let b = table.blocks[i];
            let bu = b as usize;
            let chunk = &tokens[i * bs..(i + 1) * bs];
            if self.block_key[bu].is_none() && !self.cache.contains_key(&key) {
                let parent = Self::parent_key(table, i);
                self.cache.insert(key, b);
                self.block_key[bu] = Some(key);
                self.block_parent[bu] = parent;
                self.block_tokens[bu * bs..(bu + 1) * bs].copy_from_slice(chunk);
                self.block_starts[bu] = i == 0;
                self.block_adapter[bu] = table.adapter().map(|a| a.name.clone());
                self.epoch += 1;
                if let Some(events) = &mut self.events {
                    match events.last_mut() {
                        Some(KvCacheEvent::Stored {
                            block_hashes,
                            token_ids,
                            ..
                        }) if extends_run => {
                            block_hashes.push(key);
                            token_ids.extend_from_slice(chunk);
                        }
                        _ => events.push(KvCacheEvent::Stored {
                            block_hashes: vec![key],
                            parent_block_hash: (i > 0).then_some(parent),
                            token_ids: chunk.to_vec(),
                            lora_name: table.adapter().map(|a| a.name.clone()),
                        }),
                    }
                    extends_run = true;
                }
            } else {
                extends_run = false;
            }
            table.num_registered += 1;
        }
    }

    /// Checks the manager against every live table: each block's ref count equals its number
    /// of occurrences in the tables (so nothing leaked and nothing was freed twice), the free
    /// queue holds exactly the unreferenced blocks, uncached before cached, and the cache map
    /// and per-block keys agree. O(blocks); meant for tests and debugging.
    pub fn check_consistency<'a>(
        &self,
        tables: impl IntoIterator<Item = &'a BlockTable>,
    ) -> Result<(), String> {
        let n = self.num_blocks();
        let mut counts = vec![0u32; n];
        for t in tables {
            if t.first_live > t.num_registered {
                return Err(format!(
                    "table dropped {} blocks but registered only {}",
                    t.first_live, t.num_registered
                ));
            }
            if t.blocks[..t.first_live].iter().any(|&b| b != 0) {
                return Err("a placeholder entry is not block 0".into());
            }
            for &b in t.live_blocks() {
                let c = counts
                    .get_mut(b as usize)
                    .ok_or_else(|| format!("block id {b} out of range"))?;
                *c += 1;
            }
            if t.num_registered > t.blocks.len() {
                return Err(format!(
                    "table registered {} blocks but holds {}",
                    t.num_registered,
                    t.blocks.len()
                ));
            }
        }
        for (b, (&c, &r)) in counts.iter().zip(&self.ref_counts).enumerate() {
            if c != r {
                return Err(format!("block {b}: ref count {r} but {c} table references"));
            }
        }
        let mut seen = vec![false; n];
        let mut walked = 0;
        let mut cur = self.head;
        let mut prev = NIL;
        let mut in_cached_part = false;
        while cur != NIL {
            let b = cur as usize;
            if b >= n || seen[b] {
                return Err(format!("free queue is corrupt at block {cur}"));
            }
            seen[b] = true;
            if self.prev[b] != prev {
                return Err(format!("free queue back link of block {b} is wrong"));
            }
            if self.ref_counts[b] != 0 {
                return Err(format!(
                    "block {b} is in the free queue with ref count {}",
                    self.ref_counts[b]
                ));
            }
            let cached = self.block_key[b].is_some();
            if in_cached_part && !cached {
                return Err(format!("uncached free block {b} queued behind cached ones"));
            }
            in_cached_part |= cached;
            walked += 1;
            prev = cur;
            cur = self.next[b];
        }
        if prev != self.tail {
            return Err("free queue tail is wrong".into());
        }
        let unreferenced = self.ref_counts.iter().filter(|&&r| r == 0).count();
        if walked != self.num_free || unreferenced != self.num_free {
            return Err(format!(
                "free count {} but {walked} queued and {unreferenced} unreferenced",
                self.num_free
            ));
        }
        for (&key, &b) in &self.cache {
            if self.block_key.get(b as usize).copied().flatten() != Some(key) {
                return Err(format!(
                    "cache entry {key:#x} points at block {b}, which has another key"
                ));
            }
        }
        let keyed = self.block_key.iter().filter(|k| k.is_some()).count();
        if keyed != self.cache.len() {
            return Err(format!(
                "{keyed} blocks carry keys but the cache has {}",
                self.cache.len()
            ));
        }
        Ok(())
    }

    fn parent_key(table: &BlockTable, i: usize) -> u64 {
        if i == 0 {
            table.root()
        } else {
            table.hashes[i - 1]
        }
    }

    /// The chain hash of block `i` of `tokens` (its tokens `0..(i + 1) * block_size`), which
    /// `table` memoises.
    pub fn ensure_hash(&self, table: &mut BlockTable, tokens: &[u32], i: usize) -> u64 {
        let bs = self.block_size;
        while table.hashes.len() <= i {
            let j = table.hashes.len();
            let h = chain_hash(Self::parent_key(table, j), &tokens[j * bs..(j + 1) * bs]);
            table.hashes.push(h);
        }
        table.hashes[i]
    }

    fn holds(&self, b: BlockId, parent: u64, tokens: &[u32]) -> bool {
        let bu = b as usize;
        self.block_parent[bu] == parent
            && self.block_tokens[bu * self.block_size..(bu + 1) * self.block_size] == *tokens
    }

    /// Takes the block at the head of the free queue, evicting its cached content if any.
    fn take_free(&mut self) -> BlockId {
        let b = self.head;
        assert!(b != NIL, "free queue empty (callers check num_free first)");
        self.unlink(b);
        if let Some(key) = self.block_key[b as usize].take() {
            let removed = self.cache.remove(&key);
            debug_assert_eq!(removed, Some(b));
            if let Some(events) = &mut self.events {
                match events.last_mut() {
                    Some(KvCacheEvent::Removed { block_hashes }) => block_hashes.push(key),
                    _ => events.push(KvCacheEvent::Removed {
                        block_hashes: vec![key],
                    }),
                }
            }
        }
        self.ref_counts[b as usize] = 1;
        b
    }

    fn acquire(&mut self, b: BlockId) {
        if self.ref_counts[b as usize] == 0 {
            self.unlink(b);
        }
        self.ref_counts[b as usize] += 1;
    }

    fn release(&mut self, b: BlockId) {
        let rc = &mut self.ref_counts[b as usize];
        assert!(*rc > 0, "block {b} freed twice");
        *rc -= 1;
        if *rc == 0 {
            if self.block_key[b as usize].is_some() {
                self.push_back(b);
            } else {
                self.push_front(b);
            }
        }
    }

    fn unlink(&mut self, b: BlockId) {
        let bu = b as usize;
        let (p, n) = (self.prev[bu], self.next[bu]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[bu] = NIL;
        self.next[bu] = NIL;
        self.num_free -= 1;
    }

    fn push_back(&mut self, b: BlockId) {
        let bu = b as usize;
        self.prev[bu] = self.tail;
        self.next[bu] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn push_front(&mut self, b: BlockId) {
        let bu = b as usize;
        self.next[bu] = self.head;
        self.prev[bu] = NIL;
        if self.head == NIL {
            self.tail = b;
        } else {
            self.prev[self.head as usize] = b;
        }
        self.head = b;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table holding `tokens` fully computed and registered, like a sequence after prefill.
    fn computed(bm: &mut BlockManager, tokens: &[u32]) -> BlockTable {
        let mut t = BlockTable::new();
        let prefix = bm.find_cached_prefix(&mut t, tokens);
        assert!(bm.allocate_with_prefix(&mut t, &prefix, tokens.len()));
        bm.register_computed(&mut t, tokens, tokens.len());
        t
    }

    fn hit_blocks(bm: &mut BlockManager, tokens: &[u32]) -> usize {
        bm.find_cached_prefix(&mut BlockTable::new(), tokens)
            .num_blocks
    }

    #[test]
    fn cached_blocks_are_evicted_least_recently_freed_first_after_uncached_ones() {
        let mut bm = BlockManager::new(4, 2);
        let mut x = computed(&mut bm, &[1, 2]);
        let mut y = computed(&mut bm, &[3, 4]);
        let mut z = computed(&mut bm, &[5, 6]);
        let (bx, by, bz) = (x.blocks()[0], y.blocks()[0], z.blocks()[0]);
        for t in [&mut x, &mut y, &mut z] {
            bm.free(t);
        }
        assert_eq!(bm.num_used_blocks(), 0);
        assert_eq!(bm.num_cached_blocks(), 3);
        bm.check_consistency([]).unwrap();

        // The one never-cached block goes first, then X (freed longest ago).
        let mut a = BlockTable::new();
        assert!(bm.allocate(&mut a, 4));
        assert!(!a.blocks().contains(&by) && !a.blocks().contains(&bz));
        assert!(a.blocks().contains(&bx));
        assert_eq!(hit_blocks(&mut bm, &[1, 2, 0]), 0, "X was evicted");
        assert_eq!(hit_blocks(&mut bm, &[3, 4, 0]), 1);
        assert_eq!(hit_blocks(&mut bm, &[5, 6, 0]), 1);

        // Reusing Y makes it the most recently used, so Z goes next.
        let mut y2 = computed(&mut bm, &[3, 4, 9]);
        assert_eq!(y2.blocks()[0], by);
        bm.free(&mut y2);
        let mut b = BlockTable::new();
        assert!(bm.allocate(&mut b, 2));
        assert_eq!(b.blocks(), &[bz]);
        assert_eq!(hit_blocks(&mut bm, &[5, 6, 0]), 0, "Z was evicted");
        assert_eq!(hit_blocks(&mut bm, &[3, 4, 0]), 1, "Y survived");
        bm.free(&mut a);
        bm.free(&mut b);
        bm.check_consistency([]).unwrap();
    }

    #[test]
    fn a_sequence_frees_its_tail_blocks_to_eviction_first() {
        let mut bm = BlockManager::new(3, 2);
        let mut t = computed(&mut bm, &[1, 2, 3, 4, 5, 6]);
        let blocks = t.blocks().to_vec();
        bm.free(&mut t);
        let mut a = BlockTable::new();
        assert!(bm.allocate(&mut a, 2));
        assert_eq!(a.blocks(), &[blocks[2]]);
        assert_eq!(hit_blocks(&mut bm, &[1, 2, 3, 4, 5, 6, 7]), 2);
        bm.free(&mut a);
    }

    #[test]
    fn lookup_leaves_at_least_one_token_to_compute() {
        let mut bm = BlockManager::new(8, 4);
        let tokens: Vec<u32> = (0..8).collect();
        let mut t = computed(&mut bm, &tokens);
        assert_eq!(
            hit_blocks(&mut bm, &tokens),
            1,
            "8 tokens: only the first block may hit"
        );
        assert_eq!(hit_blocks(&mut bm, &tokens[..4]), 0);
        let mut longer = tokens.clone();
        longer.push(99);
        assert_eq!(hit_blocks(&mut bm, &longer), 2);
        let mut other = tokens.clone();
        other[1] = 77;
        other.push(1);
        assert_eq!(
            hit_blocks(&mut bm, &other),
            0,
            "a different first block breaks the chain"
        );
        bm.free(&mut t);
    }

    #[test]
    fn shared_blocks_are_counted_by_reference() {
        let mut bm = BlockManager::new(8, 4);
        let prompt: Vec<u32> = (0..10).collect();
        let mut a = computed(&mut bm, &prompt);
        assert_eq!(bm.num_used_blocks(), 3);
        let mut b = computed(&mut bm, &prompt);
        assert_eq!(&b.blocks()[..2], &a.blocks()[..2]);
        assert_ne!(b.blocks()[2], a.blocks()[2], "the partial tail is private");
        assert_eq!(bm.num_used_blocks(), 4);
        assert_eq!(
            bm.prefix_cache_stats(),
            PrefixCacheStats {
                queries: 20,
                hits: 8
            }
        );
        bm.check_consistency([&a, &b]).unwrap();
        bm.free(&mut a);
        assert_eq!(bm.num_used_blocks(), 3);
        bm.check_consistency([&b]).unwrap();
        bm.free(&mut b);
        assert_eq!(bm.num_used_blocks(), 0);
        bm.check_consistency([]).unwrap();
    }

    #[test]
    fn allocation_is_all_or_nothing() {
        let mut bm = BlockManager::new(4, 4);
        let mut a = BlockTable::new();
        assert!(bm.allocate(&mut a, 12));
        let mut b = BlockTable::new();
        assert!(!bm.allocate(&mut b, 8));
        assert!(b.is_empty());
        assert_eq!(bm.num_free_blocks(), 1);
        assert!(bm.allocate(&mut a, 16));
        assert!(!bm.allocate(&mut a, 17));
        assert_eq!(a.len(), 4);
        bm.check_consistency([&a, &b]).unwrap();
        bm.free(&mut a);
        bm.check_consistency([]).unwrap();
    }

    #[test]
    fn a_prefix_on_free_blocks_counts_against_the_free_pool() {
        let mut bm = BlockManager::new(3, 2);
        let mut a = computed(&mut bm, &[1, 2, 3, 4]);
        bm.free(&mut a);
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut t = BlockTable::new();
        let prefix = bm.find_cached_prefix(&mut t, &tokens);
        assert_eq!((prefix.num_blocks, prefix.num_evictable), (2, 2));
        // 2 cached + 2 fresh > 3 blocks, even though 3 are "free".
        assert!(!bm.allocate_with_prefix(&mut t, &prefix, 8));
        assert!(bm.allocate_with_prefix(&mut t, &prefix, 6));
        assert_eq!(bm.num_used_blocks(), 3);
        assert_eq!(bm.prefix_cache_stats().hits, 4);
        bm.free(&mut t);
        bm.check_consistency([]).unwrap();
    }

    #[test]
    fn a_duplicate_full_block_stays_private() {
        let mut bm = BlockManager::new(4, 2);
        let mut a = BlockTable::new();
        let mut b = BlockTable::new();
        for t in [&mut a, &mut b] {
            let p = bm.find_cached_prefix(t, &[1, 2, 3]);
            assert!(bm.allocate_with_prefix(t, &p, 3));
        }
        bm.register_computed(&mut a, &[1, 2, 3], 2);
        bm.register_computed(&mut b, &[1, 2, 3], 2);
        assert_eq!(bm.num_cached_blocks(), 1);
        bm.free(&mut a);
        bm.free(&mut b);
        bm.check_consistency([]).unwrap();
        assert_eq!(hit_blocks(&mut bm, &[1, 2, 3]), 1);
    }

    #[test]
    #[should_panic(expected = "stale CachedPrefix")]
    fn a_stale_prefix_is_refused() {
        let mut bm = BlockManager::new(4, 2);
        let mut t = BlockTable::new();
        let p = bm.find_cached_prefix(&mut t, &[1, 2, 3]);
        let mut other = BlockTable::new();
        assert!(bm.allocate(&mut other, 2));
        bm.allocate_with_prefix(&mut t, &p, 3);
    }

    /// Applies `events` to `set` as a subscriber would.
    fn replay(set: &mut std::collections::HashSet<u64>, events: &[KvCacheEvent]) {
        for e in events {
            match e {
                KvCacheEvent::Stored { block_hashes, .. } => set.extend(block_hashes),
                KvCacheEvent::Removed { block_hashes } => {
                    for h in block_hashes {
                        assert!(set.remove(h), "removed a block never stored");
                    }
                }
                KvCacheEvent::AllCleared => set.clear(),
            }
        }
    }

    fn cached_set(bm: &BlockManager) -> std::collections::HashSet<u64> {
        bm.cached_blocks().iter().map(|b| b.hash).collect()
    }

    /// The same tokens under the base and under an adapter: two cache entries, neither found
    /// by the other; the adapter's first block has no public parent and carries its name.
    #[test]
    fn an_adapter_s_blocks_hang_from_its_own_root() {
        let mut bm = BlockManager::new(8, 2);
        bm.record_events();
        let tokens = [1, 2, 3, 4, 5];
        let base = computed(&mut bm, &tokens);
        let mut adapted = BlockTable::new();
        adapted.set_adapter(Some(AdapterKey {
            id: 7,
            name: "fr".into(),
        }));
        let prefix = bm.find_cached_prefix(&mut adapted, &tokens);
        assert_eq!(
            prefix.num_tokens(2),
            0,
            "the base's blocks are not the adapter's"
        );
        assert!(bm.allocate_with_prefix(&mut adapted, &prefix, 5));
        bm.register_computed(&mut adapted, &tokens, 5);
        let mut events = Vec::new();
        bm.drain_events(&mut events);
        let Some(KvCacheEvent::Stored {
            parent_block_hash,
            lora_name,
            ..
        }) = events.last()
        else {
            panic!("expected a Stored last, got {events:?}");
        };
        assert_eq!(*parent_block_hash, None);
        assert_eq!(lora_name.as_deref(), Some("fr"));
        assert_eq!(bm.num_cached_blocks(), 4);
        let starts: Vec<_> = bm
            .cached_blocks()
            .into_iter()
            .filter(|b| b.parent_hash.is_none())
            .map(|b| b.lora_name)
            .collect();
        assert_eq!(starts.len(), 2);
        assert!(starts.contains(&None) && starts.contains(&Some("fr".into())));
        let mut again = BlockTable::new();
        again.set_adapter(Some(AdapterKey {
            id: 7,
            name: "fr".into(),
        }));
        assert_eq!(bm.find_cached_prefix(&mut again, &tokens).num_tokens(2), 4);
        drop((base, adapted));
    }

    #[test]
    fn events_describe_every_change_to_the_cache() {
        let mut bm = BlockManager::new(4, 2);
        bm.record_events();
        let mut seen = std::collections::HashSet::new();
        let mut events = Vec::new();
        // Two blocks stored in one run, the first starting the sequence.
        let mut a = computed(&mut bm, &[1, 2, 3, 4, 5]);
        bm.drain_events(&mut events);
        let [KvCacheEvent::Stored {
            block_hashes,
            parent_block_hash,
            token_ids,
            lora_name,
        }] = events.as_slice()
        else {
            panic!("expected one Stored, got {events:?}");
        };
        assert_eq!(block_hashes.len(), 2);
        assert_eq!(*parent_block_hash, None);
        assert_eq!(*lora_name, None);
        assert_eq!(token_ids, &[1, 2, 3, 4]);
        let blocks = bm.cached_blocks();
        let second = blocks.iter().find(|b| b.hash == block_hashes[1]).unwrap();
        assert_eq!(second.parent_hash, Some(block_hashes[0]));
        assert_eq!(second.token_ids, [3, 4]);
        replay(&mut seen, &events);
        events.clear();
        bm.free(&mut a);
        // Freed blocks stay cached: no event. Filling the pool evicts them.
        bm.drain_events(&mut events);
        assert!(events.is_empty());
        let mut b = BlockTable::new();
        assert!(bm.allocate(&mut b, 8));
        bm.drain_events(&mut events);
        assert!(
            matches!(events.as_slice(), [KvCacheEvent::Removed { block_hashes }] if block_hashes.len() == 2),
            "{events:?}"
        );
        replay(&mut seen, &events);
        assert_eq!(seen, cached_set(&bm));
        assert!(seen.is_empty());
        bm.free(&mut b);
        events.clear();
        let _c = computed(&mut bm, &[9, 9, 9]);
        assert_eq!(bm.clear_prefix_cache(), 1);
        bm.drain_events(&mut events);
        assert!(matches!(events.last(), Some(KvCacheEvent::AllCleared)));
        replay(&mut seen, &events);
        assert!(seen.is_empty() && cached_set(&bm).is_empty());
        assert_eq!(hit_blocks(&mut bm, &[9, 9, 9]), 0);
    }

    #[test]
    fn a_block_kept_private_splits_the_stored_run() {
        let mut bm = BlockManager::new(8, 2);
        bm.record_events();
        // `a` caches the first block of [1, 2, ...]; `b` computes the same first block itself
        // (allocated before `a` registered it), so only its second and third blocks are new.
        let mut a = BlockTable::new();
        let mut b = BlockTable::new();
        let p = bm.find_cached_prefix(&mut a, &[1, 2, 0]);
        assert!(bm.allocate_with_prefix(&mut a, &p, 3));
        let p = bm.find_cached_prefix(&mut b, &[1, 2, 3, 4, 5, 6, 0]);
        assert!(bm.allocate_with_prefix(&mut b, &p, 7));
        bm.register_computed(&mut a, &[1, 2, 0], 2);
        bm.register_computed(&mut b, &[1, 2, 3, 4, 5, 6, 0], 6);
        let mut events = Vec::new();
        bm.drain_events(&mut events);
        let mut seen = std::collections::HashSet::new();
        replay(&mut seen, &events);
        assert_eq!(seen, cached_set(&bm));
        assert_eq!(seen.len(), 3);
        let KvCacheEvent::Stored {
            block_hashes,
            parent_block_hash,
            ..
        } = &events[1]
        else {
            panic!("{events:?}");
        };
        assert_eq!(block_hashes.len(), 2);
        assert!(parent_block_hash.is_some_and(|p| seen.contains(&p)));
        bm.free(&mut a);
        bm.free(&mut b);
        bm.check_consistency([]).unwrap();
    }

    #[test]
    fn nothing_is_recorded_unless_asked() {
        let mut bm = BlockManager::new(4, 2);
        let _a = computed(&mut bm, &[1, 2, 3]);
        let mut events = Vec::new();
        bm.drain_events(&mut events);
        assert!(events.is_empty());
    }
}
