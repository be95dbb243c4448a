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
// nothing filtered), as the engine reports it, and so are those of the row's top_n most likely
// tokens (one block-wide pass each: the next token after the previous in the order value
// descending, index ascending).
#include "common.cuh"

using namespace sluice;

// Mirrored by sluice_kernels::cuda_plan (a test holds them equal).
#define SAMPLE_THREADS 1024
// Bisection steps for a threshold in (0, 1]: 2^-30 of resolution. Mirrored by
// sluice_kernels::sampling (a test holds them equal).
#define THRESHOLD_STEPS 30
// Most top logprobs a row may ask for (OpenAI's limit). Mirrored by sluice_kernels::sampling.
#define MAX_TOP_LOGPROBS 20
// A row's parameters and its results, in 32-bit words. Mirrored by sluice_kernels::cuda_plan
// (a test holds them equal).
#define SAMPLE_PARAM_WORDS 8
#define SAMPLE_OUT_WORDS 42
static_assert(SAMPLE_OUT_WORDS == 2 + 2 * MAX_TOP_LOGPROBS, "token, logprob, top tokens, top logprobs");

// One sampled row's parameters, uploaded for the whole step in one copy: the logits row it
// reads (so the step's logits are sampled where they lie, no rows gathered first) and its
// rule. Floats travel as their bits.
struct SampleParams {
    uint32_t logits_row;
    uint32_t top_k;
    uint32_t top_n;
    float temperature;
    float top_p;
    float min_p;
    float uniform;
    uint32_t unused;
};
static_assert(sizeof(SampleParams) == 4 * SAMPLE_PARAM_WORDS, "the host packs 8 words a row");

// The first element of x after (after_v, after_i) in the order value descending, index
// ascending (after_i < 0: the first of all), NaN never; index 0x7fffffff when there is none.
// Every thread gets the result.
__device__ void block_next_best(const float* x, int vocab, float after_v, int after_i,
                                float* val_s, int* idx_s, float& out_v, int& out_i) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float best = -INFINITY;
    int best_idx = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = x[i];
        const bool later = after_i < 0 || v < after_v || (v == after_v && i > after_i);
        if (later && !isnan(v) && (v > best || (v == best && i < best_idx)))
            best = v, best_idx = i;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(FULL_MASK, best, o);
        const int j = __shfl_xor_sync(FULL_MASK, best_idx, o);
        if (v > best || (v == best && j < best_idx)) best = v, best_idx = j;
    }
    __syncthreads();  // the shared slots may still be read by a previous call
    if (lane == 0) val_s[warp] = best, idx_s[warp] = best_idx;
    __syncthreads();
    best = lane < warps ? val_s[lane] : -INFINITY;
    best_idx = lane < warps ? idx_s[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(FULL_MASK, best, o);
        const int j = __shfl_xor_sync(FULL_MASK, best_idx, o);
        if (v > best || (v == best && j < best_idx)) best = v, best_idx = j;
    }
    out_v = best;
    out_i = best_idx;
}

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

// Row i's results, SAMPLE_OUT_WORDS words from out + i * SAMPLE_OUT_WORDS: the token, its
// logprob's bits, MAX_TOP_LOGPROBS top tokens (0xffffffff after the last one there is), then
// their logprobs' bits. One copy brings the whole step's back.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(const float* __restrict__ logits, long row_stride, int vocab,
                const SampleParams* __restrict__ params, uint32_t* __restrict__ out) {
    __shared__ float scratch[32];
    __shared__ float best_val_s[32];
    __shared__ int best_idx_s[32];
    __shared__ float scan_s[32];
    __shared__ int chosen_s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const SampleParams p = params[blockIdx.x];
    const float* x = logits + (size_t)p.logits_row * row_stride;
    uint32_t* const row_out = out + (size_t)blockIdx.x * SAMPLE_OUT_WORDS;
    uint32_t* const top_tokens_out = row_out + 2;
    uint32_t* const top_logprobs_out = row_out + 2 + MAX_TOP_LOGPROBS;

    // Maximum and its lowest index (greedy's token); the first token when every logit is
    // -inf (or NaN), as the Rust rule.
    float max_logit;
    int argmax;
    block_next_best(x, vocab, 0.0f, -1, best_val_s, best_idx_s, max_logit, argmax);
    if (argmax == 0x7fffffff) argmax = 0;

    // log of the raw softmax's normaliser, for the logprob.
    float raw = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) raw += expf(x[i] - max_logit);
    const float log_z = max_logit + logf(block_sum(raw, scratch));

    // The top logprobs, one pass each.
    const int n = min((int)p.top_n, MAX_TOP_LOGPROBS);
    float after_v = 0.0f;
    int after_i = -1;
    for (int r = 0; r < n; ++r) {
        float v;
        int i;
        block_next_best(x, vocab, after_v, after_i, best_val_s, best_idx_s, v, i);
        if (i == 0x7fffffff) {
            // Fewer tokens than asked for: the host reads the list up to this mark.
            if (threadIdx.x == 0) top_tokens_out[r] = 0xffffffffu;
            break;
        }
        if (threadIdx.x == 0) {
            top_tokens_out[r] = (uint32_t)i;
            top_logprobs_out[r] = __float_as_uint(v - log_z);
        }
        after_v = v;
        after_i = i;
    }

    int chosen = argmax;
    const float temp = p.temperature;
    if (temp > 0.0f && isfinite(max_logit)) {
        const float inv_t = 1.0f / temp;
        float thr = fmaxf(p.min_p, 0.0f);
        const int k = (int)p.top_k;
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
        const float top_p = p.top_p;
        if (top_p < 1.0f) {
            // Largest threshold whose kept mass is still at least top_p of what top-k kept.
            const float target = top_p * kept(x, vocab, max_logit, inv_t, thr, 1, scratch);
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
        const float target = p.uniform * scan_s[warps - 1];
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
        row_out[0] = (uint32_t)chosen;
        row_out[1] = __float_as_uint(x[chosen] - log_z);
    }
}
