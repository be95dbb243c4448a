// Varlen paged attention: one launch per layer for a whole mixed step, prefill chunks and
// decode tokens together, reading K/V blocks where they lie in sluice's cache layout.
//
// Work item (one thread block): a tile of up to ATTN_ROWS query rows of one sequence and one KV
// head, where a row is (query token, query head of the KV head's GQA group). The host's plan
// (sluice_kernels::cuda_plan) lists the tiles; grid = (tiles, kv_heads, splits). Each K/V chunk
// of ATTN_KEYS keys is staged once in shared memory and used by every row of the tile: GQA
// without repeating K/V. Online softmax in log2 units (queries pre-scaled by scale * log2(e)).
// Causal within the sequence: the row of the query at position p sees keys 0..=p.
//
// Partitions: a tile's keys fall in its own count of partitions (the plan's tile record;
// sluice_kernels::cuda_plan::partition_keys gives their length, computed here the same way).
// Each partition is walked from a fresh softmax state, and the partitions' states are merged
// in order by merge_partition, one rule wherever it runs. The plan picks who walks them, by the
// step's size and its workspace, never changing what a row computes:
// - paged_attention_*: every tile has one partition, written out directly (acc * (1 / l),
//   which is what merging one partition gives);
// - paged_attention_split_* (flash-decoding): block z walks partitions z, z + gridDim.z, ...
//   of its tile and writes each one's state; attention_combine merges them in order;
// - paged_attention_walk_*: one block walks all of its tile's partitions and merges them as it
//   goes (a mixed step whose split workspace would be too large).
// So a row's result depends on its partitions alone (for a decode row: its context), never on
// the kernel, the step's size or the other rows.
//
// Layout per layer (sluice_kernels::paged::KvLayout), K and V in one buffer, V at v_offset:
//   K: [num_blocks][num_kv_heads][head_dim][block_size]
//   V: [num_blocks][num_kv_heads][block_size][head_dim]
#include "common.cuh"

using namespace sluice;

// These four are mirrored by sluice_kernels::cuda_plan (a test holds them equal).
#define ATTN_THREADS 128
#define ATTN_ROWS 16
#define ATTN_KEYS 16
#define COMBINE_THREADS 128
// Blocks per SM the register budget must allow. Without it ptxas 13.0 held the kernels to
// 40-72 registers and spilled a few bytes; with it they take ~80-100 and spill nothing (the
// build checks), leaving room for two blocks per SM anyway.
#define ATTN_MIN_BLOCKS 2

constexpr int ATTN_WARPS = ATTN_THREADS / 32;
constexpr int ROWS_PER_WARP = ATTN_ROWS / ATTN_WARPS;
static_assert(ROWS_PER_WARP % 2 == 0, "rows are scored in pairs, one per half-warp");
static_assert(ATTN_KEYS == 16, "a half-warp scores one chunk of keys");

// Merges a partition's softmax state (m, l, acc) into the running one (M, L, O), in log2
// units. The first partition's state is taken as it is, so a row of one partition ends as
// acc * (1 / l) exactly; a partition whose keys the row cannot see (m = -inf) changes nothing.
// Rounded operations, no contraction: every place that merges gets the same bits.
template <int N>
__device__ __forceinline__ void merge_partition(float& M, float& L, float (&O)[N], float m, float l,
                                                const float (&acc)[N]) {
    if (m == -INFINITY) return;
    if (M == -INFINITY) {
        M = m;
        L = l;
#pragma unroll
        for (int i = 0; i < N; ++i) O[i] = acc[i];
        return;
    }
    const float merged = fmaxf(M, m);
    const float a = exp2f(M - merged), b = exp2f(m - merged);
    L = __fadd_rn(__fmul_rn(L, a), __fmul_rn(l, b));
#pragma unroll
    for (int i = 0; i < N; ++i) O[i] = __fadd_rn(__fmul_rn(O[i], a), __fmul_rn(acc[i], b));
    M = merged;
}

// An empty softmax state for each of a warp's R rows: no key seen (m = -inf), nothing summed.
template <int R, int N>
__device__ __forceinline__ void clear_states(float (&m)[R], float (&l)[R], float (&acc)[R][N]) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
        m[j] = -INFINITY;
        l[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < N; ++i) acc[j][i] = 0.0f;
    }
}

// Who walks a tile's partitions (see the top of the file).
enum Walk { ONE_PARTITION, ALL_PARTITIONS, SPLIT_PARTITIONS };

// Metadata records (u32 each), written by the plan:
//   tile: seq, first query (within the sequence's new tokens), queries, partitions
//   seq:  query_start, query_len, context_len, block_table_start

