//! Kernels over one row of logits (a whole vocabulary, ~49k floats for SmolLM2): max, argmax,
//! sums of exponentials, the k largest entries. The sampler runs several of them per sequence
//! per step, so they are written in fixed-width lanes that the compiler turns into SIMD, and
//! `exp` is a polynomial instead of a libm call (which does not vectorize).
//!
//! Every result depends only on the row, never on how rows were batched, which is what lets a
//! seeded request reproduce its tokens in any batch.

/// Elements per lane group: one AVX-512 register of f32.
const LANES: usize = 16;

/// `e^x`, with relative error below 3e-7 for `x` in `[-87, 88]`; 0 below -87 (and for -inf),
/// which is below the smallest normal f32 anyway. Cody-Waite range reduction to
/// `2^n * e^r` with `|r| <= ln2 / 2`, then a degree-6 Taylor polynomial for `e^r`.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to an integer, which then sits in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let xc = x.clamp(-87.0, 88.0);
    let v = xc * std::f32::consts::LOG2_E + MAGIC;
    let n = v - MAGIC;
    let ni = (v.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((ni + 127) as u32) << 23);
    // NaN fails the comparison and lands here too: a NaN logit gets no probability.
    if x >= -87.0 {
        p * scale
    } else {
        0.0
    }
}

/// The largest element (-inf for an empty row; NaNs are ignored).
pub fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for v in acc.into_iter().chain(rem.iter().copied()) {
        if v > m {
            m = v;
        }
    }
    m
}

/// Index of the largest element, the first one on ties; 0 for a row without any number.
/// One pass: each lane keeps its best value and where it was (a row is read from memory once,
/// which is what greedy decoding over a large vocabulary costs).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut at = [u32::MAX; LANES];
    let chunks = x.chunks_exact(LANES);
    let rem = chunks.remainder();
    for (ci, c) in chunks.enumerate() {
        let base = (ci * LANES) as u32;
        for i in 0..LANES {
            let better = c[i] > best[i];
            best[i] = if better { c[i] } else { best[i] };
            at[i] = if better { base + i as u32 } else { at[i] };
        }
    }
    let tail = x.len() - rem.len();
    let mut m = f32::NEG_INFINITY;
    let mut arg = u32::MAX;
    let candidates = best
        .into_iter()
        .zip(at)
        .chain(rem.iter().enumerate().map(|(j, &v)| (v, (tail + j) as u32)));
    for (v, i) in candidates {
        if v > m || (v == m && i < arg) {
            m = v;
            arg = i;
        }
    }
    if arg == u32::MAX {
        0
    } else {
        arg as usize
    }
}

/// The standard deviation of the row's finite logits (banned and masked tokens, at -inf, are
/// not part of the distribution), in f64 and in index order: top-nσ's spread. 0 for fewer
/// than two finite logits.
pub fn std_dev(x: &[f32]) -> f32 {
    let (mut n, mut sum, mut sum_sq) = (0usize, 0.0f64, 0.0f64);
    for &v in x.iter().filter(|v| v.is_finite()) {
        let v = f64::from(v);
        n += 1;
        sum += v;
        sum_sq += v * v;
    }
    if n < 2 {
        return 0.0;
    }
    let mean = sum / n as f64;
    ((sum_sq / n as f64 - mean * mean).max(0.0)).sqrt() as f32
}

/// `sum of e^((x_i - shift) * scale)` over the elements with `x_i >= lo`.
pub fn sum_exp(x: &[f32], shift: f32, scale: f32, lo: f32) -> f64 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            let e = fast_exp((c[i] - shift) * scale);
            acc[i] += if c[i] >= lo { e } else { 0.0 };
        }
    }
    let mut total: f64 = acc.iter().map(|&a| f64::from(a)).sum();
    for &v in rem {
        if v >= lo {
            total += f64::from(fast_exp((v - shift) * scale));
        }
    }
    total
}

/// Elements per block of the cumulative searches: summed in lanes, then walked one by one
/// only in the block where the running sum crosses its target.
const BLOCK: usize = 256;

