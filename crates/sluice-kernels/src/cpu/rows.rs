//! Row-wise element-wise ops of a layer on plain slices: RMSNorm (alone, and fused with the
//! residual add before it) and RoPE fused with splitting the QKV projection into Q, K and V.
//! Each replaces several candle ops (each its own pass, allocation and parallel region) with
//! one pass; a step with many rows splits its rows over rayon's pool, a small one (a decode
//! step of a few sequences) stays on the calling thread, where a fork would cost more than
//! the work.
//!
//! Each row is computed on its own with the same operations in the same order whatever the
//! step holds, so a sequence gets the same values alone or in any batch.

use rayon::prelude::*;

/// Rows from which the ops split their rows over the pool.
const PARALLEL_ROWS: usize = 32;

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 16;

/// `out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight` for each row of `width` values.
/// Panics if the slices disagree with `width`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let width = weight.len();
    assert!(width > 0 && x.len() == out.len() && x.len().is_multiple_of(width));
    for_rows(out, width, x.len() / width, |r, dst| {
        norm_row(&x[r * width..][..width], weight, eps, dst)
    });
}

/// The residual add and the next norm in one pass: `x[r] += delta[r]`, then `out[r]` is the
/// [`rms_norm`] of the new `x[r]`. Panics if the slices disagree with `weight.len()`.
pub fn add_rms_norm(x: &mut [f32], delta: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let width = weight.len();
    assert!(
        width > 0
            && x.len() == out.len()
            && x.len() == delta.len()
            && x.len().is_multiple_of(width)
    );
    let rows = x.len() / width;
    let work = |(xr, (dr, or)): (&mut [f32], (&[f32], &mut [f32]))| {
        for (a, b) in xr.iter_mut().zip(dr) {
            *a += b;
        }
        norm_row(xr, weight, eps, or);
    };
    if rows < PARALLEL_ROWS {
        x.chunks_mut(width)
            .zip(delta.chunks(width).zip(out.chunks_mut(width)))
            .for_each(work);
    } else {
        x.par_chunks_mut(width)
            .zip(delta.par_chunks(width).zip(out.par_chunks_mut(width)))
            .with_min_len(ROWS_PER_TASK)
            .for_each(work);
    }
}

/// `x[r] += delta[r]` for each row: the residual add after the last layer.
pub fn add(x: &mut [f32], delta: &[f32]) {
    assert_eq!(x.len(), delta.len());
    for (a, b) in x.iter_mut().zip(delta) {
        *a += b;
    }
}

/// candle's RMSNorm arithmetic (`candle_nn::ops::rms_norm`): the mean of squares summed in
/// order, then `x / sqrt(mean + eps) * weight`.
#[inline]
fn norm_row(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let sum2: f32 = x.iter().map(|v| v * v).sum();
    let m = (sum2 / x.len() as f32 + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = v / m * w;
    }
}

/// Calls `f(row, out_row)` for each of `rows` rows of `width` values of `out`, in parallel
/// when there are many.
fn for_rows(out: &mut [f32], width: usize, rows: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if rows < PARALLEL_ROWS {
        out.chunks_mut(width).enumerate().for_each(|(r, o)| f(r, o));
    } else {
        out.par_chunks_mut(width)
            .enumerate()
            .with_min_len(ROWS_PER_TASK)
            .for_each(|(r, o)| f(r, o));
    }
}

/// The shape of a QKV projection's rows: `[heads | kv_heads | kv_heads] x head_dim` values.
#[derive(Debug, Clone, Copy)]
pub struct QkvShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The dimensions of a head that RoPE rotates, from the first (all of them but for a
    /// partial rotary: Qwen3.5's quarter); the rest pass through.
    pub rotary_dim: usize,
}

/// Per-head RMSNorm of Q and K before RoPE (qwen3): the weights `[head_dim]` of each and eps.
#[derive(Debug, Clone, Copy)]
pub struct QkNorm<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub eps: f32,
}