template <typename Q, typename Cache, int D, Walk WALK>
__device__ __forceinline__ void paged_attention(
    const Q* __restrict__ q, long q_token_stride, const Cache* __restrict__ kv_cache,
    long v_offset, Q* __restrict__ out, const uint32_t* __restrict__ tiles,
    const uint32_t* __restrict__ seqs, const uint32_t* __restrict__ block_tables,
    int num_heads, int num_kv_heads, int block_size, float scale_log2, int max_splits,
    float* __restrict__ partial_acc, float* __restrict__ partial_ml) {
    constexpr int DL = D / 32;  // dimensions of a row each lane accumulates
    __shared__ float q_s[ATTN_ROWS][D + 1];  // +1: the two half-warps' rows hit different banks
    __shared__ float k_s[D][ATTN_KEYS];
    __shared__ float v_s[ATTN_KEYS][D];

    constexpr bool SPLIT = WALK == SPLIT_PARTITIONS;
    const int tile = blockIdx.x, kv_head = blockIdx.y;
    const uint32_t* t = tiles + 4 * tile;
    const int seq = t[0], first_query = t[1], num_queries = t[2];
    const int num_splits = WALK == ONE_PARTITION ? 1 : t[3];
    if (SPLIT && (int)blockIdx.z >= num_splits) return;
    const uint32_t* s = seqs + 4 * seq;
    const int query_start = s[0], query_len = s[1], context_len = s[2];
    const uint32_t* table = block_tables + s[3];
    const int group = num_heads / num_kv_heads;
    const int rows = num_queries * group;
    // Position of the tile's first query; the tile's last query sees keys below tile_keys.
    const int first_pos = context_len - query_len + first_query;
    const int tile_keys = first_pos + num_queries;
    // An equal share of the keys, rounded up to whole chunks (cuda_plan::partition_keys).
    const int share = (tile_keys + num_splits - 1) / num_splits;
    const int partition_keys = (share + ATTN_KEYS - 1) / ATTN_KEYS * ATTN_KEYS;

    for (int i = threadIdx.x; i < ATTN_ROWS * D; i += ATTN_THREADS) {
        const int r = i / D, d = i % D;
        float val = 0.0f;
        if (r < rows) {
            const long token = query_start + first_query + r / group;
            const int head = kv_head * group + r % group;
            val = to_float(q[token * q_token_stride + head * D + d]) * scale_log2;
        }
        q_s[r][d] = val;
    }

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int half = lane >> 4, key_lane = lane & 15;
    // Row slot j of this warp is tile row warp + ATTN_WARPS * j; slots 2p and 2p+1 are scored
    // together, by the low and the high half-warp. (m, l, acc): the partition's softmax state;
    // (M, L, O): the partitions merged so far (ALL_PARTITIONS only).
    float m[ROWS_PER_WARP], l[ROWS_PER_WARP], acc[ROWS_PER_WARP][DL];
    float M[ROWS_PER_WARP], L[ROWS_PER_WARP], O[ROWS_PER_WARP][DL];
    clear_states(M, L, O);

    const Cache* v_cache = kv_cache + v_offset;
    const size_t head_run = (size_t)D * block_size;
    const int first_partition = SPLIT ? blockIdx.z : 0, stride = SPLIT ? gridDim.z : 1;
    for (int partition = first_partition; partition < num_splits; partition += stride) {
        const int key_begin = partition * partition_keys;
        const int key_end = min(tile_keys, key_begin + partition_keys);
        clear_states(m, l, acc);
        for (int chunk = key_begin; chunk < key_end; chunk += ATTN_KEYS) {
            __syncthreads();  // the previous chunk is consumed (first time: q_s is staged)
            // Keys fastest: neighbouring threads read neighbouring slots of a block.
            for (int i = threadIdx.x; i < D * ATTN_KEYS; i += ATTN_THREADS) {
                const int d = i / ATTN_KEYS, kk = i % ATTN_KEYS, key = chunk + kk;
                float val = 0.0f;
                if (key < key_end) {
                    const size_t run =
                        ((size_t)table[key / block_size] * num_kv_heads + kv_head) * head_run;
                    val = to_float(kv_cache[run + (size_t)d * block_size + key % block_size]);
                }
                k_s[d][kk] = val;
            }
            for (int i = threadIdx.x; i < D * ATTN_KEYS; i += ATTN_THREADS) {
                const int kk = i / D, d = i % D, key = chunk + kk;
                float val = 0.0f;
                if (key < key_end) {
                    const size_t run =
                        ((size_t)table[key / block_size] * num_kv_heads + kv_head) * head_run;
                    val = to_float(v_cache[run + (size_t)(key % block_size) * D + d]);
                }
                v_s[kk][d] = val;
            }
            __syncthreads();

#pragma unroll
            for (int p = 0; p < ROWS_PER_WARP / 2; ++p) {
                const int row = warp + ATTN_WARPS * (2 * p + half);
                const int key = chunk + key_lane;
                // The row's query sits at first_pos + row / group and sees keys up to it.
                const bool visible = row < rows && key < key_end && key <= first_pos + row / group;
                float score = -INFINITY;
                if (visible) {
                    float dot = 0.0f;
#pragma unroll 16
                    for (int d = 0; d < D; ++d) dot += q_s[row][d] * k_s[d][key_lane];
                    score = dot;
                }
                float chunk_max = score;
#pragma unroll
                for (int o = 8; o > 0; o >>= 1)
                    chunk_max = fmaxf(chunk_max, __shfl_xor_sync(FULL_MASK, chunk_max, o));
                // Every lane keeps both rows' state and updates both: take each half's chunk max.
                // (Selecting m[2p + half] instead would index the array by a runtime value and put
                // it in local memory.)
                const float m_lo = fmaxf(m[2 * p], __shfl_sync(FULL_MASK, chunk_max, 0));
                const float m_hi = fmaxf(m[2 * p + 1], __shfl_sync(FULL_MASK, chunk_max, 16));
                const float prob = visible ? exp2f(score - (half ? m_hi : m_lo)) : 0.0f;
                float prob_sum = prob;
#pragma unroll
                for (int o = 8; o > 0; o >>= 1) prob_sum += __shfl_xor_sync(FULL_MASK, prob_sum, o);
                const float sum_lo = __shfl_sync(FULL_MASK, prob_sum, 0);
                const float sum_hi = __shfl_sync(FULL_MASK, prob_sum, 16);
                // A row with no key yet has max -inf and nothing to rescale.
                const float alpha_lo = m[2 * p] == -INFINITY ? 0.0f : exp2f(m[2 * p] - m_lo);
                const float alpha_hi =
                    m[2 * p + 1] == -INFINITY ? 0.0f : exp2f(m[2 * p + 1] - m_hi);
                m[2 * p] = m_lo;
                m[2 * p + 1] = m_hi;
                l[2 * p] = l[2 * p] * alpha_lo + sum_lo;
                l[2 * p + 1] = l[2 * p + 1] * alpha_hi + sum_hi;
#pragma unroll
                for (int i = 0; i < DL; ++i) {
                    acc[2 * p][i] *= alpha_lo;
                    acc[2 * p + 1][i] *= alpha_hi;
                }
#pragma unroll
                for (int kk = 0; kk < ATTN_KEYS; ++kk) {
                    const float p_lo = __shfl_sync(FULL_MASK, prob, kk);
                    const float p_hi = __shfl_sync(FULL_MASK, prob, 16 + kk);
#pragma unroll
                    for (int i = 0; i < DL; ++i) {
                        const float v = v_s[kk][lane + 32 * i];
                        acc[2 * p][i] += p_lo * v;
                        acc[2 * p + 1][i] += p_hi * v;
                    }
                }
            }
        }
        if (WALK == ALL_PARTITIONS) {
#pragma unroll
            for (int j = 0; j < ROWS_PER_WARP; ++j)
                merge_partition(M[j], L[j], O[j], m[j], l[j], acc[j]);
        }
        if (SPLIT) {
#pragma unroll
            for (int j = 0; j < ROWS_PER_WARP; ++j) {
                const int row = warp + ATTN_WARPS * j;
                if (row >= rows) continue;
                const long token = query_start + first_query + row / group;
                const int head = kv_head * group + row % group;
                const size_t part = ((size_t)token * num_heads + head) * max_splits + partition;
#pragma unroll
                for (int i = 0; i < DL; ++i) partial_acc[part * D + lane + 32 * i] = acc[j][i];
                if (lane == 0) {
                    partial_ml[2 * part] = m[j];
                    partial_ml[2 * part + 1] = l[j];
                }
            }
        }
    }
    // The split kernel's partitions are out; the others write the merged rows.
    if constexpr (!SPLIT) {
#pragma unroll
        for (int j = 0; j < ROWS_PER_WARP; ++j) {
            const int row = warp + ATTN_WARPS * j;
            if (row >= rows) continue;
            const long token = query_start + first_query + row / group;
            const int head = kv_head * group + row % group;
            // One partition: its own state is what merging it gives.
            const float total = WALK == ONE_PARTITION ? l[j] : L[j];
            const float inv = total > 0.0f ? 1.0f / total : 0.0f;
#pragma unroll
            for (int i = 0; i < DL; ++i)
                out[((size_t)token * num_heads + head) * D + lane + 32 * i] =
                    from_float<Q>((WALK == ONE_PARTITION ? acc[j][i] : O[j][i]) * inv);
        }
    }
}

