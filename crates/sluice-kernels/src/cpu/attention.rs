//! Paged attention for CPU tensors that reads K/V blocks where they lie: no gather, no repeat
//! of K/V over the query heads of a group, one pass of online softmax per chunk of keys.
//!
//! Work is split into items of (sequence, KV head, run of queries) and spread over rayon's pool:
//! a decode step of B sequences gives `B * num_kv_heads` items, a long prefill chunk gives many
//! query runs. Within an item each key chunk (16 keys, one register wide) is loaded once and
//! used by every query head of the group and every query of the run while it is in L1.
//!
//! At decode the kernel is bound by reading the cache (64 sequences x 256 tokens is ~25 MB per
//! layer in f32), which is why the cache may hold f16: half the bytes, converted in registers.
//! The [`KvLayout`] makes a chunk's scores `head_dim` broadcast-FMAs over 16 lanes with no
//! horizontal sums, and its values contiguous rows.
//!
//! The kernel needs a head dimension that is a multiple of 16 and either AVX-512 (F, BW, F16C:
//! a chunk is one register, [`avx512`]) or AVX2 with FMA and F16C (a chunk is two registers,
//! [`avx2`]); [`fast`] says whether one runs. Elsewhere the same work items run in portable
//! Rust ([`portable`]), exact per query whatever the step holds. This file holds the dispatch
//! and what the paths share: the work items, the walk over an item's blocks and chunks, and
//! the f32/f16 cache writer.

use std::cell::RefCell;

use rayon::prelude::*;

use crate::disjoint::DisjointSlice;
use crate::paged::{AttentionShape, KvLayout, SequenceSlice};

/// The element types a KV cache may hold: f32, and f16 (half the bytes that decode reads,
/// widened in registers). Sealed: the kernel knows how to load exactly these.
pub trait KvElem: Copy + Send + Sync + Into<f32> + avx512::Load + avx2::Load8 {
    /// The cache's value of `x` (rounded to nearest for f16).
    fn from_f32(x: f32) -> Self;
}
impl KvElem for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
}
impl KvElem for half::f16 {
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}

/// Queries of one sequence handled by one work item: enough to reuse each key chunk several
/// times, few enough that a long prompt still spreads over all cores.
const QUERY_RUN: usize = 16;
/// Keys per chunk: one AVX-512 register of f32.
const LANES: usize = 16;
/// Largest query-heads-per-KV-head group with a specialised kernel.
const MAX_GROUP: usize = 8;

/// Why [`paged_attention`] refused a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttentionError {
    #[error(
        "attention needs a head_dim (got {head_dim}) and query heads per KV head (got {group})"
    )]
    Unsupported { head_dim: usize, group: usize },
    #[error("attention buffers do not fit their shapes: {0}")]
    Shape(String),
}

/// Whether [`paged_attention`] runs for heads of `head_dim` in groups of `group`: always, on
/// a vector kernel where [`fast`] holds, else in portable Rust ([`portable`]).
pub fn supports(head_dim: usize, group: usize) -> bool {
    head_dim > 0 && group > 0
}

/// Whether a vector kernel (AVX-512 or AVX2) runs on this CPU for heads of `head_dim` in
/// groups of `group`.
pub fn fast(head_dim: usize, group: usize) -> bool {
    path(head_dim, group) != Path::Portable
}

mod avx2;
mod avx512;
mod portable;
mod q8;

pub use q8::{paged_attention_q8, write_q8, Q8Cache, Q8CacheMut, Q8_GROUP};

/// Writes the step's new keys and values `k, v: [T, num_kv_heads, head_dim]` (f32) into their
/// slots of one layer of an f32 or f16 cache, converted to its type. [`write_q8`] is the same
/// for an 8-bit cache.
pub fn write_kv<E: KvElem>(
    layout: &KvLayout,
    slots: &[u32],
    k: &[f32],
    v: &[f32],
    k_cache: &mut [E],
    v_cache: &mut [E],
) -> Result<(), AttentionError> {
    check_caches(layout, k_cache.len(), v_cache.len())?;
    check_rows(layout, slots, k, v)?;
    let (kvh, d) = (layout.num_kv_heads, layout.head_dim);
    for (t, &slot) in slots.iter().enumerate() {
        let slot = slot as usize;
        for h in 0..kvh {
            let row = (t * kvh + h) * d;
            for i in 0..d {
                k_cache[layout.k_offset(slot, h, i)] = E::from_f32(k[row + i]);
            }
            let at = layout.v_offset(slot, h, 0);
            for (dst, &x) in v_cache[at..at + d].iter_mut().zip(&v[row..row + d]) {
                *dst = E::from_f32(x);
            }
        }
    }
    Ok(())
}

