//! The chunk kernel for x86 CPUs with AVX2, FMA and F16C but no AVX-512: the same work as the
//! AVX-512 kernel of `avx512.rs` (a chunk of 16 keys scored for every query head of a group
//! while it is in L1, one online-softmax update, the values accumulated), with each 16-key
//! chunk held as two 8-lane registers.
//!
//! A prefill's queries that see all of a chunk are taken several at a time ([`tile_queries`]),
//! so that small groups (SmolLM2's 3 heads a KV head) still keep enough rows in flight to hide
//! FMA latency and share each key and value load among more rows. A row's arithmetic is the
//! same whichever rows share its call.

/// Queries a call takes at most for a group of `group` heads: rows of up to 6 (query, head)
/// pairs, whose 12 score accumulators, 2 key registers and a broadcast fill the 16 registers.
pub(super) fn tile_queries(group: usize) -> usize {
    (6 / group.max(1)).max(1)
}

#[cfg(target_arch = "x86_64")]
pub(super) use x86::*;

#[cfg(not(target_arch = "x86_64"))]
mod portable_stub {
    use super::super::{Chunk, KvElem, RowState};

    /// Sealing trait of [`KvElem`] (the AVX2 loads exist only on x86_64).
    pub trait Load8 {}
    impl Load8 for f32 {}
    impl Load8 for half::f16 {}