/// Splits each token's QKV row into `q: [T, heads, head_dim]`, `k` and `v: [T, kv_heads,
/// head_dim]`, normalising each head of Q and K first if `qk_norm` says so, and rotating Q and
/// K by the token's position with the half-split convention (candle's `rope_thd`: the first
/// half `x1`, the second `x2`, `x1 cos - x2 sin` and `x1 sin + x2 cos`) over the head's first
/// `rotary_dim` dimensions (the rest pass through). `rope` holds the tables `(cos, sin)`, each
/// `[positions, rotary_dim / 2]`; `None` leaves Q and K unrotated (a
/// layer without positional encoding, SmolLM3's "NoPE" layers). Panics if a slice disagrees
/// with the shape or a position is past the tables.
#[allow(clippy::too_many_arguments)]
pub fn split_rope(
    qkv: &[f32],
    positions: &[u32],
    rope: Option<(&[f32], &[f32])>,
    shape: QkvShape,
    qk_norm: Option<QkNorm<'_>>,
    q: &mut [f32],
    k: &mut [f32],
    v: &mut [f32],
) {
    let QkvShape {
        heads,
        kv_heads,
        head_dim: d,
        rotary_dim,
    } = shape;
    let t = positions.len();
    let (qw, kw) = (heads * d, kv_heads * d);
    assert!(d > 0 && d.is_multiple_of(2), "head_dim must be even");
    assert!(
        rotary_dim > 0 && rotary_dim.is_multiple_of(2) && rotary_dim <= d,
        "the rotary's dimensions are even and at most head_dim"
    );
    assert_eq!(qkv.len(), t * (qw + 2 * kw), "qkv rows");
    assert!(q.len() == t * qw && k.len() == t * kw && v.len() == t * kw);
    let half = rotary_dim / 2;
    if let Some((cos, sin)) = rope {
        assert_eq!(cos.len(), sin.len());
        assert!(positions
            .iter()
            .all(|&p| (p as usize + 1) * half <= cos.len()));
    }
    if let Some(n) = &qk_norm {
        assert!(
            n.q.len() == d && n.k.len() == d,
            "qk-norm weights are [head_dim]"
        );
    }
    let token = |i: usize, q: &mut [f32], k: &mut [f32], v: &mut [f32]| {
        let row = &qkv[i * (qw + 2 * kw)..][..qw + 2 * kw];
        let p = positions[i] as usize;
        let tables = rope.map(|(cos, sin)| (&cos[p * half..][..half], &sin[p * half..][..half]));
        for (src, dst) in row[..qw].chunks_exact(d).zip(q.chunks_exact_mut(d)) {
            rotate(src, qk_norm.map(|n| (n.q, n.eps)), tables, dst);
        }
        for (src, dst) in row[qw..qw + kw].chunks_exact(d).zip(k.chunks_exact_mut(d)) {
            rotate(src, qk_norm.map(|n| (n.k, n.eps)), tables, dst);
        }
        v.copy_from_slice(&row[qw + kw..]);
    };
    if t < PARALLEL_ROWS {
        for (i, ((q, k), v)) in q
            .chunks_mut(qw)
            .zip(k.chunks_mut(kw))
            .zip(v.chunks_mut(kw))
            .enumerate()
        {
            token(i, q, k, v);
        }
    } else {
        q.par_chunks_mut(qw)
            .zip(k.par_chunks_mut(kw))
            .zip(v.par_chunks_mut(kw))
            .enumerate()
            .with_min_len(ROWS_PER_TASK)
            .for_each(|(i, ((q, k), v))| token(i, q, k, v));
    }
}

