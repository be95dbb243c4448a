// Sampling on the device: greedy, temperature, top-k, top-p and min-p for every row of a step's
// logits in one launch, so only a token id and its logprob per row cross to the host. The rule
// is stated in plain Rust by sluice_kernels::sampling::sample_row, this kernel's oracle.
//
// One block per row. Min-p, top-k and top-p keep the tokens whose tempered probability reaches
// a threshold: min-p sets it, top-k and top-p raise it, found by bisection on the threshold
// (each probe one pass over the vocabulary), so nothing is sorted: tokens tied at the
// threshold are all kept. The draw walks the kept tokens
// in vocabulary order with the row's uniform number, which the host draws from the sequence's
// own seeded generator. The logprob is the chosen token's under the raw logits (temperature 1,
// nothing filtered), as the engine reports it.
#include "common.cuh"

using namespace sluice;

// Mirrored by sluice_kernels::cuda_plan (a test holds them equal).
#define SAMPLE_THREADS 1024
// Bisection steps for a threshold in (0, 1]: 2^-30 of resolution. Mirrored by
// sluice_kernels::sampling (a test holds them equal).
#define THRESHOLD_STEPS 30

// Tempered, unnormalised probability of logit x: 1 for the row's maximum.
__device__ __forceinline__ float tempered(float x, float max_logit, float inv_temperature) {
    return expf((x - max_logit) * inv_temperature);
}

// Count (want_mass 0) or mass (1) of the tempered probabilities at or above thr.
__device__ float kept(const float* x, int vocab, float max_logit, float inv_t, float thr,
                      int want_mass, float* scratch) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float q = tempered(x[i], max_logit, inv_t);
        if (q >= thr) acc += want_mass ? q : 1.0f;
    }
    return block_sum(acc, scratch);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(const float* __restrict__ logits, long row_stride, int vocab,
                const float* __restrict__ temperature, const uint32_t* __restrict__ top_k,
                const float* __restrict__ top_p, const float* __restrict__ min_p,
                const float* __restrict__ uniform,
                uint32_t* __restrict__ token_out, float* __restrict__ logprob_out) {
    __shared__ float scratch[32];
    __shared__ float best_val_s[32];
    __shared__ int best_idx_s[32];
    __shared__ float scan_s[32];
    __shared__ int chosen_s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const size_t row = blockIdx.x;
    const float* x = logits + row * row_stride;

    // Maximum and its lowest index (greedy's token).
    float best = -INFINITY;
    int best_idx = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (x[i] > best) best = x[i], best_idx = i;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(FULL_MASK, best, o);
        const int j = __shfl_xor_sync(FULL_MASK, best_idx, o);
        if (v > best || (v == best && j < best_idx)) best = v, best_idx = j;
    }
    if (lane == 0) best_val_s[warp] = best, best_idx_s[warp] = best_idx;
    __syncthreads();
    best = lane < warps ? best_val_s[lane] : -INFINITY;
    best_idx = lane < warps ? best_idx_s[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(FULL_MASK, best, o);
        const int j = __shfl_xor_sync(FULL_MASK, best_idx, o);
        if (v > best || (v == best && j < best_idx)) best = v, best_idx = j;
    }
    const float max_logit = best;
    const int argmax = best_idx;

    // log of the raw softmax's normaliser, for the logprob.
    float raw = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) raw += expf(x[i] - max_logit);
    const float log_z = max_logit + logf(block_sum(raw, scratch));

    int chosen = argmax;
    const float temp = temperature[row];
    if (temp > 0.0f && isfinite(max_logit)) {
        const float inv_t = 1.0f / temp;
        float thr = fmaxf(min_p[row], 0.0f);
        const int k = (int)top_k[row];
        if (k > 0 && k < vocab) {
            // Largest threshold keeping at least k tokens: count(q >= lo) >= k throughout.
            float lo = 0.0f, hi = 1.0f;
            for (int it = 0; it < THRESHOLD_STEPS; ++it) {
                const float mid = 0.5f * (lo + hi);
                if (kept(x, vocab, max_logit, inv_t, mid, 0, scratch) >= (float)k) lo = mid;
                else hi = mid;
            }
            thr = fmaxf(thr, lo);
        }
        const float p = top_p[row];
        if (p < 1.0f) {
            // Largest threshold whose kept mass is still at least p of what top-k kept.
            const float target = p * kept(x, vocab, max_logit, inv_t, thr, 1, scratch);
            float lo = thr, hi = 1.0f;
            for (int it = 0; it < THRESHOLD_STEPS; ++it) {
                const float mid = 0.5f * (lo + hi);
                if (kept(x, vocab, max_logit, inv_t, mid, 1, scratch) >= target) lo = mid;
                else hi = mid;
            }
            thr = lo;
        }

        // Draw: each thread owns a contiguous run of the vocabulary; an exclusive scan of the
        // runs' kept mass finds the run that holds uniform * total.
        const int run = (vocab + blockDim.x - 1) / blockDim.x;
        const int begin = min(vocab, (int)threadIdx.x * run), end = min(vocab, begin + run);
        float own = 0.0f;
        for (int i = begin; i < end; ++i) {
            const float q = tempered(x[i], max_logit, inv_t);
            if (q >= thr) own += q;
        }
        float inclusive = own;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float n = __shfl_up_sync(FULL_MASK, inclusive, o);
            if (lane >= o) inclusive += n;
        }
        if (lane == 31) scan_s[warp] = inclusive;
        if (threadIdx.x == 0) chosen_s = -1;
        __syncthreads();
        if (warp == 0) {
            float w = lane < warps ? scan_s[lane] : 0.0f;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float n = __shfl_up_sync(FULL_MASK, w, o);
                if (lane >= o) w += n;
            }
            scan_s[lane] = w;
        }
        __syncthreads();
        const float prefix = (warp > 0 ? scan_s[warp - 1] : 0.0f) + inclusive - own;
        const float target = uniform[row] * scan_s[warps - 1];
        if (own > 0.0f && target >= prefix && target < prefix + own) {
            float acc = prefix;
            int last = -1;
            for (int i = begin; i < end; ++i) {
                const float q = tempered(x[i], max_logit, inv_t);
                if (q < thr) continue;
                acc += q;
                last = i;
                if (target < acc) break;
            }
            chosen_s = last;
        }
        __syncthreads();
        // Rounding can leave the target past every run: the maximum is always kept.
        if (chosen_s >= 0) chosen = chosen_s;
    }
    if (threadIdx.x == 0) {
        token_out[row] = (uint32_t)chosen;
        logprob_out[row] = x[chosen] - log_z;
    }
}