/// `e^((x_i - shift) * scale)` for the elements with `x_i >= lo`, 0 for the others, into
/// `out` (resized to `x`); returns their sum.
pub fn exp_weights(x: &[f32], shift: f32, scale: f32, lo: f32, out: &mut Vec<f32>) -> f64 {
    out.clear();
    out.resize(x.len(), 0.0);
    let mut acc = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES).zip(out.chunks_exact_mut(LANES));
    for (c, o) in &mut chunks {
        for i in 0..LANES {
            let e = fast_exp((c[i] - shift) * scale);
            o[i] = if c[i] >= lo { e } else { 0.0 };
            acc[i] += o[i];
        }
    }
    let mut total: f64 = acc.iter().map(|&a| f64::from(a)).sum();
    let tail = x.len() - x.len() % LANES;
    for (v, o) in x[tail..].iter().zip(&mut out[tail..]) {
        *o = if *v >= lo {
            fast_exp((v - shift) * scale)
        } else {
            0.0
        };
        total += f64::from(*o);
    }
    total
}

/// The first index at which the running sum of `weights` reaches `target`, skipping zero
/// weights; `None` when rounding leaves the whole sum just below it.
pub fn find_cumulative(weights: &[f32], target: f64) -> Option<usize> {
    let mut acc = 0f64;
    for (bi, block) in weights.chunks(BLOCK).enumerate() {
        let mut lanes = [0f32; LANES];
        let mut chunks = block.chunks_exact(LANES);
        for c in &mut chunks {
            for i in 0..LANES {
                lanes[i] += c[i];
            }
        }
        let block_sum: f64 = lanes
            .iter()
            .chain(chunks.remainder())
            .map(|&w| f64::from(w))
            .sum();
        if acc + block_sum < target {
            acc += block_sum;
            continue;
        }
        for (j, &w) in block.iter().enumerate() {
            acc += f64::from(w);
            if acc >= target && w > 0.0 {
                return Some(bi * BLOCK + j);
            }
        }
    }
    None
}

/// Whether any element of `c` is above `threshold` (a vectorizable test, no early exit).
#[inline]
fn any_above(c: &[f32], threshold: f32) -> bool {
    c.iter().fold(false, |any, &v| any | (v > threshold))
}

/// The `n` largest elements as `(index, value)`, largest first; among equal values the lower
/// index wins. Skips whole blocks that cannot beat the current n-th best.
pub fn top_n(x: &[f32], n: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    if n == 0 {
        return;
    }
    const SKIP: usize = 64;
    let mut threshold = f32::NEG_INFINITY;
    for (ci, c) in x.chunks(SKIP).enumerate() {
        if out.len() == n && !any_above(c, threshold) {
            continue;
        }
        for (j, &v) in c.iter().enumerate() {
            if out.len() == n && v <= threshold {
                continue;
            }
            if v.is_nan() {
                continue;
            }
            // Strictly-greater keeps the earlier index first among equals.
            let pos = out.partition_point(|&(_, w)| w >= v);
            if out.len() == n {
                out.pop();
            }
            out.insert(pos, ((ci * SKIP + j) as u32, v));
            if out.len() == n {
                threshold = out[n - 1].1;
            }
        }
    }
}

/// The `k`-th largest value (1-based) of `x`; `k` must be in `1..=x.len()`. Small `k` keeps a
/// sorted shortlist; large `k` selects on a copy in `scratch`.
pub fn kth_largest(
    x: &[f32],
    k: usize,
    shortlist: &mut Vec<(u32, f32)>,
    scratch: &mut Vec<f32>,
) -> f32 {
    debug_assert!(k >= 1 && k <= x.len());
    if k <= 256 {
        top_n(x, k, shortlist);
        return shortlist.last().map_or(f32::NEG_INFINITY, |&(_, v)| v);
    }
    scratch.clear();
    scratch.extend_from_slice(x);
    let (_, kth, _) = scratch.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    *kth
}

/// Sets every logit whose bit is clear in `allowed` to -inf (token `t` is bit `t % 32` of word
/// `t / 32`; tokens past the words are out). A grammar's mask is mostly whole words of zeros
/// or ones, which cost one comparison each.
pub fn keep_allowed(x: &mut [f32], allowed: &[u32]) {
    for (w, chunk) in x.chunks_mut(32).enumerate() {
        let bits = allowed.get(w).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        if bits == 0 {
            chunk.fill(f32::NEG_INFINITY);
            continue;
        }
        for (b, v) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 {
                *v = f32::NEG_INFINITY;
            }
        }
    }
}