/// Both caches hold a whole layer of `layout`.
fn check_caches(layout: &KvLayout, k_len: usize, v_len: usize) -> Result<(), AttentionError> {
    let n = layout.values_per_layer();
    if k_len < n || v_len < n {
        return Err(AttentionError::Shape(format!(
            "caches of {k_len} and {v_len} values for a layer of {n}"
        )));
    }
    Ok(())
}

/// The rows a cache write takes: one key and one value row of `num_kv_heads * head_dim` per
/// slot, and every slot inside the cache.
fn check_rows(
    layout: &KvLayout,
    slots: &[u32],
    k: &[f32],
    v: &[f32],
) -> Result<(), AttentionError> {
    let (kvh, d) = (layout.num_kv_heads, layout.head_dim);
    if k.len() != slots.len() * kvh * d || v.len() != k.len() {
        return Err(AttentionError::Shape(format!(
            "{} slots of {kvh}x{d} values got {} keys and {} values",
            slots.len(),
            k.len(),
            v.len()
        )));
    }
    if let Some(s) = slots.iter().find(|&&s| s as usize >= layout.num_slots()) {
        return Err(AttentionError::Shape(format!(
            "slot {s} is outside the cache's {} slots",
            layout.num_slots()
        )));
    }
    Ok(())
}

/// Which code computes a work item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// A chunk of 16 keys is one AVX-512 register.
    Avx512,
    /// A chunk is two AVX2 registers.
    Avx2,
    /// Plain Rust, one query at a time.
    Portable,
}

/// The fastest path this CPU has for the shape, within the kernel tier allowed
/// ([`super::limit_kernels`]): the two vector kernels give the same bits.
fn path(head_dim: usize, group: usize) -> Path {
    if !head_dim.is_multiple_of(LANES) || !(1..=MAX_GROUP).contains(&group) {
        return Path::Portable;
    }
    let (avx512, avx2) = cpu_features();
    if avx512 && super::allows(super::KernelTier::Avx512) {
        Path::Avx512
    } else if avx2 {
        Path::Avx2
    } else {
        Path::Portable
    }
}

/// (AVX-512 F, BW, VL, F16C and FMA; AVX2, FMA and F16C) on this CPU.
fn cpu_features() -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVAILABLE: OnceLock<(bool, bool)> = OnceLock::new();
        let (avx512, avx2) = *AVAILABLE.get_or_init(|| {
            let f16c_fma = is_x86_feature_detected!("f16c") && is_x86_feature_detected!("fma");
            (
                f16c_fma
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl"),
                f16c_fma && is_x86_feature_detected!("avx2"),
            )
        });
        (avx512, avx2)
    }
    #[cfg(not(target_arch = "x86_64"))]
    (false, false)
}

#[derive(Clone, Copy)]
struct WorkItem {
    seq: usize,
    kv_head: usize,
    query_begin: usize,
    query_end: usize,
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Attention of every query token of a step over its own sequence's cached keys and values.
///
/// `q` is `[T, num_heads, head_dim]` for the `T` tokens the `sequences` lay out (token `i` of a
/// sequence at `query_start + i`, at position `context_len - query_len + i`), `k_cache` and
/// `v_cache` one layer of the cache in [`KvLayout`] order, `block_tables` the concatenated
/// tables the sequences index, and `out` `[T, num_heads * head_dim]`. Query `i` attends
/// causally to keys `0..=position(i)` (within `shape.window` where it has one), or, where
/// `key_ends` is not empty, to keys `0..key_ends[i]` (`[T]`: at least `position(i) + 1`, at
/// most the sequence's `context_len`, never decreasing along a sequence: the tokens of an image
/// see the whole image). `sinks`, one
/// logit per query head (gpt-oss's attention sinks), joins each head's softmax denominator as
/// a key without a value.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention<E: KvElem>(
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    layout: &KvLayout,
    sequences: &[SequenceSlice],
    key_ends: &[u32],
    block_tables: &[u32],
    shape: &AttentionShape,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), AttentionError> {
    let group = check_heads(shape, layout)?;
    let d = layout.head_dim;
    if !supports(d, group) {
        return Err(AttentionError::Unsupported { head_dim: d, group });
    }
    run_items(
        path(d, group),
        q,
        k_cache,
        v_cache,
        layout,
        sequences,
        key_ends,
        block_tables,
        shape,
        sinks,
        out,
    )
}

