//! The host side of the CUDA forward: what a step's launches are and the metadata they read,
//! computed from the step's sequences. Pure Rust, built and tested without CUDA: the device
//! code (`cuda/*.cu`, launched from [`crate::cuda`] with the `cuda` feature) only follows it.
//!
//! One [`AttentionPlan`] per step serves every layer. Its [`metadata`](AttentionPlan::metadata)
//! is one `u32` buffer, uploaded once per step, holding:
//! - tiles, 4 words each: sequence, first query (within the sequence's new tokens), queries,
//!   splits. A tile is the work of one thread block per KV head: up to [`ATTN_ROWS`] rows of
//!   (query token, query head of the GQA group), so each staged K/V chunk serves the whole group;
//! - sequences, 4 words each: `query_start`, `query_len`, `context_len`, `block_table_start`;
//! - the concatenated block tables;
//! - per token, the splits of its tile (read by the split-K combine).
//!
//! The grid is `(tiles, kv_heads, splits)`: prefill chunks and decode tokens share one launch, and
//! a step's launches never depend on how many sequences it holds ([`StepLaunches`]); only the
//! grid grows.
//!
//! A tile's keys fall in partitions, each walked from a fresh softmax state and merged in order
//! by one rule (`merge_partition` in `paged_attention.cu`):
//! - a decode row (a sequence's one new token) takes partitions of about
//!   [`DeviceLimits::decode_partition_keys`] keys by its context alone ([`decode_splits`]), in
//!   every step. One block walking a row's keys 16 at a time is a chain of dependent loads;
//!   partitions are what lets a step spread them over the GPU;
//! - a prefill tile takes one partition, or partitions of at least [`MIN_PARTITION_KEYS`] keys
//!   when the step's tiles are too few to fill the GPU.
//!
//! Who walks them is the plan's choice, by the step's size and workspace, never changing what a
//! row computes: when any tile has several partitions, blocks walk them apart (flash-decoding,
//! [`SplitK`]: block `z` of a tile takes partitions `z`, `z + grid_splits`, ...; enough blocks
//! for about [`SPLIT_BLOCKS_PER_SM`] per SM) and write each one's state, and a second launch
//! merges them; a mixed step whose workspace would pass [`SPLIT_WORKSPACE_ROWS`] has one block
//! walk a tile's partitions and merge them as it goes (the walk kernel). So a row's result
//! depends on its partitions alone (a decode row: its context), never on the step's size or
//! the other rows. [`partition_keys`] gives a partition's length, which the kernel computes
//! the same way.

use crate::paged::{AttentionShape, SequenceSlice};

/// Threads of an attention block (four warps). Mirrors `ATTN_THREADS` in `paged_attention.cu`.
pub const ATTN_THREADS: u32 = 128;
/// Query rows (token, head of the group) in one tile. Mirrors `ATTN_ROWS`.
pub const ATTN_ROWS: usize = 16;
/// Keys staged in shared memory at a time. Mirrors `ATTN_KEYS`.
pub const ATTN_KEYS: usize = 16;
/// Threads of a combine block. Mirrors `COMBINE_THREADS`.
pub const COMBINE_THREADS: u32 = 128;
/// Threads of a fused add + RMSNorm block, one block per row. Mirrors `NORM_THREADS` in `fused.cu`.
pub const NORM_THREADS: u32 = 256;
/// Threads of a RoPE block: one warp per head. Mirrors `ROPE_THREADS`.
pub const ROPE_THREADS: u32 = 128;
/// Threads of a SwiGLU block. Mirrors `SWIGLU_THREADS`.
pub const SWIGLU_THREADS: u32 = 256;
/// Threads of the K/V cache write, one block per token.
pub const WRITE_KV_THREADS: u32 = 128;
/// Threads of a sampling block, one block per row. Mirrors `SAMPLE_THREADS` in `sampling.cu`.
pub const SAMPLE_THREADS: u32 = 1024;
/// 32-bit words of a sampled row's parameters (`SampleParams`). Mirrors `SAMPLE_PARAM_WORDS`.
pub const SAMPLE_PARAM_WORDS: usize = 8;
/// 32-bit words of a sampled row's results: token, logprob, the top tokens, their logprobs.
/// Mirrors `SAMPLE_OUT_WORDS`.
pub const SAMPLE_OUT_WORDS: usize = 2 + 2 * crate::sampling::MAX_TOP_LOGPROBS;