// Merges the splits of each (token, head) row in order, by merge_partition as the unsplit
// kernel does: grid = tokens * heads, COMBINE_THREADS threads, each thread its dimensions.
template <typename Q>
__device__ __forceinline__ void attention_combine(const float* __restrict__ partial_acc,
                                                  const float* __restrict__ partial_ml,
                                                  const uint32_t* __restrict__ token_splits,
                                                  Q* __restrict__ out, int num_heads,
                                                  int head_dim, int max_splits) {
    const size_t row = blockIdx.x;
    const int splits = token_splits[row / num_heads];
    const float* ml = partial_ml + row * max_splits * 2;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float M = -INFINITY, L = 0.0f, O[1] = {0.0f};
        for (int s = 0; s < splits; ++s) {
            const float acc[1] = {partial_acc[(row * max_splits + s) * head_dim + d]};
            merge_partition(M, L, O, ml[2 * s], ml[2 * s + 1], acc);
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        out[row * head_dim + d] = from_float<Q>(O[0] * inv);
    }
}

// A kernel that writes its rows itself (every tile one partition, or walked by one block).
#define ATTENTION_UNSPLIT(NAME, WALK, Q, CACHE, D)                                              \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, ATTN_MIN_BLOCKS) NAME(           \
        const Q* q, long q_token_stride, const CACHE* kv_cache, long v_offset, Q* out,          \
        const uint32_t* tiles, const uint32_t* seqs, const uint32_t* block_tables,              \
        int num_heads, int num_kv_heads, int block_size, float scale_log2) {                    \
        paged_attention<Q, CACHE, D, WALK>(q, q_token_stride, kv_cache, v_offset, out, tiles,   \
                                           seqs, block_tables, num_heads, num_kv_heads,         \
                                           block_size, scale_log2, 1, nullptr, nullptr);        \
    }