/// [`paged_attention`] on the given path, for a shape whose heads divide into groups over the
/// KV heads. A vector path this CPU or shape lacks is refused ([`path`] picks one it has).
#[allow(clippy::too_many_arguments)]
fn run_items<E: KvElem>(
    path: Path,
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    layout: &KvLayout,
    sequences: &[SequenceSlice],
    key_ends: &[u32],
    block_tables: &[u32],
    shape: &AttentionShape,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), AttentionError> {
    let (h, kvh, d) = (shape.num_heads, layout.num_kv_heads, layout.head_dim);
    let vector_shape = d.is_multiple_of(LANES) && (1..=MAX_GROUP).contains(&(h / kvh));
    let runs_here = match path {
        Path::Avx512 => vector_shape && cpu_features().0,
        Path::Avx2 => vector_shape && cpu_features().1,
        Path::Portable => true,
    };
    if !runs_here {
        return Err(AttentionError::Unsupported {
            head_dim: d,
            group: h / kvh,
        });
    }
    check_caches(layout, k_cache.len(), v_cache.len())?;
    let n = layout.values_per_layer();
    let kernel = Kernel::checked(
        q,
        out,
        sequences,
        key_ends,
        block_tables,
        layout,
        shape,
        sinks,
    )?;
    kernel.for_each_item(out, |item, scratch, out| {
        if path == Path::Portable {
            let kv = portable::Plain {
                k: &k_cache[..n],
                v: &v_cache[..n],
                layout,
            };
            return kernel.run_portable(item, &kv, scratch, out);
        }
        // SAFETY: the path runs on this CPU for this shape (checked above), the sizes and block
        // tables were checked against the cache, and each work item writes only its own
        // (token, head) rows of `out`.
        unsafe { kernel.run(path, item, &k_cache[..n], &v_cache[..n], scratch, out) }
    });
    Ok(())
}

/// The query heads divide into groups over the cache's KV heads, as `shape` says: returns the
/// group size.
fn check_heads(shape: &AttentionShape, layout: &KvLayout) -> Result<usize, AttentionError> {
    let (h, kvh, d) = (shape.num_heads, layout.num_kv_heads, layout.head_dim);
    if kvh == 0 || h % kvh != 0 || shape.head_dim != d || shape.num_kv_heads != kvh {
        return Err(AttentionError::Shape(format!(
            "{h} query heads over {kvh} KV heads of {d} (shape says {} of {})",
            shape.num_kv_heads, shape.head_dim
        )));
    }
    Ok(h / kvh)
}

/// `q` and `out` hold every token the sequences lay out.
fn check_queries(
    q: &[f32],
    out: &[f32],
    sequences: &[SequenceSlice],
    shape: &AttentionShape,
) -> Result<(), AttentionError> {
    let (h, d) = (shape.num_heads, shape.head_dim);
    let t = sequences
        .iter()
        .map(|s| s.query_start + s.query_len)
        .max()
        .unwrap_or(0);
    if q.len() < t * h * d || out.len() != q.len() {
        return Err(AttentionError::Shape(format!(
            "q {} and out {} for {t} tokens of {h}x{d}",
            q.len(),
            out.len()
        )));
    }
    Ok(())
}

/// Sinks, where given, are one finite logit per query head.
fn check_sinks(sinks: Option<&[f32]>, shape: &AttentionShape) -> Result<(), AttentionError> {
    match sinks {
        Some(s) if s.len() != shape.num_heads || !s.iter().all(|x| x.is_finite()) => {
            Err(AttentionError::Shape(format!(
                "{} sinks for {} query heads (each must be finite)",
                s.len(),
                shape.num_heads
            )))
        }
        _ => Ok(()),
    }
}

