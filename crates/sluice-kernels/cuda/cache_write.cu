// The step's new K and V written into the paged cache through `slot_mapping`: one launch per
// layer for every token of the step, whatever sequence it belongs to.
//
// Cache layout (sluice_kernels::paged::KvLayout), per layer:
//   K: [num_blocks][num_kv_heads][head_dim][block_size]   (dimension-major within a block)
//   V: [num_blocks][num_kv_heads][block_size][head_dim]
// The layer's K and V live in one buffer: K at offset 0, V at `v_offset` elements.
#include "common.cuh"

using namespace sluice;

// Grid: one block per token. Threads stride over the token's num_kv_heads * head_dim values.
template <typename In, typename Cache>
__device__ void write_kv(const In* __restrict__ k, const In* __restrict__ v,
                         long k_row_stride, long v_row_stride, Cache* __restrict__ kv_cache,
                         long v_offset, const uint32_t* __restrict__ slot_mapping,
                         int num_kv_heads, int head_dim, int block_size) {
    const int token = blockIdx.x;
    const uint32_t slot = slot_mapping[token];
    // A padding row of a replayed decode graph (sluice_kernels::cuda_plan::PAD_SLOT): no write.
    if (slot == 0xffffffffu) return;
    const size_t block = slot / block_size, in_block = slot % block_size;
    const int n = num_kv_heads * head_dim;
    const In* k_row = k + token * k_row_stride;
    const In* v_row = v + token * v_row_stride;
    Cache* v_cache = kv_cache + v_offset;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int head = i / head_dim, dim = i % head_dim;
        const size_t run = (block * num_kv_heads + head) * head_dim * block_size;
        kv_cache[run + dim * block_size + in_block] = from_float<Cache>(to_float(k_row[i]));
        v_cache[run + in_block * head_dim + dim] = from_float<Cache>(to_float(v_row[i]));
    }
}

#define WRITE_KV(NAME, IN, CACHE)                                                            \
    extern "C" __global__ void NAME(const IN* k, const IN* v, long k_row_stride,            \
                                    long v_row_stride, CACHE* kv_cache, long v_offset,       \
                                    const uint32_t* slot_mapping, int num_kv_heads,          \
                                    int head_dim, int block_size) {                          \
        write_kv<IN, CACHE>(k, v, k_row_stride, v_row_stride, kv_cache, v_offset,            \
                            slot_mapping, num_kv_heads, head_dim, block_size);               \
    }

// Kernel names: write_kv_<activation>_<cache>.
WRITE_KV(write_kv_f32_f32, float, float)
WRITE_KV(write_kv_f32_f16, float, __half)
WRITE_KV(write_kv_f32_bf16, float, __nv_bfloat16)
WRITE_KV(write_kv_f16_f16, __half, __half)
WRITE_KV(write_kv_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
WRITE_KV(write_kv_f16_bf16, __half, __nv_bfloat16)
WRITE_KV(write_kv_bf16_f16, __nv_bfloat16, __half)