    /// # Safety
    /// Never called: the AVX2 path is never picked off x86_64.
    pub unsafe fn chunk_for_rows<E: KvElem>(_: usize, _: &Chunk<'_, E>, _: RowState<'_>) {
        unreachable!("the AVX2 path is never picked off x86_64")
    }
}
#[cfg(not(target_arch = "x86_64"))]
pub(super) use portable_stub::*;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::super::{Chunk, KvElem, RowState, LANES, MAX_GROUP};
    use crate::cpu::simd::x86::{exp8, hmax8, hsum8};

    /// How 8 of the cache's elements become 8 f32 lanes (a sealing trait of [`KvElem`]).
    pub trait Load8 {
        /// # Safety
        /// The CPU has AVX2 and F16C; 8 elements from `p` are readable.
        unsafe fn load8(p: *const Self) -> __m256;
    }

    impl Load8 for f32 {
        #[inline(always)]
        unsafe fn load8(p: *const f32) -> __m256 {
            // SAFETY: the caller's promise (see `Load8::load8`).
            unsafe { _mm256_loadu_ps(p) }
        }
    }

    impl Load8 for f16 {
        #[inline(always)]
        unsafe fn load8(p: *const f16) -> __m256 {
            // SAFETY: the caller's promise (see `Load8::load8`).
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
    }

    /// The 16 key lanes of one dimension row at `p`, of which the first `n` are keys. Lanes past
    /// `n` hold whatever the block holds there (the caller masks their scores) when all 16
    /// lie in the block; otherwise they are copies of key 0, read from a staged copy so no
    /// load leaves the block.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; `p[..n]` is readable, and `p[..16]` too if `all_lanes`.
    #[inline(always)]
    unsafe fn load_keys<E: KvElem>(p: *const E, n: usize, all_lanes: bool) -> (__m256, __m256) {
        // SAFETY: the caller's promise on `p`; the staged copy is 16 elements long.
        unsafe {
            if all_lanes {
                return (E::load8(p), E::load8(p.add(8)));
            }
            let mut staged = [*p; LANES];
            std::ptr::copy_nonoverlapping(p, staged.as_mut_ptr(), n.min(LANES));
            (E::load8(staged.as_ptr()), E::load8(staged.as_ptr().add(8)))
        }
    }

    /// The online-softmax update of a chunk's scores (keys 0..8 in `lo`, 8..16 in `hi`, per
    /// head of the group, unscaled): rescales the rows' sums and accumulators when the
    /// maximum grows, and returns each head's weights of the chunk's keys (zero before
    /// `first_key`, where a sliding window starts, and at or past `n_keys`).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `s` holds G rows of `head_dim` (a multiple of 8) values.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    pub(in crate::cpu::attention) unsafe fn softmax_chunk<const G: usize>(
        lo: &[__m256; G],
        hi: &[__m256; G],
        first_key: usize,
        n_keys: usize,
        scale: f32,
        d: usize,
        s: &mut RowState<'_>,
    ) -> [[f32; LANES]; G] {
        // SAFETY: the CPU features and the sizes of `s` are the caller's promise.
        unsafe {
            // Lanes before `first_key` or at or past `n_keys` are not keys of this query: -inf
            // scores, zero weights.
            let n = _mm256_set1_epi32(n_keys as i32);
            let before = _mm256_set1_epi32(first_key as i32 - 1);
            let lanes_lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let lanes_hi = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
            let valid_lo = _mm256_castsi256_ps(_mm256_and_si256(
                _mm256_cmpgt_epi32(n, lanes_lo),
                _mm256_cmpgt_epi32(lanes_lo, before),
            ));
            let valid_hi = _mm256_castsi256_ps(_mm256_and_si256(
                _mm256_cmpgt_epi32(n, lanes_hi),
                _mm256_cmpgt_epi32(lanes_hi, before),
            ));
            let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
            let scale = _mm256_set1_ps(scale);
            let mut probs = [[0f32; LANES]; G];
            for g in 0..G {
                let s_lo = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(lo[g], scale), valid_lo);
                let s_hi = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(hi[g], scale), valid_hi);
                let new_max = s.maxes[g].max(hmax8(_mm256_max_ps(s_lo, s_hi)));
                if new_max > s.maxes[g] {
                    let correction = _mm256_set1_ps(s.maxes[g] - new_max);
                    let correction = _mm256_cvtss_f32(exp8(correction));
                    s.sums[g] *= correction;
                    let acc = s.accs.as_mut_ptr().add(g * d);
                    let cv = _mm256_set1_ps(correction);
                    for j in (0..d).step_by(8) {
                        _mm256_storeu_ps(
                            acc.add(j),
                            _mm256_mul_ps(_mm256_loadu_ps(acc.add(j)), cv),
                        );
                    }
                    s.maxes[g] = new_max;
                }
                let m = _mm256_set1_ps(new_max);
                let p_lo = _mm256_and_ps(exp8(_mm256_sub_ps(s_lo, m)), valid_lo);
                let p_hi = _mm256_and_ps(exp8(_mm256_sub_ps(s_hi, m)), valid_hi);
                s.sums[g] += hsum8(_mm256_add_ps(p_lo, p_hi));
                _mm256_storeu_ps(probs[g].as_mut_ptr(), p_lo);
                _mm256_storeu_ps(probs[g].as_mut_ptr().add(8), p_hi);
            }

            probs
        }
    }

    /// Dispatches to a kernel specialised for the call's rows (`c.queries * c.group`), so their
    /// accumulators live in registers.
    ///
    /// # Safety
    /// As [`chunk`], and `rows` is `c.queries * c.group`, 1..=8.
    #[inline(always)]
    pub unsafe fn chunk_for_rows<E: KvElem>(rows: usize, c: &Chunk<'_, E>, s: RowState<'_>) {
        // SAFETY: forwarded: the caller makes `chunk`'s promise for this row count.
        unsafe {
            match rows {
                1 => chunk::<E, 1>(c, s),
                2 => chunk::<E, 2>(c, s),
                3 => chunk::<E, 3>(c, s),
                4 => chunk::<E, 4>(c, s),
                5 => chunk::<E, 5>(c, s),
                6 => chunk::<E, 6>(c, s),
                7 => chunk::<E, 7>(c, s),
                8 => chunk::<E, 8>(c, s),
                _ => unreachable!("groups above {MAX_GROUP} take the portable path, and tiles of several queries have at most 6 rows"),
            }
        }
    }

    /// Rows of one register pass: 2 score accumulators a row, 2 key registers and a broadcast
    /// take 15 of the 16 registers at 6 rows; past that (groups of 7 and 8 heads, as Qwen2.5-0.5B's,
    /// 7B's and 3B's) an accumulator would go through the stack at every dimension (or key), a
    /// store-to-load wait on its FMA chain, so those rows take two passes.
    const PASS_ROWS: usize = 6;

    // Several register arrays are indexed by the same row `g` and key `t`; index loops say
    // that more plainly than zipped iterators.
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `c.q` holds `c.queries` (G rows in all with the group's
    /// heads) query groups `c.q_stride` apart, of `c.group` heads of `c.head_dim` (a multiple
    /// of 16) values; `c.k` `c.head_dim` rows of `c.k_stride` keys of which the first
    /// `c.n_keys` (1..=16) are read (all 16 if `c.all_lanes_in_block`), `c.v` `c.n_keys` rows
    /// of `c.head_dim` values, and `s` G rows.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk<E: KvElem, const G: usize>(c: &Chunk<'_, E>, mut s: RowState<'_>) {
        // SAFETY: the CPU features and the sizes of `c` and `s` are the caller's promise; every
        // load and store below is inside them.
        unsafe {
            let d = c.head_dim;
            let rows = c.row_starts::<G>();

            // Scores of keys 0..8 and 8..16 for each row: 2 FMA chains a row, in one pass of up
            // to 6 rows, else two; one load of each key row serves every row of a pass.
            let mut lo = [_mm256_setzero_ps(); G];
            let mut hi = [_mm256_setzero_ps(); G];
            match G {
                0..=PASS_ROWS => scores_pass::<E, G, G>(c, &rows, 0, &mut lo, &mut hi),
                7 => {
                    scores_pass::<E, G, 4>(c, &rows, 0, &mut lo, &mut hi);
                    scores_pass::<E, G, 3>(c, &rows, 4, &mut lo, &mut hi);
                }
                _ => {
                    scores_pass::<E, G, 4>(c, &rows, 0, &mut lo, &mut hi);
                    scores_pass::<E, G, 4>(c, &rows, 4, &mut lo, &mut hi);
                }
            }

            let probs = softmax_chunk::<G>(&lo, &hi, c.first_key, c.n_keys, c.scale, d, &mut s);

            // Values, 32 dimensions at a time where the rows' accumulators and the 4 value
            // registers fit in the 16 (twice the independent FMA chains of 16; at 3 rows one
            // accumulator would go through the stack every key), else 16 in passes of at most 6
            // rows: one load of each value row serves every row of a pass. Each lane sums its
            // keys in the same order either way.
            let mut j = 0;
            if G <= 2 {
                while j + 2 * LANES <= d {
                    values_pass::<E, G, G, 4>(c, &probs, 0, j, &mut s);
                    j += 2 * LANES;
                }
            }
            while j < d {
                match G {
                    0..=PASS_ROWS => values_pass::<E, G, G, 2>(c, &probs, 0, j, &mut s),
                    7 => {
                        values_pass::<E, G, 4, 2>(c, &probs, 0, j, &mut s);
                        values_pass::<E, G, 3, 2>(c, &probs, 4, j, &mut s);
                    }
                    _ => {
                        values_pass::<E, G, 4, 2>(c, &probs, 0, j, &mut s);
                        values_pass::<E, G, 4, 2>(c, &probs, 4, j, &mut s);
                    }
                }
                j += LANES;
            }
        }
    }

    /// Scores rows `first..first + N` of the call: `lo` and `hi` of each, keys 0..8 and 8..16.
    ///
    /// # Safety
    /// As [`chunk`], and `first + N <= G`.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn scores_pass<E: KvElem, const G: usize, const N: usize>(
        c: &Chunk<'_, E>,
        rows: &[*const f32; G],
        first: usize,
        lo: &mut [__m256; G],
        hi: &mut [__m256; G],
    ) {
        // SAFETY: the caller's promise: every load is inside the rows' queries and the chunk's
        // keys.
        unsafe {
            let kp = c.k.as_ptr();
            let mut l = [_mm256_setzero_ps(); N];
            let mut h = [_mm256_setzero_ps(); N];
            for dim in 0..c.head_dim {
                let (k0, k1) = load_keys(kp.add(dim * c.k_stride), c.n_keys, c.all_lanes_in_block);
                for i in 0..N {
                    let qv = _mm256_broadcast_ss(&*rows[first + i].add(dim));
                    l[i] = _mm256_fmadd_ps(qv, k0, l[i]);
                    h[i] = _mm256_fmadd_ps(qv, k1, h[i]);
                }
            }
            lo[first..first + N].copy_from_slice(&l);
            hi[first..first + N].copy_from_slice(&h);
        }
    }

    /// Adds the chunk's weighted values into dimensions `j..j + 8 * R` of the accumulators of
    /// rows `first..first + N`: `R` registers a row, loaded once and stored once.
    ///
    /// # Safety
    /// As [`chunk`], `first + N <= G` and `j + 8 * R <= c.head_dim`.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn values_pass<E: KvElem, const G: usize, const N: usize, const R: usize>(
        c: &Chunk<'_, E>,
        probs: &[[f32; LANES]; G],
        first: usize,
        j: usize,
        s: &mut RowState<'_>,
    ) {
        // SAFETY: the caller's promise: every load and store is inside the chunk's values
        // and the rows' accumulators.
        unsafe {
            let d = c.head_dim;
            let vp = c.v.as_ptr();
            let accp = s.accs.as_mut_ptr().add(first * d);
            let mut a = [[_mm256_setzero_ps(); R]; N];
            for g in 0..N {
                for r in 0..R {
                    a[g][r] = _mm256_loadu_ps(accp.add(g * d + j + 8 * r));
                }
            }
            for t in c.first_key..c.n_keys {
                let mut v = [_mm256_setzero_ps(); R];
                for r in 0..R {
                    v[r] = E::load8(vp.add(t * d + j + 8 * r));
                }
                for g in 0..N {
                    let p = _mm256_broadcast_ss(&probs[first + g][t]);
                    for r in 0..R {
                        a[g][r] = _mm256_fmadd_ps(p, v[r], a[g][r]);
                    }
                }
            }
            for g in 0..N {
                for r in 0..R {
                    _mm256_storeu_ps(accp.add(g * d + j + 8 * r), a[g][r]);
                }
            }
        }
    }
}