/// Head dimensions the attention kernel is instantiated for.
pub const HEAD_DIMS: [usize; 2] = [64, 128];
/// Fewest keys one split-K partition of a prefill tile takes: below it the combine costs more
/// than it saves.
pub const MIN_PARTITION_KEYS: usize = 256;
/// Keys a decode row's partition takes by default ([`DeviceLimits::decode_partition_keys`]).
/// Measured on an H200 (BENCHMARKS.md, GPU): 32 beat 64 and 128 at one client; 16 was faster
/// still at one client and slower at 256.
pub const DECODE_PARTITION_KEYS: usize = 32;
/// Most partitions a decode row splits into; longer contexts take longer partitions. It bounds
/// a split step's workspace (`[rows, heads, splits, head_dim]` floats).
pub const MAX_DECODE_SPLITS: usize = 32;
/// A split step's grid aims at about this many attention blocks per SM: the kernel waits on
/// its loads, so it wants many blocks in flight, far more than one per SM.
pub const SPLIT_BLOCKS_PER_SM: usize = 8;
/// Most (token, partition) rows of a split step's workspace; a mixed step past it has each
/// block walk its tile's partitions instead. 256 rows of 32 partitions: every decode step
/// of up to 256 sequences splits.
pub const SPLIT_WORKSPACE_ROWS: usize = 8192;

/// What a plan needs to know of the GPU, and how it splits decode rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Streaming multiprocessors: they size a split step's grid, and a step whose tiles are
    /// fewer than this splits its prefill tiles' keys too.
    pub num_sms: usize,
    /// Keys of a decode row's partition, a multiple of [`ATTN_KEYS`] (see [`decode_splits`]).
    /// One value per process: a row's logits depend on it.
    pub decode_partition_keys: usize,
    /// Most (token, partition) rows a split step's workspace may take
    /// ([`SPLIT_WORKSPACE_ROWS`]); past it, the walk kernel.
    pub split_workspace_rows: usize,
}

impl DeviceLimits {
    /// H100 SXM and H200: 132 SMs.
    pub const HOPPER: Self = Self {
        num_sms: 132,
        decode_partition_keys: DECODE_PARTITION_KEYS,
        split_workspace_rows: SPLIT_WORKSPACE_ROWS,
    };
}

/// The environment variable a benchmark sets to try another decode partition length.
pub const DECODE_PARTITION_VAR: &str = "SLUICE_CUDA_DECODE_PARTITION";

/// The decode partition length: `value` (of [`DECODE_PARTITION_VAR`]) when set, a positive
/// multiple of [`ATTN_KEYS`]; [`DECODE_PARTITION_KEYS`] when not.
pub fn decode_partition_keys(value: Option<&str>) -> Result<usize, PlanError> {
    let Some(value) = value else {
        return Ok(DECODE_PARTITION_KEYS);
    };
    match value.trim().parse::<usize>() {
        Ok(keys) if keys > 0 && keys.is_multiple_of(ATTN_KEYS) => Ok(keys),
        _ => Err(PlanError::Knob(format!(
            "{DECODE_PARTITION_VAR}={value}: a positive multiple of {ATTN_KEYS} keys, like 64"
        ))),
    }
}

