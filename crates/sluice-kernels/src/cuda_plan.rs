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
//! grid grows. When a step has too few tiles to fill the GPU and long contexts (decode of few
//! sequences), keys are split across thread blocks (flash-decoding) and a second launch merges
//! the partial results.

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

/// Head dimensions the attention kernel is instantiated for.
pub const HEAD_DIMS: [usize; 2] = [64, 128];
/// Fewest keys one split-K partition takes: below it the combine costs more than it saves.
pub const MIN_PARTITION_KEYS: usize = 256;

/// What a plan needs to know of the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Streaming multiprocessors: a step with fewer attention blocks than this splits keys.
    pub num_sms: usize,
}

impl DeviceLimits {
    /// H100 SXM and H200: 132 SMs.
    pub const HOPPER: Self = Self { num_sms: 132 };
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

/// Split-K: keys of a tile in partitions of `partition_keys`, at most `max_splits` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitK {
    pub partition_keys: usize,
    pub max_splits: usize,
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
        let max_keys = tiles.iter().map(|t| t.1).max().unwrap_or(0);
        let split = split_k(tiles.len() * kvh, max_keys, device);
        if let Some(s) = split {
            for (tile, keys) in &mut tiles {
                tile[3] = keys.div_ceil(s.partition_keys) as u32;
            }
        }

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
                split.map_or(1, |s| s.max_splits as u32),
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
    /// - split-K fixed by the bucket: on when `bucket * kv_heads` blocks leave SMs idle, with
    ///   partitions sized for `max_context`; a tile that needs fewer splits than the grid has
    ///   leaves the rest idle.
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
        // As a step of `bucket` sequences of `max_context` keys would split.
        let split = split_k(bucket * kvh, max_context, device);
        let splits_of = |keys: usize| split.map_or(1, |s| keys.div_ceil(s.partition_keys).max(1));
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
                split.map_or(1, |s| s.max_splits as u32),
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

/// Split-K for `blocks` attention blocks whose tiles read up to `max_keys` keys: when the
/// blocks leave SMs idle and the keys are long enough, enough partitions for about two blocks
/// per SM, none shorter than [`MIN_PARTITION_KEYS`].
fn split_k(blocks: usize, max_keys: usize, device: DeviceLimits) -> Option<SplitK> {
    if blocks >= device.num_sms || max_keys <= MIN_PARTITION_KEYS {
        return None;
    }
    let want = (2 * device.num_sms).div_ceil(blocks.max(1));
    let partition_keys = max_keys
        .div_ceil(want)
        .max(MIN_PARTITION_KEYS)
        .next_multiple_of(ATTN_KEYS);
    let max_splits = max_keys.div_ceil(partition_keys);
    (max_splits > 1).then_some(SplitK {
        partition_keys,
        max_splits,
    })
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