/// The lowest token whose bit is set in `allowed`, below `vocab_size`.
pub fn first_allowed(allowed: &[u32], vocab_size: usize) -> Option<u32> {
    allowed
        .iter()
        .enumerate()
        .find(|(_, &bits)| bits != 0)
        .map(|(w, &bits)| (w * 32) as u32 + bits.trailing_zeros())
        .filter(|&t| (t as usize) < vocab_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seed: u64, len: usize) -> Vec<f32> {
        crate::testing::xorshift(seed)
            .take(len)
            .map(|s| ((s >> 40) as f32 / (1u64 << 24) as f32) * 20.0 - 10.0)
            .collect()
    }

    #[test]
    fn fast_exp_matches_libm() {
        let mut x = -90.0f32;
        while x < 88.0 {
            let want = x.exp();
            let got = fast_exp(x);
            if x < -87.0 {
                assert_eq!(got, 0.0);
            } else {
                assert!(
                    ((got - want) / want).abs() < 3e-7,
                    "exp({x}) = {got}, want {want}"
                );
            }
            x += 0.0137;
        }
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(f32::NAN), 0.0);
        assert_eq!(fast_exp(0.0), 1.0);
    }

    #[test]
    fn reductions_agree_with_plain_loops() {
        for len in [1, 15, 16, 17, 1000, 49_152] {
            let x = row(len as u64, len);
            let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max(&x), m);
            assert_eq!(x[argmax(&x)], m);
            let want: f64 = x
                .iter()
                .filter(|&&v| v >= 0.0)
                .map(|&v| f64::from(((v - m) * 0.5).exp()))
                .sum();
            let got = sum_exp(&x, m, 0.5, 0.0);
            assert!((got - want).abs() / want < 1e-5, "{got} vs {want}");
        }
    }

    #[test]
    fn argmax_takes_the_first_of_equal_maxima() {
        assert_eq!(argmax(&[1.0, 3.0, 2.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NAN, -1.0]), 1);
    }

    #[test]
    fn cumulative_search_finds_the_crossing_element() {
        let x: Vec<f32> = (0..1000).map(|i| (i % 7) as f32).collect();
        let mut w = Vec::new();
        let total = exp_weights(&x, 6.0, 1.0, f32::NEG_INFINITY, &mut w);
        assert!((total - sum_exp(&x, 6.0, 1.0, f32::NEG_INFINITY)).abs() < 1e-9 * total);
        let mut prev = 0;
        for step in 1..50 {
            let target = total * step as f64 / 50.0;
            let i = find_cumulative(&w, target).unwrap();
            let before: f64 = x[..i].iter().map(|&v| f64::from((v - 6.0).exp())).sum();
            let through = before + f64::from((x[i] - 6.0).exp());
            assert!(before < target * (1.0 + 1e-6) && through >= target * (1.0 - 1e-6));
            assert!(i >= prev);
            prev = i;
        }
        // Elements below `lo` weigh nothing and are never chosen.
        let total = exp_weights(&x, 6.0, 1.0, 5.5, &mut w);
        let i = find_cumulative(&w, 1e-9).unwrap();
        assert_eq!(x[i], 6.0);
        assert_eq!(find_cumulative(&w, total * 2.0), None);
    }

    #[test]
    fn top_n_and_kth_largest_match_a_full_sort() {
        let x = row(3, 5000);
        let mut sorted: Vec<(u32, f32)> =
            x.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let (mut shortlist, mut scratch) = (Vec::new(), Vec::new());
        for n in [1, 5, 20, 300] {
            top_n(&x, n, &mut shortlist);
            assert_eq!(shortlist, sorted[..n]);
        }
        for k in [1, 7, 256, 257, 4999, 5000] {
            assert_eq!(
                kth_largest(&x, k, &mut shortlist, &mut scratch),
                sorted[k - 1].1
            );
        }
        let ties = [2.0, 5.0, 5.0, 1.0, 5.0];
        top_n(&ties, 2, &mut shortlist);
        assert_eq!(shortlist, vec![(1, 5.0), (2, 5.0)]);
    }

    #[test]
    fn keep_allowed_masks_exactly_the_clear_bits() {
        let mut x: Vec<f32> = (0..70).map(|i| i as f32).collect();
        // Word 0: tokens 1 and 31; word 1: all; word 2 missing (tokens 64..70 out).
        let allowed = [0x8000_0002u32, u32::MAX];
        keep_allowed(&mut x, &allowed);
        for (t, &v) in x.iter().enumerate() {
            let kept = t == 1 || t == 31 || (32..64).contains(&t);
            assert_eq!(v.is_finite(), kept, "token {t}");
        }
        assert_eq!(first_allowed(&allowed, 70), Some(1));
        assert_eq!(first_allowed(&[0, 0, 4], 70), Some(66));
        assert_eq!(first_allowed(&[0, 0, 4], 65), None);
        assert_eq!(first_allowed(&[], 65), None);
    }
}