/// Partitions of a decode row of `keys` keys: about one per `partition` keys (at most
/// [`MAX_DECODE_SPLITS`]), then as few as [`partition_keys`] of them need, so that none is
/// empty. A function of the row's context alone: the same row splits the same way in every
/// step, eager or replayed, alone or in a crowd.
pub fn decode_splits(keys: usize, partition: usize) -> usize {
    let keys = keys.max(1);
    let wanted = keys
        .div_ceil(partition.max(ATTN_KEYS))
        .clamp(1, MAX_DECODE_SPLITS);
    keys.div_ceil(partition_keys(keys, wanted))
}

/// Keys of each partition of a tile that reads `tile_keys` keys in `splits` partitions: an
/// equal share rounded up to whole chunks of [`ATTN_KEYS`]. The kernel computes the same.
pub fn partition_keys(tile_keys: usize, splits: usize) -> usize {
    tile_keys
        .div_ceil(splits.max(1))
        .max(1)
        .next_multiple_of(ATTN_KEYS)
}

/// Why a step cannot run on the CUDA kernels.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("the CUDA attention kernel handles head_dim 64 or 128, not {0}")]
    HeadDim(usize),
    #[error("{num_heads} query heads over {num_kv_heads} KV heads: the CUDA attention kernel needs a whole group of at most {ATTN_ROWS} query heads per KV head")]
    Group {
        num_heads: usize,
        num_kv_heads: usize,
    },
    #[error("the step does not fit its description: {0}")]
    Step(String),
    #[error(
        "a sliding window of {0} keys: the CUDA attention kernel attends to every earlier key"
    )]
    Window(usize),
    #[error("{0}")]
    Knob(String),
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub dynamic_shared_bytes: u32,
}

impl LaunchDims {
    /// `blocks` blocks of `threads` threads in one dimension.
    pub fn linear(blocks: usize, threads: u32) -> Self {
        Self {
            grid: (blocks as u32, 1, 1),
            block: (threads, 1, 1),
            dynamic_shared_bytes: 0,
        }
    }

    pub fn blocks(&self) -> usize {
        self.grid.0 as usize * self.grid.1 as usize * self.grid.2 as usize
    }
}

/// Split-K: a tile's partitions ([`partition_keys`], at most `max_splits`, the workspace's
/// stride) walked by `grid_splits` blocks (the grid's third dimension), block `z` taking
/// partitions `z`, `z + grid_splits`, ..., each written apart and merged by a second launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitK {
    pub max_splits: usize,
    pub grid_splits: usize,
}

impl SplitK {
    /// Split-K for tiles of up to `max_splits` partitions over `blocks` attention blocks: enough
    /// blocks a tile for [`SPLIT_BLOCKS_PER_SM`] per SM, no more than its partitions.
    fn new(max_splits: usize, blocks: usize, device: DeviceLimits) -> Self {
        let grid_splits = (SPLIT_BLOCKS_PER_SM * device.num_sms)
            .div_ceil(blocks.max(1))
            .clamp(1, max_splits);
        Self {
            max_splits,
            grid_splits,
        }
    }
}

/// Where each array starts in [`AttentionPlan::metadata`] (in `u32` words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataOffsets {
    pub tiles: usize,
    pub seqs: usize,
    pub block_tables: usize,
    pub token_splits: usize,
}

/// One step's attention launches and the metadata they read; see the module docs.
#[derive(Debug, Clone)]
pub struct AttentionPlan {
    pub metadata: Vec<u32>,
    pub offsets: MetadataOffsets,
    pub num_tiles: usize,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Softmax scale times log2(e): the kernel works in powers of two.
    pub scale_log2: f32,
    pub split: Option<SplitK>,
    /// The most partitions a tile has: above 1 without `split`, the walk kernel runs.
    pub partitions: usize,
    pub attention: LaunchDims,
    /// The split-K merge, when the step splits.
    pub combine: Option<LaunchDims>,
}