#define ATTENTION(SUFFIX, Q, CACHE, D)                                                          \
    ATTENTION_UNSPLIT(paged_attention_##SUFFIX##_d##D, ONE_PARTITION, Q, CACHE, D)              \
    ATTENTION_UNSPLIT(paged_attention_walk_##SUFFIX##_d##D, ALL_PARTITIONS, Q, CACHE, D)        \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, ATTN_MIN_BLOCKS)                 \
        paged_attention_split_##SUFFIX##_d##D(                                                  \
            const Q* q, long q_token_stride, const CACHE* kv_cache, long v_offset,              \
            const uint32_t* tiles, const uint32_t* seqs, const uint32_t* block_tables,          \
            int num_heads, int num_kv_heads, int block_size, float scale_log2,                  \
            int max_splits, float* partial_acc, float* partial_ml) {                            \
        paged_attention<Q, CACHE, D, SPLIT_PARTITIONS>(                                         \
            q, q_token_stride, kv_cache, v_offset, nullptr, tiles, seqs, block_tables,          \
            num_heads, num_kv_heads, block_size, scale_log2, max_splits, partial_acc,           \
            partial_ml);                                                                        \
    }

// Kernel names: paged_attention[_walk|_split]_<query>_<cache>_d<head_dim>.
ATTENTION(f32_f32, float, float, 64)
ATTENTION(f32_f32, float, float, 128)
ATTENTION(f32_f16, float, __half, 64)
ATTENTION(f32_f16, float, __half, 128)
ATTENTION(f32_bf16, float, __nv_bfloat16, 64)
ATTENTION(f32_bf16, float, __nv_bfloat16, 128)
ATTENTION(f16_f16, __half, __half, 64)
ATTENTION(f16_f16, __half, __half, 128)
ATTENTION(bf16_bf16, __nv_bfloat16, __nv_bfloat16, 64)
ATTENTION(bf16_bf16, __nv_bfloat16, __nv_bfloat16, 128)
ATTENTION(f16_bf16, __half, __nv_bfloat16, 64)
ATTENTION(f16_bf16, __half, __nv_bfloat16, 128)
ATTENTION(bf16_f16, __nv_bfloat16, __half, 64)
ATTENTION(bf16_f16, __nv_bfloat16, __half, 128)

#define COMBINE(SUFFIX, Q)                                                                      \
    extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) attention_combine_##SUFFIX(   \
        const float* partial_acc, const float* partial_ml, const uint32_t* token_splits,        \
        Q* out, int num_heads, int head_dim, int max_splits) {                                  \
        attention_combine<Q>(partial_acc, partial_ml, token_splits, out, num_heads, head_dim,   \
                             max_splits);                                                       \
    }

COMBINE(f32, float)
COMBINE(f16, __half)
COMBINE(bf16, __nv_bfloat16)