/// Key ends, where given, are one per token: from the causal end up to the sequence's
/// context, never decreasing along a sequence (so the queries that see a key are always a
/// run that ends at the sequence's last: the kernels' tiling rests on it).
fn check_key_ends(sequences: &[SequenceSlice], key_ends: &[u32]) -> Result<(), AttentionError> {
    if key_ends.is_empty() {
        return Ok(());
    }
    for s in sequences {
        let first_pos = s.context_len - s.query_len.min(s.context_len);
        let ends = key_ends.get(s.query_start..s.query_start + s.query_len);
        let fits = ends.is_some_and(|ends| {
            ends.iter().enumerate().all(|(i, &e)| {
                let e = e as usize;
                e > first_pos + i && e <= s.context_len && (i == 0 || e >= ends[i - 1] as usize)
            })
        });
        if !fits {
            return Err(AttentionError::Shape(format!(
                "key ends of sequence {s:?} are not each between its query's position + 1 and \
                 the context, never decreasing ({} ends given)",
                key_ends.len()
            )));
        }
    }
    Ok(())
}

/// Every block a query reads must be in the cache: the kernels address it unchecked.
fn check_tables(
    sequences: &[SequenceSlice],
    block_tables: &[u32],
    layout: &KvLayout,
) -> Result<(), AttentionError> {
    for s in sequences {
        let table = s
            .block_table_start
            .checked_add(s.block_table_len)
            .and_then(|end| block_tables.get(s.block_table_start..end));
        let fits = table.is_some_and(|table| {
            s.query_len <= s.context_len
                && table.len() * layout.block_size >= s.context_len
                && table.iter().all(|&b| (b as usize) < layout.num_blocks)
        });
        if !fits {
            return Err(AttentionError::Shape(format!(
                "sequence {s:?} does not fit its block table in a cache of {} blocks of {}",
                layout.num_blocks, layout.block_size
            )));
        }
    }
    Ok(())
}

/// The step's work items: per sequence and KV head, runs of up to [`QUERY_RUN`] queries.
fn work_items(sequences: &[SequenceSlice], kvh: usize) -> Vec<WorkItem> {
    sequences
        .iter()
        .enumerate()
        .flat_map(|(seq, s)| {
            (0..kvh).flat_map(move |kv_head| {
                (0..s.query_len)
                    .step_by(QUERY_RUN)
                    .map(move |query_begin| WorkItem {
                        seq,
                        kv_head,
                        query_begin,
                        query_end: (query_begin + QUERY_RUN).min(s.query_len),
                    })
            })
        })
        .collect()
}

struct Kernel<'a> {
    q: &'a [f32],
    sequences: &'a [SequenceSlice],
    /// `[T]` the end of each query's keys, or empty: causal ([`paged_attention`]).
    key_ends: &'a [u32],
    block_tables: &'a [u32],
    layout: &'a KvLayout,
    heads: usize,
    scale: f32,
    /// A sliding window's length: the query at position `p` sees keys `p + 1 - window..=p`.
    window: Option<usize>,
    /// One logit per query head counted in its softmax's denominator (attention sinks).
    sinks: Option<&'a [f32]>,
}

impl<'a> Kernel<'a> {
    /// The kernel over a step whose queries, output, block tables and sinks fit the shape and
    /// the cache: every path addresses them unchecked after this.
    #[allow(clippy::too_many_arguments)]
    fn checked(
        q: &'a [f32],
        out: &[f32],
        sequences: &'a [SequenceSlice],
        key_ends: &'a [u32],
        block_tables: &'a [u32],
        layout: &'a KvLayout,
        shape: &AttentionShape,
        sinks: Option<&'a [f32]>,
    ) -> Result<Self, AttentionError> {
        check_queries(q, out, sequences, shape)?;
        check_tables(sequences, block_tables, layout)?;
        check_key_ends(sequences, key_ends)?;
        check_sinks(sinks, shape)?;
        Ok(Self::new(
            q,
            sequences,
            key_ends,
            block_tables,
            layout,
            shape,
            sinks,
        ))
    }

    fn new(
        q: &'a [f32],
        sequences: &'a [SequenceSlice],
        key_ends: &'a [u32],
        block_tables: &'a [u32],
        layout: &'a KvLayout,
        shape: &AttentionShape,
        sinks: Option<&'a [f32]>,
    ) -> Self {
        Self {
            q,
            sequences,
            key_ends,
            block_tables,
            layout,
            heads: shape.num_heads,
            scale: shape.scale,
            window: shape.window,
            sinks,
        }
    }

