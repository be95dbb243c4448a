//! The encoder's self-attention: bidirectional, each image's patches attending to every patch
//! of the same image and to no other image's. Each (image, head) pair is its own task; its
//! two products run on the packed f32 GEMM (`sluice_kernels::cpu::gemm`), whose result for a
//! row never depends on the other rows or on the kernel tier, so an image's values are the
//! same bits alone or in any batch.

use rayon::prelude::*;
use sluice_kernels::PackedMatrix;

/// The shape of one call: `images` images of `patches` patches, `heads` heads of `head_dim`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttentionShape {
    pub images: usize,
    pub patches: usize,
    pub heads: usize,
    pub head_dim: usize,
}

impl AttentionShape {
    fn width(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// `out[image, patch, head]` = softmax over the image's patches of `q . k / sqrt(head_dim)`,
/// times `v`. `qkv`: rows of `[q | k | v]` (each `heads * head_dim`, head by head), one row a
/// patch, images one after the other; `out`: rows of `heads * head_dim`.
pub(crate) fn bidirectional(qkv: &[f32], shape: AttentionShape, out: &mut [f32]) {
    let AttentionShape {
        images,
        patches,
        heads,
        head_dim,
    } = shape;
    let width = shape.width();
    assert_eq!(qkv.len(), images * patches * 3 * width, "qkv rows");
    assert_eq!(out.len(), images * patches * width, "output rows");
    let scale = 1.0 / (head_dim as f32).sqrt();
    let results: Vec<Vec<f32>> = (0..images * heads)
        .into_par_iter()
        .map(|task| {
            let (image, head) = (task / heads, task % heads);
            let rows = &qkv[image * patches * 3 * width..][..patches * 3 * width];
            one_head(rows, shape, head, scale)
        })
        .collect();
    for (task, values) in results.iter().enumerate() {
        let (image, head) = (task / heads, task % heads);
        for (p, v) in values.chunks_exact(head_dim).enumerate() {
            out[(image * patches + p) * width + head * head_dim..][..head_dim].copy_from_slice(v);
        }
    }
}

/// One head of one image: `[patches, head_dim]`.
fn one_head(rows: &[f32], shape: AttentionShape, head: usize, scale: f32) -> Vec<f32> {
    let (n, d, width) = (shape.patches, shape.head_dim, shape.width());
    let part = |which: usize, p: usize| &rows[p * 3 * width + which * width + head * d..][..d];
    let q: Vec<f32> = (0..n).flat_map(|p| part(0, p).iter().copied()).collect();
    let k: Vec<f32> = (0..n).flat_map(|p| part(1, p).iter().copied()).collect();
    // V transposed: the second product's weights are its `head_dim` output features.
    let mut vt = vec![0f32; d * n];
    for p in 0..n {
        for (c, &v) in part(2, p).iter().enumerate() {
            vt[c * n + p] = v;
        }
    }
    let (k, vt) = (PackedMatrix::pack(&k, n, d), PackedMatrix::pack(&vt, d, n));
    let mut out = vec![0f32; n * d];
    // Queries a block at a time: a block's scores are `QUERY_BLOCK x patches`, not the whole
    // `patches x patches` (64 MiB a head for Gemma 3's 4096 patches, held by every task at
    // once). Each query row is computed alone whatever its block, so the blocking changes no
    // bit.
    let mut scores = vec![0f32; QUERY_BLOCK.min(n) * n];
    for (q, out) in q
        .chunks(QUERY_BLOCK * d)
        .zip(out.chunks_mut(QUERY_BLOCK * d))
    {
        let rows = q.len() / d;
        let scores = &mut scores[..rows * n];
        k.matmul(q, rows, scores);
        // In vectors, one arithmetic on every tier (a scalar `expf` a score was half of the
        // tower's time): the scaled scores' maximum subtracted, the exponentials summed in 16
        // lanes, each times the sum's reciprocal, as ggml's `soft_max` does but for its f64 sum.
        sluice_kernels::cpu::softmax::softmax_rows(scores, n, scale);
        vt.matmul(scores, rows, out);
    }
    out
}

/// Query rows whose scores one task holds at a time.
const QUERY_BLOCK: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the formula in f64 on a small shape (and, on a CPU without the packed kernel,
    /// nothing to test: the tower refuses to open there).
    #[test]
    fn matches_the_formula() {
        if !sluice_kernels::cpu::gemm::available() {
            eprintln!("skipped: no packed kernel on this CPU");
            return;
        }
        // The second shape has more patches than a query block, and a last block shorter
        // than the others.
        for (images, patches, heads, head_dim) in [(2, 7, 3, 5), (1, QUERY_BLOCK + 44, 2, 8)] {
            check_formula(AttentionShape {
                images,
                patches,
                heads,
                head_dim,
            });
        }
    }

    fn check_formula(shape: AttentionShape) {
        let width = shape.width();
        let qkv: Vec<f32> = (0..shape.images * shape.patches * 3 * width)
            .map(|i| ((i * 7919) % 1001) as f32 / 500.0 - 1.0)
            .collect();
        let mut out = vec![0f32; shape.images * shape.patches * width];
        bidirectional(&qkv, shape, &mut out);
        let at = |img: usize, p: usize, which: usize, h: usize, c: usize| {
            f64::from(
                qkv[(img * shape.patches + p) * 3 * width + which * width + h * shape.head_dim + c],
            )
        };
        for img in 0..shape.images {
            for h in 0..shape.heads {
                for i in 0..shape.patches {
                    let s: Vec<f64> = (0..shape.patches)
                        .map(|j| {
                            (0..shape.head_dim)
                                .map(|c| at(img, i, 0, h, c) * at(img, j, 1, h, c))
                                .sum::<f64>()
                                / (shape.head_dim as f64).sqrt()
                        })
                        .collect();
                    let max = s.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
                    let total: f64 = e.iter().sum();
                    for c in 0..shape.head_dim {
                        let want: f64 = (0..shape.patches)
                            .map(|j| e[j] / total * at(img, j, 2, h, c))
                            .sum();
                        let got = out[(img * shape.patches + i) * width + h * shape.head_dim + c];
                        assert!(
                            (f64::from(got) - want).abs() < 1e-5,
                            "{img} {h} {i} {c}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