impl AttentionPlan {
    /// The plan for `sequences` (laid out as in [`SequenceSlice`], tiling `0..num_tokens`) over
    /// `block_tables`, for heads of `shape` in a cache of blocks of `block_size` tokens.
    pub fn new(
        sequences: &[SequenceSlice],
        block_tables: &[u32],
        num_tokens: usize,
        shape: &AttentionShape,
        block_size: usize,
        device: DeviceLimits,
    ) -> Result<Self, PlanError> {
        let (h, kvh, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
        if !HEAD_DIMS.contains(&d) {
            return Err(PlanError::HeadDim(d));
        }
        if let Some(window) = shape.window {
            return Err(PlanError::Window(window));
        }
        if kvh == 0 || h % kvh != 0 || h / kvh > ATTN_ROWS {
            return Err(PlanError::Group {
                num_heads: h,
                num_kv_heads: kvh,
            });
        }
        check_step(sequences, block_tables, num_tokens, block_size)?;
        let group = h / kvh;
        let tokens_per_tile = ATTN_ROWS / group;

        // Tiles, with the keys each one reads (its last query's position + 1).
        let mut tiles: Vec<([u32; 4], usize)> = Vec::new();
        for (seq, s) in sequences.iter().enumerate() {
            for first in (0..s.query_len).step_by(tokens_per_tile) {
                let queries = tokens_per_tile.min(s.query_len - first);
                let keys = s.context_len - s.query_len + first + queries;
                tiles.push(([seq as u32, first as u32, queries as u32, 1], keys));
            }
        }
        // Partitions: decode rows by their context; prefill tiles only when the step's tiles
        // leave SMs idle (see the module docs).
        let is_decode = |tile: &[u32; 4]| sequences[tile[0] as usize].query_len == 1;
        let blocks = tiles.len() * kvh;
        let prefill_keys = tiles
            .iter()
            .filter(|t| !is_decode(&t.0))
            .map(|t| t.1)
            .max()
            .unwrap_or(0);
        let prefill_partition = prefill_partition_keys(blocks, prefill_keys, device);
        for (tile, keys) in &mut tiles {
            tile[3] = if is_decode(tile) {
                decode_splits(*keys, device.decode_partition_keys)
            } else {
                prefill_partition.map_or(1, |p| keys.div_ceil(p))
            } as u32;
        }
        let partitions = tiles.iter().map(|t| t.0[3] as usize).max().unwrap_or(1);
        let split = (partitions > 1 && num_tokens * partitions <= device.split_workspace_rows)
            .then(|| SplitK::new(partitions, blocks, device));

        let offsets = MetadataOffsets {
            tiles: 0,
            seqs: 4 * tiles.len(),
            block_tables: 4 * tiles.len() + 4 * sequences.len(),
            token_splits: 4 * tiles.len() + 4 * sequences.len() + block_tables.len(),
        };
        let mut metadata = Vec::with_capacity(offsets.token_splits + num_tokens);
        metadata.extend(tiles.iter().flat_map(|t| t.0));
        metadata.extend(sequences.iter().flat_map(|s| {
            [
                s.query_start as u32,
                s.query_len as u32,
                s.context_len as u32,
                s.block_table_start as u32,
            ]
        }));
        metadata.extend_from_slice(block_tables);
        for (tile, _) in &tiles {
            metadata.extend(std::iter::repeat_n(tile[3], tile[2] as usize));
        }
        debug_assert_eq!(metadata.len(), offsets.token_splits + num_tokens);

        let attention = LaunchDims {
            grid: (
                tiles.len() as u32,
                kvh as u32,
                split.map_or(1, |s| s.grid_splits as u32),
            ),
            block: (ATTN_THREADS, 1, 1),
            dynamic_shared_bytes: 0,
        };
        let combine = split.map(|_| LaunchDims::linear(num_tokens * h, COMBINE_THREADS));
        Ok(Self {
            metadata,
            offsets,
            num_tiles: tiles.len(),
            num_tokens,
            num_heads: h,
            num_kv_heads: kvh,
            head_dim: d,
            block_size,
            scale_log2: shape.scale * std::f32::consts::LOG2_E,
            split,
            partitions,
            attention,
            combine,
        })
    }

    /// The plan of a decode step replayed from a captured graph of `bucket` rows: `sequences`
    /// (each one new token, at most `bucket` of them) padded to `bucket` rows, with a layout
    /// and grid that depend only on `bucket`, the shape and `max_context` (the most keys a
    /// sequence may have), so one capture serves every step of the bucket:
    /// - metadata: tiles (`4 * bucket` words), sequences (`4 * bucket`), each token's splits
    ///   (`bucket`), then the block tables, whose length alone varies;
    /// - one tile per row; a padding row is a sequence of one key in block 0, whose result
    ///   nobody reads (and whose slot, [`PAD_SLOT`], the K/V write skips);
    /// - each row's partitions by its own context ([`decode_splits`]), as in an eager step,
    ///   split across blocks whenever a row of `max_context` keys would take several: a
    ///   workspace for the most partitions such a row takes, a grid sized by the bucket.
    pub fn for_decode_bucket(
        sequences: &[SequenceSlice],
        block_tables: &[u32],
        bucket: usize,
        max_context: usize,
        shape: &AttentionShape,
        block_size: usize,
        device: DeviceLimits,
    ) -> Result<Self, PlanError> {
        Self::for_decode_bucket_in(
            Vec::new(),
            sequences,
            block_tables,
            bucket,
            max_context,
            shape,
            block_size,
            device,
        )
    }

    /// [`Self::for_decode_bucket`] writing its metadata into `metadata` (cleared first): a
    /// step loop hands back the previous step's plan's words and allocates nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn for_decode_bucket_in(
        mut metadata: Vec<u32>,
        sequences: &[SequenceSlice],
        block_tables: &[u32],
        bucket: usize,
        max_context: usize,
        shape: &AttentionShape,
        block_size: usize,
        device: DeviceLimits,
    ) -> Result<Self, PlanError> {
        let (h, kvh, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
        Self::new(&[], &[], 0, shape, block_size, device)?;
        check_step(sequences, block_tables, sequences.len(), block_size)?;
        if sequences.len() > bucket || sequences.iter().any(|s| s.query_len != 1) {
            return Err(PlanError::Step(format!(
                "{} sequences for a decode bucket of {bucket} (one new token each)",
                sequences.len()
            )));
        }
        if let Some(s) = sequences.iter().find(|s| s.context_len > max_context) {
            return Err(PlanError::Step(format!(
                "a context of {} keys past the bucket's {max_context}",
                s.context_len
            )));
        }
        let partition = device.decode_partition_keys;
        // The most partitions a row may take: `decode_splits` never passes this bound for a
        // row of at most `max_context` keys.
        let max_splits = max_context
            .div_ceil(partition.max(ATTN_KEYS))
            .clamp(1, MAX_DECODE_SPLITS);
        let split = (max_splits > 1).then(|| SplitK::new(max_splits, bucket * kvh, device));
        let splits_of = |keys: usize| decode_splits(keys, partition);
        let offsets = MetadataOffsets {
            tiles: 0,
            seqs: 4 * bucket,
            token_splits: 8 * bucket,
            block_tables: 9 * bucket,
        };
        let pad_table = block_tables.len() as u32;
        metadata.clear();
        metadata.reserve(offsets.block_tables + block_tables.len() + 1);
        for row in 0..bucket {
            let keys = sequences.get(row).map_or(1, |s| s.context_len);
            metadata.extend([row as u32, 0, 1, splits_of(keys) as u32]);
        }
        for row in 0..bucket {
            metadata.extend(match sequences.get(row) {
                Some(s) => [
                    row as u32,
                    1,
                    s.context_len as u32,
                    s.block_table_start as u32,
                ],
                None => [row as u32, 1, 1, pad_table],
            });
        }
        for row in 0..bucket {
            let keys = sequences.get(row).map_or(1, |s| s.context_len);
            metadata.push(splits_of(keys) as u32);
        }
        metadata.extend_from_slice(block_tables);
        metadata.push(0);
        let attention = LaunchDims {
            grid: (
                bucket as u32,
                kvh as u32,
                split.map_or(1, |s| s.grid_splits as u32),
            ),
            block: (ATTN_THREADS, 1, 1),
            dynamic_shared_bytes: 0,
        };
        Ok(Self {
            metadata,
            offsets,
            num_tiles: bucket,
            num_tokens: bucket,
            num_heads: h,
            num_kv_heads: kvh,
            head_dim: d,
            block_size,
            scale_log2: shape.scale * std::f32::consts::LOG2_E,
            split,
            partitions: max_splits,
            attention,
            combine: split.map(|_| LaunchDims::linear(bucket * h, COMBINE_THREADS)),
        })
    }

    /// Floats of the split-K workspace: partial accumulators `[T, H, max_splits, D]` and
    /// `(max, sum)` pairs `[T, H, max_splits, 2]`; `(0, 0)` without split-K.
    pub fn workspace_floats(&self) -> (usize, usize) {
        self.split.map_or((0, 0), |s| {
            let rows = self.num_tokens * self.num_heads * s.max_splits;
            (rows * self.head_dim, rows * 2)
        })
    }

    /// The highest block id the step's tables name: the launcher checks it against the cache.
    pub fn max_block(&self) -> u32 {
        // The tables end where the splits start, or (a decode bucket's plan) at the end.
        let end = if self.offsets.token_splits > self.offsets.block_tables {
            self.offsets.token_splits
        } else {
            self.metadata.len()
        };
        self.metadata[self.offsets.block_tables..end]
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// Static shared memory of the attention kernel for this head dimension (bytes): the
    /// tile's queries (padded by one float per row), one chunk of K and one of V.
    pub fn attention_shared_bytes(&self) -> usize {
        4 * (ATTN_ROWS * (self.head_dim + 1) + 2 * self.head_dim * ATTN_KEYS)
    }
}

/// The slot a padding row of a decode graph writes to: none (`write_kv` skips it).
pub const PAD_SLOT: u32 = u32::MAX;

/// Decode steps replayed from graphs: the batch sizes captured, each step padded to the
/// smallest that holds it (1, 2, 4, 8, then multiples of 8 up to `max_seqs`: a padded row
/// costs a step little, and more graphs cost only their capture).
pub fn decode_buckets(max_seqs: usize) -> Vec<usize> {
    let mut buckets: Vec<usize> = [1, 2, 4].into_iter().filter(|&b| b < max_seqs).collect();
    buckets.extend((8..max_seqs).step_by(8));
    buckets.push(max_seqs.max(1));
    buckets
}

/// Partition length of the prefill tiles of a step of `blocks` attention blocks whose prefill
/// tiles read up to `max_keys` keys: when the blocks leave SMs idle and the keys are long
/// enough, enough partitions for about two blocks per SM, none shorter than
/// [`MIN_PARTITION_KEYS`]; `None`: one partition.
fn prefill_partition_keys(blocks: usize, max_keys: usize, device: DeviceLimits) -> Option<usize> {
    if blocks == 0 || blocks >= device.num_sms || max_keys <= MIN_PARTITION_KEYS {
        return None;
    }
    let want = (2 * device.num_sms).div_ceil(blocks);
    let partition_keys = max_keys
        .div_ceil(want)
        .max(MIN_PARTITION_KEYS)
        .next_multiple_of(ATTN_KEYS);
    (max_keys > partition_keys).then_some(partition_keys)
}

/// Rejects a step whose slices do not tile `0..num_tokens` in order or whose block tables are
/// too short: the kernels index with these numbers unchecked.
fn check_step(
    sequences: &[SequenceSlice],
    block_tables: &[u32],
    num_tokens: usize,
    block_size: usize,
) -> Result<(), PlanError> {
    let mut next = 0;
    for s in sequences {
        let fits = s.query_start == next
            && s.query_len > 0
            && s.query_len <= s.context_len
            && s.block_table_len * block_size >= s.context_len
            && s.block_table_start + s.block_table_len <= block_tables.len();
        if !fits {
            return Err(PlanError::Step(format!(
                "sequence {s:?} after {next} tokens, {} block table entries, blocks of {block_size}",
                block_tables.len()
            )));
        }
        next += s.query_len;
    }
    if next != num_tokens || block_size == 0 || u32::try_from(num_tokens).is_err() {
        return Err(PlanError::Step(format!(
            "sequences cover {next} of {num_tokens} tokens"
        )));
    }
    Ok(())
}

/// Our kernels, by what they do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Residual add and RMSNorm in one pass (`add_rms_norm_*`).
    AddRmsNorm,
    /// qwen3's QK-norm (when the model has it) and RoPE by positions on Q and K (`rope_qk_*`).
    RopeQk,
    /// K and V through `slot_mapping` into the cache (`write_kv_*`).
    WriteKv,
    /// Varlen paged attention, whole step (`paged_attention_*`).
    PagedAttention,
    /// Split-K attention and its merge (`paged_attention_split_*`, `attention_combine_*`).
    PagedAttentionSplit,
    AttentionCombine,
    /// `silu(gate) * up` (`swiglu_*`).
    Swiglu,
}

/// The launches of one layer of a step, besides cuBLAS's four matmuls (QKV, O, gate/up, down;
/// one GEMM each, whatever the batch): the order `sluice-model`'s CUDA forward runs them in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepLaunches {
    pub per_layer: Vec<(Kernel, LaunchDims)>,
}

