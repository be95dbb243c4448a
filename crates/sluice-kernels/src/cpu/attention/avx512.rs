//! The chunk kernel for x86 CPUs with AVX-512 (F, BW, VL, F16C and FMA): a chunk of 16 keys
//! is one register, scored for every query head of a group while it is in L1, one
//! online-softmax update, the values accumulated. Its arithmetic is the AVX2 kernel's
//! ([`super::avx2`]) lane for lane, so the two give the same bits. A prefill's queries that
//! see all of a chunk are taken several at a time (`tile_queries`), up to 8 (query, head) rows
//! a call.

#[cfg(target_arch = "x86_64")]
pub(super) use x86::*;

#[cfg(not(target_arch = "x86_64"))]
mod portable_stub {
    use super::super::{Chunk, KvElem, RowState};

    /// Sealing trait of [`KvElem`].
    pub trait Load {}
    impl Load for f32 {}
    impl Load for half::f16 {}

    /// # Safety
    /// Never called: `fast()` is false off x86_64.
    pub unsafe fn chunk_for_rows<E: KvElem>(_: usize, _: &Chunk<'_, E>, _: RowState<'_>) {
        unreachable!("fast() is false off x86_64")
    }

    pub fn tile_queries(_: usize) -> usize {
        1
    }

    pub fn prefetch<E>(_: &[E]) {}
}
#[cfg(not(target_arch = "x86_64"))]
pub(super) use portable_stub::*;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::super::{Chunk, KvElem, RowState, LANES, MAX_GROUP};
    use crate::cpu::simd::x86::{exp, exp_scalar, hsum8};

    /// How the cache's element type becomes 16 f32 lanes (the sealing trait of [`KvElem`]).
    pub trait Load {
        /// Loads the lanes of `mask` from `p` (zero in the others).
        ///
        /// # Safety
        /// The CPU has AVX-512F, BW and F16C; the masked lanes of `p` are readable.
        unsafe fn load(p: *const Self, mask: u16) -> __m512;
    }

    impl Load for f32 {
        #[inline(always)]
        unsafe fn load(p: *const f32, mask: u16) -> __m512 {
            // SAFETY: the caller's promise (see `Load::load`).
            unsafe { _mm512_maskz_loadu_ps(mask, p) }
        }
    }

    impl Load for f16 {
        #[inline(always)]
        unsafe fn load(p: *const f16, mask: u16) -> __m512 {
            // SAFETY: the caller's promise (see `Load::load`).
            unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p as *const i16)) }
        }
    }

    /// Hints the cache lines of `data` into L2.
    #[inline(always)]
    pub fn prefetch<E>(data: &[E]) {
        let bytes = std::mem::size_of_val(data);
        let p = data.as_ptr() as *const i8;
        for line in (0..bytes).step_by(64) {
            // SAFETY: a prefetch never faults, and the address is inside `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(line)) };
        }
    }

    /// Queries a call takes at most for a group of `group` heads: rows of up to 8 (query, head)
    /// pairs, whose 16 score accumulators leave room in the 32 registers.
    pub fn tile_queries(group: usize) -> usize {
        (MAX_GROUP / group.max(1)).max(1)
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
            // The values pass keeps G x S accumulators (at most 24 of the 32 registers).
            match rows {
                1 => chunk::<E, 1, 4>(c, s),
                2 => chunk::<E, 2, 4>(c, s),
                3 => chunk::<E, 3, 4>(c, s),
                4 => chunk::<E, 4, 4>(c, s),
                5 => chunk::<E, 5, 4>(c, s),
                6 => chunk::<E, 6, 4>(c, s),
                7 => chunk::<E, 7, 2>(c, s),
                8 => chunk::<E, 8, 2>(c, s),
                _ => unreachable!("groups above {MAX_GROUP} are refused by fast(), and tiles have at most {MAX_GROUP} rows"),
            }
        }
    }

    // Several register arrays are indexed by the same head `g` and key `t`; index loops say
    // that more plainly than zipped iterators.
    /// # Safety
    /// The CPU has AVX-512F, BW, VL, F16C and FMA; `c.q` holds `c.queries` (G rows in all with
    /// the group's heads) query groups `c.q_stride` apart, of `c.group` heads of `c.head_dim` (a
    /// multiple of 16) values; `c.k` `c.head_dim` rows of `c.k_stride` keys of which the first
    /// `c.n_keys <= 16` are read, `c.v` `c.n_keys` rows of `c.head_dim` values, and `s` G rows.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
    unsafe fn chunk<E: KvElem, const G: usize, const S: usize>(c: &Chunk<'_, E>, s: RowState<'_>) {
        // SAFETY: the CPU features and the sizes of `c` and `s` are the caller's promise; every load and
        // store below is inside them.
        unsafe {
            debug_assert_eq!(c.queries * c.group, G, "a call's rows");
            let d = c.head_dim;
            let rows = c.row_starts::<G>();
            // The lanes `first_key..n_keys`: a sliding window's start and the causal end.
            let upto = |n: usize| {
                if n >= LANES {
                    u16::MAX
                } else {
                    (1u16 << n) - 1
                }
            };
            let mask: u16 = upto(c.n_keys) & !upto(c.first_key);
            let kp = c.k.as_ptr();

            // Scores: one FMA chain per row along the dimensions in order, the AVX2 kernel's
            // arithmetic lane for lane (a chain per row is what its registers allow), so the
            // two kernels agree bit for bit; one load of each key row serves every row.
            let mut scores = [_mm512_setzero_ps(); G];
            for dim in 0..d {
                let k = E::load(kp.add(dim * c.k_stride), mask);
                for g in 0..G {
                    scores[g] = _mm512_fmadd_ps(_mm512_set1_ps(*rows[g].add(dim)), k, scores[g]);
                }
            }

            let mut probs = [[0f32; LANES]; G];
            for g in 0..G {
                let scores = _mm512_mul_ps(scores[g], _mm512_set1_ps(c.scale));
                let scores = _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), mask, scores);
                let new_max = s.maxes[g].max(_mm512_reduce_max_ps(scores));
                if new_max > s.maxes[g] {
                    let correction = exp_scalar(s.maxes[g] - new_max);
                    s.sums[g] *= correction;
                    let acc = s.accs.as_mut_ptr().add(g * d);
                    let cv = _mm512_set1_ps(correction);
                    for j in (0..d).step_by(LANES) {
                        _mm512_storeu_ps(
                            acc.add(j),
                            _mm512_mul_ps(_mm512_loadu_ps(acc.add(j)), cv),
                        );
                    }
                    s.maxes[g] = new_max;
                }
                let p =
                    _mm512_maskz_mov_ps(mask, exp(_mm512_sub_ps(scores, _mm512_set1_ps(new_max))));
                // The AVX2 kernel's order: keys `t` and `t + 8` first, then its `hsum8`.
                s.sums[g] += hsum8(_mm256_add_ps(
                    _mm512_castps512_ps256(p),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(p))),
                ));
                _mm512_storeu_ps(probs[g].as_mut_ptr(), p);
            }

            // Values: one load of each value row's 16 dimensions serves every head of the group,
            // S such slices a pass (G x S FMA chains: G alone would leave FMAs waiting on their
            // latency with SmolLM2's 3 heads); the rest of the dimensions one slice a pass.
            let vp = c.v.as_ptr();
            let slices = d / LANES;
            let mut j = 0;
            while j + S <= slices {
                values_pass::<E, G, S>(
                    vp,
                    j * LANES,
                    d,
                    c.first_key..c.n_keys,
                    &probs,
                    s.accs.as_mut_ptr(),
                );
                j += S;
            }
            while j < slices {
                values_pass::<E, G, 1>(
                    vp,
                    j * LANES,
                    d,
                    c.first_key..c.n_keys,
                    &probs,
                    s.accs.as_mut_ptr(),
                );
                j += 1;
            }
        }
    }

    /// Adds `probs[g][t]` times value row `t`'s dimensions `dim..dim + 16 * S` into head `g`'s
    /// accumulator, for every head of the group and key of the chunk (in key order).
    ///
    /// # Safety
    /// The CPU has AVX-512F, BW and F16C; `v` holds `keys.end` rows of `d` values, `accs` G rows
    /// of `d` floats, and `dim + 16 * S <= d`.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn values_pass<E: KvElem, const G: usize, const S: usize>(
        v: *const E,
        dim: usize,
        d: usize,
        keys: std::ops::Range<usize>,
        probs: &[[f32; LANES]; G],
        accs: *mut f32,
    ) {
        // SAFETY: the caller's promise: every load and store is inside `v`'s rows and `accs`.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); S]; G];
            for g in 0..G {
                for i in 0..S {
                    acc[g][i] = _mm512_loadu_ps(accs.add(g * d + dim + i * LANES));
                }
            }
            for t in keys {
                let mut rows = [_mm512_setzero_ps(); S];
                for i in 0..S {
                    rows[i] = E::load(v.add(t * d + dim + i * LANES), u16::MAX);
                }
                for g in 0..G {
                    let p = _mm512_set1_ps(probs[g][t]);
                    for i in 0..S {
                        acc[g][i] = _mm512_fmadd_ps(p, rows[i], acc[g][i]);
                    }
                }
            }
            for g in 0..G {
                for i in 0..S {
                    _mm512_storeu_ps(accs.add(g * d + dim + i * LANES), acc[g][i]);
                }
            }
        }
    }
}