/// One head: optionally RMS-normalised, then rotated into `out`.
#[inline]
/// One head: normed if `norm` says so, then rotated by `tables` (`(cos, sin)` at its
/// position) where it has them.
fn rotate(
    x: &[f32],
    norm: Option<(&[f32], f32)>,
    tables: Option<(&[f32], &[f32])>,
    out: &mut [f32],
) {
    if let Some((w, eps)) = norm {
        norm_row(x, w, eps, out);
    } else {
        out.copy_from_slice(x);
    }
    let Some((cos, sin)) = tables else { return };
    let half = cos.len();
    let (x1, rest) = out.split_at_mut(half);
    let x2 = &mut rest[..half];
    for i in 0..half {
        let (a, b) = (x1[i], x2[i]);
        x1[i] = a * cos[i] - b * sin[i];
        x2[i] = a * sin[i] + b * cos[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 500.0 - 2.0)
            .collect()
    }

    #[test]
    fn rms_norm_follows_the_formula_in_every_row_whatever_the_row_count() {
        let width = 40;
        let weight = values(width, 7);
        for rows in [1usize, 3, 31, 32, 70] {
            let x = values(rows * width, 1);
            let mut out = vec![0f32; x.len()];
            rms_norm(&x, &weight, 1e-5, &mut out);
            for r in 0..rows {
                let row = &x[r * width..][..width];
                let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / width as f64;
                for i in 0..width {
                    let want = row[i] as f64 / (ms + 1e-5).sqrt() * weight[i] as f64;
                    let got = out[r * width + i] as f64;
                    assert!(
                        (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                        "{rows} rows: {got} vs {want}"
                    );
                }
                // A row's values do not depend on the other rows.
                let mut alone = vec![0f32; width];
                rms_norm(row, &weight, 1e-5, &mut alone);
                assert_eq!(alone, out[r * width..][..width]);
            }
        }
    }

    #[test]
    fn add_rms_norm_is_the_add_then_the_norm() {
        let width = 24;
        let weight = values(width, 3);
        for rows in [2usize, 40] {
            let mut x = values(rows * width, 5);
            let delta = values(rows * width, 9);
            let mut want_x = x.clone();
            add(&mut want_x, &delta);
            let mut want = vec![0f32; x.len()];
            rms_norm(&want_x, &weight, 1e-6, &mut want);
            let mut out = vec![0f32; x.len()];
            add_rms_norm(&mut x, &delta, &weight, 1e-6, &mut out);
            assert_eq!(x, want_x);
            assert_eq!(out, want);
        }
    }

    #[test]
    fn split_rope_rotates_q_and_k_and_copies_v() {
        let shape = QkvShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            rotary_dim: 8,
        };
        let half = 4;
        let angles: Vec<f32> = (0..10 * half).map(|i| i as f32 * 0.37).collect();
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        for t in [1usize, 5, 40] {
            let positions: Vec<u32> = (0..t).map(|i| (i * 7 % 10) as u32).collect();
            let width = (4 + 2 * 2) * 8;
            let qkv = values(t * width, 11);
            let (mut q, mut k, mut v) =
                (vec![0f32; t * 32], vec![0f32; t * 16], vec![0f32; t * 16]);
            split_rope(
                &qkv,
                &positions,
                Some((&cos, &sin)),
                shape,
                None,
                &mut q,
                &mut k,
                &mut v,
            );
            for i in 0..t {
                let p = positions[i] as usize;
                let row = &qkv[i * width..][..width];
                for (head, (src, dst)) in [
                    (0usize, (&row[..32], &q[i * 32..][..32])),
                    (1, (&row[32..48], &k[i * 16..][..16])),
                ] {
                    let _ = head;
                    for (x, y) in src.chunks(8).zip(dst.chunks(8)) {
                        for j in 0..half {
                            let (c, s) = (cos[p * half + j], sin[p * half + j]);
                            assert_eq!(y[j], x[j] * c - x[j + half] * s);
                            assert_eq!(y[j + half], x[j] * s + x[j + half] * c);
                        }
                    }
                }
                assert_eq!(&v[i * 16..][..16], &row[48..64]);
            }
        }
    }

    #[test]
    fn a_partial_rotary_turns_the_first_dimensions_and_passes_the_rest() {
        // Qwen3.5's: 4 of a head's 8 dimensions, NEOX pairs (i, i + 2) among them.
        let shape = QkvShape {
            heads: 1,
            kv_heads: 1,
            head_dim: 8,
            rotary_dim: 4,
        };
        let (cos, sin) = (vec![0.6f32, 0.8, 0.0, 1.0], vec![0.8f32, 0.6, 1.0, 0.0]);
        let qkv = values(24, 5);
        let (mut q, mut k, mut v) = (vec![0f32; 8], vec![0f32; 8], vec![0f32; 8]);
        split_rope(
            &qkv,
            &[1],
            Some((&cos, &sin)),
            shape,
            None,
            &mut q,
            &mut k,
            &mut v,
        );
        for (x, y) in [(&qkv[..8], &q), (&qkv[8..16], &k)] {
            let (c, s) = (&cos[2..], &sin[2..]);
            for j in 0..2 {
                assert_eq!(y[j], x[j] * c[j] - x[j + 2] * s[j]);
                assert_eq!(y[j + 2], x[j] * s[j] + x[j + 2] * c[j]);
            }
            assert_eq!(
                &y[4..],
                &x[4..],
                "the dimensions past the rotary pass through"
            );
        }
        assert_eq!(&v[..], &qkv[16..]);
    }

    #[test]
    fn qk_norm_normalises_each_head_before_rotating() {
        let shape = QkvShape {
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            rotary_dim: 4,
        };
        let (cos, sin) = (vec![1.0f32; 2], vec![0.0f32; 2]); // position 0: no rotation
        let qkv = values(16, 2);
        let (wq, wk) = (values(4, 4), values(4, 6));
        let (mut q, mut k, mut v) = (vec![0f32; 8], vec![0f32; 4], vec![0f32; 4]);
        let norm = QkNorm {
            q: &wq,
            k: &wk,
            eps: 1e-6,
        };
        split_rope(
            &qkv,
            &[0],
            Some((&cos, &sin)),
            shape,
            Some(norm),
            &mut q,
            &mut k,
            &mut v,
        );
        let mut want = vec![0f32; 4];
        for h in 0..2 {
            rms_norm(&qkv[h * 4..][..4], &wq, 1e-6, &mut want);
            assert_eq!(&q[h * 4..][..4], &want[..]);
        }
        rms_norm(&qkv[8..12], &wk, 1e-6, &mut want);
        assert_eq!(k, want);
        assert_eq!(v, &qkv[12..16]);
    }

    #[test]
    fn without_tables_q_and_k_are_split_unrotated() {
        let shape = QkvShape {
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            rotary_dim: 4,
        };
        let t = 3;
        let qkv = values(t * 16, 5);
        let (mut q, mut k, mut v) = (vec![0f32; t * 8], vec![0f32; t * 4], vec![0f32; t * 4]);
        // Positions past any table: none is read.
        split_rope(
            &qkv,
            &[7, 900, 3],
            None,
            shape,
            None,
            &mut q,
            &mut k,
            &mut v,
        );
        for i in 0..t {
            let row = &qkv[i * 16..][..16];
            assert_eq!(&q[i * 8..][..8], &row[..8]);
            assert_eq!(&k[i * 4..][..4], &row[8..12]);
            assert_eq!(&v[i * 4..][..4], &row[12..16]);
        }
    }
}