    /// The end of the keys that token `token` (a row of the step), at position `pos`, sees.
    fn key_end(&self, token: usize, pos: usize) -> usize {
        match self.key_ends.get(token) {
            Some(&end) => end as usize,
            None => pos + 1,
        }
    }

    /// The first key the query at position `pos` sees: 0, or where its sliding window starts.
    fn window_start(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }

    /// Runs `f` on every work item of the step over rayon's pool, each with its thread's
    /// scratch buffer and the shared output.
    fn for_each_item(
        &self,
        out: &mut [f32],
        f: impl Fn(&WorkItem, &mut Vec<f32>, DisjointSlice<'_, f32>) + Sync,
    ) {
        let items = work_items(self.sequences, self.layout.num_kv_heads);
        let out = DisjointSlice::new(out);
        items
            .par_iter()
            .for_each(|item| SCRATCH.with(|scratch| f(item, &mut scratch.borrow_mut(), out)));
    }
}

impl Kernel<'_> {
    /// Computes one work item's rows of the output on a vector path.
    ///
    /// # Safety
    /// `path` is [`Path::Avx512`] or [`Path::Avx2`] and runs on this CPU for the shape; `k` and
    /// `v` hold the layout's values; the item's sequence fits its block table and the cache;
    /// no other task writes the item's rows of `out`.
    unsafe fn run<E: KvElem>(
        &self,
        path: Path,
        item: &WorkItem,
        k: &[E],
        v: &[E],
        scratch: &mut Vec<f32>,
        out: DisjointSlice<'_, f32>,
    ) {
        let (d, bs) = (self.layout.head_dim, self.layout.block_size);
        let group = self.heads / self.layout.num_kv_heads;
        let run_len = d * bs;
        let prefetch = |next: usize| {
            // Blocks lie anywhere in the pool, out of reach of the hardware prefetcher: ask for
            // the next block's keys and values while this one is computed (decode is bound by
            // reading the cache).
            let next = self.layout.block_head_offset(next, item.kv_head);
            avx512::prefetch(&k[next..next + run_len]);
            avx512::prefetch(&v[next..next + run_len]);
        };
        // Both kernels share each chunk's loads among the queries that see all of it.
        let tile = match path {
            Path::Avx512 => avx512::tile_queries(group),
            _ => avx2::tile_queries(group),
        };
        let chunk = |at: &ChunkAt, q: &[f32], queries: usize, state: RowState<'_>| {
            let run = self.layout.block_head_offset(at.block, item.kv_head);
            let chunk_args = Chunk {
                q,
                queries,
                group,
                q_stride: self.heads * d,
                k: &k[run + at.chunk..],
                k_stride: bs,
                v: &v[run + at.chunk * d..],
                head_dim: d,
                first_key: at.first_key,
                n_keys: at.n_keys,
                all_lanes_in_block: at.all_lanes_in_block,
                scale: self.scale,
            };
            // SAFETY: the path runs on this CPU for this shape, so the group is 1..=8 and
            // head_dim a multiple of 16 (the caller's promise); the chunk's keys and values lie
            // in the block; `run_item` gives each kernel at most its `tile_queries(group)`.
            unsafe {
                match path {
                    Path::Avx512 => avx512::chunk_for_rows(queries * group, &chunk_args, state),
                    _ => avx2::chunk_for_rows(queries * group, &chunk_args, state),
                }
            }
        };
        // SAFETY: the caller's promise: no other task writes the item's rows.
        unsafe { self.run_item(item, tile, scratch, out, prefetch, chunk) }
    }

    /// Runs one work item: for each chunk of 16 keys of each block its queries reach, and the
    /// queries of the item that see the chunk, `on_chunk` with where the chunk lies, the
    /// queries' heads (consecutive queries `q_stride` apart), how many queries, and their
    /// rows' softmax state (`prefetch` is told each next block first); then writes the item's
    /// rows of the output. Consecutive queries that see every key of the chunk go up to `tile`
    /// at a time; a query that sees only part of it (the causal diagonal) goes alone. Each row
    /// meets the same chunks in the same order whatever the tiling.
    ///
    /// # Safety
    /// No other task writes the item's (token, head) rows of `out`, which hold the step's
    /// tokens (checked before the items ran).
    unsafe fn run_item(
        &self,
        item: &WorkItem,
        tile: usize,
        scratch: &mut Vec<f32>,
        out: DisjointSlice<'_, f32>,
        prefetch: impl Fn(usize),
        on_chunk: impl Fn(&ChunkAt, &[f32], usize, RowState<'_>),
    ) {
        let (d, bs) = (self.layout.head_dim, self.layout.block_size);
        let group = self.heads / self.layout.num_kv_heads;
        let seq = &self.sequences[item.seq];
        let table = seq.block_table(self.block_tables);
        let first_pos = seq.context_len - seq.query_len;
        let rows = (item.query_end - item.query_begin) * group;
        let (maxes, sums, accs) = row_states(scratch, rows, d);
        if let Some(sinks) = self.sinks {
            // A sink is a key without a value: the online softmax starts from it, its running
            // maximum at the sink's logit and its sum at e^0.
            for (r, (max, sum)) in maxes.iter_mut().zip(sums.iter_mut()).enumerate() {
                *max = sinks[item.kv_head * group + r % group];
                *sum = 1.0;
            }
        }

        // The last key any query of the item sees: the last query's (ends never decrease).
        let last_query = item.query_end - 1;
        let last_key = self.key_end(seq.query_start + last_query, first_pos + last_query) - 1;
        let num_blocks = last_key / bs + 1;
        // The item's first query sees the earliest key any of them sees: blocks before it are
        // not read (a sliding window's old blocks).
        let lowest = self.window_start(first_pos + item.query_begin);
        for (b, &block) in table.iter().enumerate().take(num_blocks).skip(lowest / bs) {
            if let Some(&next) = table.get(b + 1).filter(|_| b + 1 < num_blocks) {
                prefetch(next as usize);
            }
            for chunk in (0..bs).step_by(LANES) {
                let key0 = b * bs + chunk;
                if key0 > last_key {
                    break;
                }
                let chunk_keys = LANES.min(bs - chunk);
                let chunk_end = key0 + chunk_keys;
                if chunk_end <= lowest {
                    continue;
                }
                // The first query that sees the chunk's first key: causally the one at its
                // position; earlier ones too where their keys reach past themselves (an
                // image's tokens), a run of them since ends never decrease.
                let mut qi = item.query_begin.max(key0.saturating_sub(first_pos));
                while qi > item.query_begin
                    && self.key_end(seq.query_start + qi - 1, first_pos + qi - 1) > key0
                {
                    qi -= 1;
                }
                while qi < item.query_end {
                    let pos = first_pos + qi;
                    let start = self.window_start(pos);
                    if start >= chunk_end {
                        // This query's window starts past the chunk, and later ones' later.
                        break;
                    }
                    let first_key = start.saturating_sub(key0);
                    let n_keys = chunk_keys.min(self.key_end(seq.query_start + qi, pos) - key0);
                    let queries = if n_keys == chunk_keys && first_key == 0 {
                        // Consecutive queries that see every key of the chunk: up to the last
                        // whose window still starts at or before the chunk.
                        let whole = match self.window {
                            Some(w) => (key0 + w).saturating_sub(first_pos).min(item.query_end),
                            None => item.query_end,
                        };
                        tile.min(whole - qi)
                    } else {
                        1
                    };
                    let token = seq.query_start + qi;
                    let row = (qi - item.query_begin) * group;
                    let end_row = row + queries * group;
                    let at = ChunkAt {
                        block: block as usize,
                        chunk,
                        first_key,
                        n_keys,
                        all_lanes_in_block: chunk + LANES <= bs,
                    };
                    let q_begin = (token * self.heads + item.kv_head * group) * d;
                    let q_len = (queries - 1) * self.heads * d + group * d;
                    let state = RowState {
                        maxes: &mut maxes[row..end_row],
                        sums: &mut sums[row..end_row],
                        accs: &mut accs[row * d..end_row * d],
                    };
                    on_chunk(&at, &self.q[q_begin..][..q_len], queries, state);
                    qi += queries;
                }
            }
        }
        // SAFETY: the caller's promise: no other task writes the item's rows.
        unsafe { self.write_rows(item, sums, accs, out) };
    }

    /// Writes an item's rows of the output: each accumulator over its softmax sum.
    ///
    /// # Safety
    /// No other task writes the item's (token, head) rows of `out`, which hold the step's
    /// tokens (checked before the items ran).
    unsafe fn write_rows(
        &self,
        item: &WorkItem,
        sums: &[f32],
        accs: &[f32],
        out: DisjointSlice<'_, f32>,
    ) {
        let d = self.layout.head_dim;
        let group = self.heads / self.layout.num_kv_heads;
        let seq = &self.sequences[item.seq];
        for qi in item.query_begin..item.query_end {
            let token = seq.query_start + qi;
            for g in 0..group {
                let row = (qi - item.query_begin) * group + g;
                let head = item.kv_head * group + g;
                let inv = 1.0 / sums[row];
                // SAFETY: every (token, head) output row belongs to exactly one work item (the
                // caller's promise), inside `out` by the sizes checked before the items ran.
                let dst = unsafe { out.slice_mut((token * self.heads + head) * d, d) };
                for (o, a) in dst.iter_mut().zip(&accs[row * d..][..d]) {
                    *o = a * inv;
                }
            }
        }
    }
}