impl StepLaunches {
    /// Launches for the step `plan` describes, of a model whose MLP has `intermediate` columns.
    pub fn new(plan: &AttentionPlan, intermediate: usize) -> Self {
        let t = plan.num_tokens;
        let heads = plan.num_heads + plan.num_kv_heads;
        let warps_per_rope_block = (ROPE_THREADS / 32) as usize;
        let rope = LaunchDims {
            grid: (t as u32, heads.div_ceil(warps_per_rope_block) as u32, 1),
            block: (ROPE_THREADS, 1, 1),
            dynamic_shared_bytes: 0,
        };
        let mut per_layer = vec![
            (Kernel::AddRmsNorm, LaunchDims::linear(t, NORM_THREADS)),
            (Kernel::RopeQk, rope),
            (Kernel::WriteKv, LaunchDims::linear(t, WRITE_KV_THREADS)),
        ];
        match plan.combine {
            None => per_layer.push((Kernel::PagedAttention, plan.attention)),
            Some(combine) => {
                per_layer.push((Kernel::PagedAttentionSplit, plan.attention));
                per_layer.push((Kernel::AttentionCombine, combine));
            }
        }
        per_layer.push((Kernel::AddRmsNorm, LaunchDims::linear(t, NORM_THREADS)));
        per_layer.push((Kernel::Swiglu, swiglu_dims(t, intermediate)));
        Self { per_layer }
    }

    pub fn launches_per_layer(&self) -> usize {
        self.per_layer.len()
    }
}

/// Grid of the SwiGLU kernel for `rows * inter` outputs: grid-stride, capped so huge prefills
/// reuse blocks rather than launch millions.
pub fn swiglu_dims(rows: usize, inter: usize) -> LaunchDims {
    let blocks = (rows * inter)
        .div_ceil(SWIGLU_THREADS as usize)
        .clamp(1, 65_535);
    LaunchDims::linear(blocks, SWIGLU_THREADS)
}

#[cfg(test)]
mod tests;
