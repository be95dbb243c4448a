//! f32 matrix products against weights packed once at load, for the forward's linear layers.
//!
//! A general gemm packs its operands on every call; with a decode batch of 64 rows against a
//! 576x3072 weight, repacking the weight cost about as much as multiplying (measured: gemm's
//! `pack_lhs` at 24% of a step). Here weights are packed at load into panels of 16 output
//! features stored k-major (`[panel][k][16]`), and an AVX-512 microkernel keeps a 6-row x
//! 64-column tile of outputs in 24 registers while it streams the panels: per k, 4 panel loads
//! and 6 broadcasts feed 24 FMAs. Work is split over column groups, so each thread streams its
//! own share of the weights once per 6 rows of activations, from L2.

use rayon::prelude::*;

/// Output features per panel: one AVX-512 register of f32.
const PANEL: usize = 16;
/// Rows of activations per register tile.
const MR: usize = 6;

pub struct PackedMatrix {
    /// Output features.
    n: usize,
    /// Input features.
    k: usize,
    /// `[ceil(n / 16)][k][16]`, zero-padded past `n`.
    panels: Vec<f32>,
}

/// Whether this CPU runs the packed kernel.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| is_x86_feature_detected!("avx512f"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The output buffer, written by many threads at disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl PackedMatrix {
    /// Packs `w: [n, k]` (row-major, rows are output features).
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "weight size");
        let num_panels = n.div_ceil(PANEL);
        let mut panels = vec![0f32; num_panels * k * PANEL];
        panels
            .par_chunks_mut(k * PANEL)
            .enumerate()
            .for_each(|(p, panel)| {
                for col in 0..PANEL.min(n - p * PANEL) {
                    let row = &w[(p * PANEL + col) * k..][..k];
                    for (kk, &v) in row.iter().enumerate() {
                        panel[kk * PANEL + col] = v;
                    }
                }
            });
        Self { n, k, panels }
    }

    pub fn out_features(&self) -> usize {
        self.n
    }

    pub fn in_features(&self) -> usize {
        self.k
    }

    /// `out[m, n] = x[m, k] . W^T`. Panics if the sizes disagree or the CPU lacks AVX-512
    /// (check [`available`] first).
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        assert!(available(), "the packed kernel needs AVX-512");
        assert_eq!(x.len(), m * self.k, "activation size");
        assert_eq!(out.len(), m * self.n, "output size");
        let num_panels = self.n.div_ceil(PANEL);
        // Four panels (64 columns) per task unless that leaves too few tasks to share.
        let threads = rayon::current_num_threads();
        let group = if num_panels >= 4 * 4 * threads {
            4
        } else if num_panels >= 2 * 4 * threads {
            2
        } else {
            1
        };
        let out_ptr = OutPtr(out.as_mut_ptr());
        (0..num_panels.div_ceil(group))
            .into_par_iter()
            .for_each(|g| {
                let first = g * group;
                let count = group.min(num_panels - first);
                // SAFETY: AVX-512 checked above; each task writes only columns of its own panels,
                // and all pointers stay within `x`, `self.panels` and `out` by the size checks.
                unsafe { self.columns(x, m, first, count, out_ptr) };
            });
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn columns(&self, x: &[f32], m: usize, first: usize, count: usize, out: OutPtr) {
        let w = self.panels.as_ptr().add(first * self.k * PANEL);
        let col = first * PANEL;
        let valid = (self.n - col).min(count * PANEL);
        let mut row = 0;
        while row < m {
            let rows = MR.min(m - row);
            let xp = x.as_ptr().add(row * self.k);
            let op = out.0.add(row * self.n + col);
            macro_rules! dispatch {
                ($($mr:literal)*) => {
                    match (rows, count) {
                        $(($mr, 4) => x86::tile::<$mr, 4>(xp, self.k, w, self.k * PANEL, op, self.n, valid),
                          ($mr, 2) => x86::tile::<$mr, 2>(xp, self.k, w, self.k * PANEL, op, self.n, valid),
                          ($mr, 1) => x86::tile::<$mr, 1>(xp, self.k, w, self.k * PANEL, op, self.n, valid),)*
                        (_, c) => {
                            // A group cut short at the matrix edge (3 panels): one at a time.
                            for p in 0..c {
                                let v = valid.saturating_sub(p * PANEL).min(PANEL);
                                let wp = w.add(p * self.k * PANEL);
                                let opp = op.add(p * PANEL);
                                match rows {
                                    $($mr => x86::tile::<$mr, 1>(xp, self.k, wp, self.k * PANEL, opp, self.n, v),)*
                                    _ => unreachable!("rows is 1..=MR"),
                                }
                            }
                        }
                    }
                };
            }
            dispatch!(1 2 3 4 5 6);
            row += rows;
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn columns(&self, _: &[f32], _: usize, _: usize, _: usize, _: OutPtr) {
        unreachable!("available() is false off x86_64")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::PANEL;

    /// Computes a `MR x (NR * 16)` tile: `out[r][c] = sum_k x[r][k] * panel[c / 16][k][c % 16]`.
    /// `valid` columns of the tile are stored (the rest is the zero padding of the last panel).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const MR: usize, const NR: usize>(
        x: *const f32,
        k: usize,
        w: *const f32,
        panel_stride: usize,
        out: *mut f32,
        ldo: usize,
        valid: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        for kk in 0..k {
            let mut wv = [_mm512_setzero_ps(); NR];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(w.add(j * panel_stride + kk * PANEL));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let xb = _mm512_set1_ps(*x.add(r * k + kk));
                for (j, a) in row.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(xb, wv[j], *a);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (j, a) in row.iter().enumerate() {
                let cols = valid.saturating_sub(j * PANEL).min(PANEL);
                let dst = out.add(r * ldo + j * PANEL);
                if cols == PANEL {
                    _mm512_storeu_ps(dst, *a);
                } else if cols > 0 {
                    _mm512_mask_storeu_ps(dst, ((1u32 << cols) - 1) as u16, *a);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn packed_product_equals_naive() {
        if !available() {
            eprintln!("skipped: no AVX-512 on this CPU, the packed kernel is never used here");
            return;
        }
        for &(m, n, k) in &[
            (1, 16, 8),
            (7, 40, 33),
            (13, 200, 64),
            (64, 960, 576),
            (3, 1, 5),
            (6, 48, 17),
            (19, 80, 129),
        ] {
            let w = random(n * k, 1);
            let x = random(m * k, 2);
            let packed = PackedMatrix::pack(&w, n, k);
            let mut out = vec![f32::NAN; m * n];
            packed.matmul(&x, m, &mut out);
            for r in 0..m {
                for c in 0..n {
                    let want: f32 = (0..k).map(|i| x[r * k + i] * w[c * k + i]).sum();
                    let got = out[r * n + c];
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "m{m} n{n} k{k} [{r},{c}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}