/// Where one query of a work item meets one chunk of keys.
struct ChunkAt {
    /// The block's index in the pool.
    block: usize,
    /// The chunk's first key within the block.
    chunk: usize,
    /// The chunk's first key this query sees (0 but where a sliding window starts inside it).
    first_key: usize,
    /// The end of the chunk's keys this query sees (1..=16): keys `first_key..n_keys`.
    n_keys: usize,
    /// Whether all 16 lanes of the chunk lie in the block.
    all_lanes_in_block: bool,
}

/// Per (query, head) row of an item: the running max (from -inf), the running sum and the f32
/// accumulator of `d` values (from zero), carved from `scratch`.
fn row_states(
    scratch: &mut Vec<f32>,
    rows: usize,
    d: usize,
) -> (&mut [f32], &mut [f32], &mut [f32]) {
    scratch.clear();
    scratch.resize(rows * (2 + d), 0.0);
    let (maxes, rest) = scratch.split_at_mut(rows);
    let (sums, accs) = rest.split_at_mut(rows);
    maxes.fill(f32::NEG_INFINITY);
    (maxes, sums, accs)
}

/// One chunk of up to 16 keys of one block and KV head, for the group's heads of one query or
/// of several consecutive ones that all see `n_keys` of its keys.
struct Chunk<'a, E> {
    /// Query `i`'s heads of the group are `q[i * q_stride..][..group * head_dim]`.
    q: &'a [f32],
    /// Queries in the chunk's call (at most the path's `tile_queries(group)`).
    queries: usize,
    group: usize,
    q_stride: usize,
    /// Key `j`'s dimension `i` is at `k[i * k_stride + j]`.
    k: &'a [E],
    k_stride: usize,
    /// Key `j`'s values are `v[j * head_dim..][..head_dim]`.
    v: &'a [E],
    head_dim: usize,
    /// Keys `first_key..n_keys` of the chunk are the queries' (a sliding window may start
    /// inside it, the causal diagonal end it).
    first_key: usize,
    n_keys: usize,
    /// Whether all 16 key lanes of each row lie inside the block (it is at least 16 keys past
    /// the chunk's start), so a full-width load is in bounds even where `n_keys < 16`.
    all_lanes_in_block: bool,
    scale: f32,
}

impl<E> Chunk<'_, E> {
    /// Where each of the call's G rows starts in `q`: row `g` is head `g % group` of query
    /// `g / group`, counted rather than divided by the runtime group (two integer divisions a
    /// row, on every call). Only the kernels dereference them, within `q`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn row_starts<const G: usize>(&self) -> [*const f32; G] {
        let mut rows = [self.q.as_ptr(); G];
        let (mut query, mut head) = (0, 0);
        for row in &mut rows {
            *row = self
                .q
                .as_ptr()
                .wrapping_add(query * self.q_stride + head * self.head_dim);
            head += 1;
            if head == self.group {
                (query, head) = (query + 1, 0);
            }
        }
        rows
    }
}

/// Online-softmax state of the call's rows (each query's group of heads in turn): `[rows]`,
/// `[rows]`, `[rows][head_dim]`.
struct RowState<'a> {
    maxes: &'a mut [f32],
    sums: &'a mut [f32],
    accs: &'a mut [f32],
}

#[cfg(test)]
mod tests;
