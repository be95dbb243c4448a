// Fused element-wise steps of the forward: each replaces several of candle's launches (and the
// tensors between them) with one.
#include "common.cuh"

using namespace sluice;

// These are mirrored by sluice_kernels::cuda_plan (a test holds them equal).
#define NORM_THREADS 256
#define ROPE_THREADS 128
#define SWIGLU_THREADS 256

// out[0] = x + delta (the new residual stream), out[1] = rms_norm(out[0]) * weight, each
// [rows, hidden]: the residual add and the next norm in one pass. Without delta (has_delta 0)
// out[0] is a copy of x. Grid: one block per row.
template <typename T>
__device__ __forceinline__ void add_rms_norm(const T* __restrict__ x, const T* __restrict__ delta,
                                             int has_delta, const T* __restrict__ weight,
                                             T* __restrict__ out, int rows, int hidden,
                                             float eps) {
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const T* x_row = x + row * hidden;
    T* sum_row = out + row * hidden;
    T* norm_row = out + ((size_t)rows + row) * hidden;
    float sumsq = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = to_float(x_row[i]);
        if (has_delta) v += to_float(delta[row * hidden + i]);
        const T stored = from_float<T>(v);
        sum_row[i] = stored;
        const float r = to_float(stored);  // normalise what the residual stream holds
        sumsq += r * r;
    }
    const float inv_rms = rsqrtf(block_sum(sumsq, scratch) / hidden + eps);
    // Each thread reads back only the elements it wrote itself.
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        norm_row[i] = from_float<T>(to_float(sum_row[i]) * inv_rms * to_float(weight[i]));
}

// RoPE by per-token positions on the Q and K heads of a fused QKV row (half-split convention,
// as candle's rope_thd), with qwen3's per-head RMSNorm before it when has_qk_norm. Writes
// out [T, (num_heads + num_kv_heads) * head_dim]: the rotated Q heads, then the K heads.
// cos/sin: [max_positions, head_dim / 2] f32. Grid: (T, ceil(heads / warps)); a warp per head.
template <typename T>
__device__ __forceinline__ void rope_qk(const T* __restrict__ qkv, long qkv_row_stride,
                                        const float* __restrict__ cos,
                                        const float* __restrict__ sin,
                                        const uint32_t* __restrict__ positions,
                                        const T* __restrict__ q_norm,
                                        const T* __restrict__ k_norm, int has_qk_norm,
                                        float eps, T* __restrict__ out, int num_heads,
                                        int num_kv_heads, int head_dim) {
    const int heads = num_heads + num_kv_heads;
    const int lane = threadIdx.x & 31;
    const int head = blockIdx.y * (ROPE_THREADS / 32) + (threadIdx.x >> 5);
    if (head >= heads) return;
    const size_t token = blockIdx.x;
    const T* in = qkv + token * qkv_row_stride + (size_t)head * head_dim;
    T* dst = out + (token * heads + head) * head_dim;
    const int half = head_dim / 2;
    float inv_rms = 1.0f;
    const T* norm = head < num_heads ? q_norm : k_norm;
    if (has_qk_norm) {
        float sumsq = 0.0f;
        for (int i = lane; i < head_dim; i += 32) {
            const float v = to_float(in[i]);
            sumsq += v * v;
        }
        inv_rms = rsqrtf(warp_sum(sumsq) / head_dim + eps);
    }
    const float* cos_row = cos + (size_t)positions[token] * half;
    const float* sin_row = sin + (size_t)positions[token] * half;
    for (int i = lane; i < half; i += 32) {
        float x1 = to_float(in[i]), x2 = to_float(in[i + half]);
        if (has_qk_norm) {
            // As the unfused path: the normed head is rounded to T before it is rotated.
            x1 = to_float(from_float<T>(x1 * inv_rms * to_float(norm[i])));
            x2 = to_float(from_float<T>(x2 * inv_rms * to_float(norm[i + half])));
        }
        const float c = cos_row[i], s = sin_row[i];
        dst[i] = from_float<T>(x1 * c - x2 * s);
        dst[i + half] = from_float<T>(x1 * s + x2 * c);
    }
}

// silu(gate) * up for gate_up [rows, 2 * inter] (gate then up in each row) into [rows, inter].
template <typename T>
__device__ __forceinline__ void swiglu(const T* __restrict__ gate_up, T* __restrict__ out,
                                       int rows, int inter) {
    const size_t n = (size_t)rows * inter;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / inter, c = i % inter;
        const float g = to_float(gate_up[r * 2 * inter + c]);
        const float u = to_float(gate_up[r * 2 * inter + inter + c]);
        out[i] = from_float<T>(g / (1.0f + expf(-g)) * u);
    }
}

// Rows `ids` of `table: [vocab, hidden]` into `out: [rows, hidden]` (the token embedding of a
// step whose ids are on the device). Grid: one block per row.
template <typename T>
__device__ __forceinline__ void gather_rows(const T* __restrict__ table,
                                            const uint32_t* __restrict__ ids, T* __restrict__ out,
                                            int hidden) {
    const size_t row = blockIdx.x;
    const T* src = table + (size_t)ids[row] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[row * hidden + i] = src[i];
}

// y[r][c] += bias[c] for y [rows, cols], rounded to T as candle's broadcast add rounds.
template <typename T>
__device__ __forceinline__ void add_bias(T* __restrict__ y, const T* __restrict__ bias, int rows,
                                         int cols) {
    const size_t n = (size_t)rows * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = from_float<T>(to_float(y[i]) + to_float(bias[i % cols]));
}

#define FUSED(SUFFIX, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS) add_rms_norm_##SUFFIX(           \
        const T* x, const T* delta, int has_delta, const T* weight, T* out, int rows,           \
        int hidden, float eps) {                                                                \
        add_rms_norm<T>(x, delta, has_delta, weight, out, rows, hidden, eps);                   \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(ROPE_THREADS) rope_qk_##SUFFIX(                \
        const T* qkv, long qkv_row_stride, const float* cos, const float* sin,                  \
        const uint32_t* positions, const T* q_norm, const T* k_norm, int has_qk_norm,           \
        float eps, T* out, int num_heads, int num_kv_heads, int head_dim) {                     \
        rope_qk<T>(qkv, qkv_row_stride, cos, sin, positions, q_norm, k_norm, has_qk_norm, eps,  \
                   out, num_heads, num_kv_heads, head_dim);                                     \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS) swiglu_##SUFFIX(               \
        const T* gate_up, T* out, int rows, int inter) {                                        \
        swiglu<T>(gate_up, out, rows, inter);                                                   \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS) gather_rows_##SUFFIX(          \
        const T* table, const uint32_t* ids, T* out, int hidden) {                              \
        gather_rows<T>(table, ids, out, hidden);                                                \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS) add_bias_##SUFFIX(             \
        T* y, const T* bias, int rows, int cols) {                                              \
        add_bias<T>(y, bias, rows, cols);                                                       \
    }

FUSED(f32, float)
FUSED(f16, __half)
FUSED(bf16, __nv_bfloat16)
