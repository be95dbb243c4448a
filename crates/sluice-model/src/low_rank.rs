//! The low-rank products of a LoRA update ([`crate::lora`]): for the rows of a step that name
//! one adapter, `out[row, column..] += scale * B (A x[row])` after a fused projection's base
//! matmul. The adapter's rows are gathered and multiplied together: `A` (every part's `A`
//! stacked, as the parts share one input) in one product, then each part's `B` in one, both on
//! the CPU's packed f32 kernels ([`PackedMatrix`]) that run the base's f32 panels. So each
//! factor is read once a step for all its rows, and register-tiled six rows at a time.
//!
//! Every value is one FMA chain over its inputs in order, from zero: the kernels' rule, whatever
//! the rows around it. A row's update is therefore the same alone and in any batch. A CPU
//! without the packed kernels runs the same chains in plain loops ([`Factor`]), so the numbers
//! are the same there too.

use rayon::prelude::*;
use sluice_kernels::cpu::gemm::{self, PackedMatrix};
use sluice_kernels::quant_format::PANEL_COLUMNS;

/// Rows of one register tile of the packed kernels: a task of a split product takes a multiple
/// of it, so that splitting leaves no tile short of rows it could have had.
const TILE_ROWS: usize = 6;

/// One factor of an update, `[n, k]` (`A`: `[rank, inputs]`, `B`: `[outputs, rank]`), as the
/// step multiplies it.
pub(crate) struct Factor {
    n: usize,
    k: usize,
    values: FactorValues,
}

enum FactorValues {
    /// Packed into panels once, on a CPU with the packed kernels (AVX2, FMA and F16C).
    Packed(PackedMatrix),
    /// Row-major, on any other CPU.
    Plain(Vec<f32>),
}

impl std::fmt::Debug for Factor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.values {
            FactorValues::Packed(_) => "packed",
            FactorValues::Plain(_) => "plain",
        };
        write!(f, "Factor[{} x {}, {how}]", self.n, self.k)
    }
}

impl Factor {
    /// `values`: `[n, k]` row-major.
    pub(crate) fn new(values: Vec<f32>, n: usize, k: usize) -> Self {
        assert_eq!(values.len(), n * k, "factor size");
        let values = if gemm::available() {
            FactorValues::Packed(PackedMatrix::pack(&values, n, k))
        } else {
            FactorValues::Plain(values)
        };
        Self { n, k, values }
    }

    /// Row `r`'s `k` values, as given.
    pub(crate) fn row(&self, r: usize) -> Vec<f32> {
        match &self.values {
            FactorValues::Packed(m) => {
                let mut row = vec![0.0; self.k];
                m.dequantize_column(r, &mut row);
                row
            }
            FactorValues::Plain(v) => v[r * self.k..][..self.k].to_vec(),
        }
    }

    /// `out[m, n] = x[m, k] . W^T`, each value one FMA chain over `k` in order. With few
    /// panels to share out (an `A` of rank 16 is one) and enough rows, the rows are split over
    /// the threads instead: a row's chains are the same in any share.
    fn product(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        let threads = rayon::current_num_threads();
        let few_panels = n.div_ceil(PANEL_COLUMNS) < 2 * threads;
        if threads > 1 && few_panels && m >= 2 * TILE_ROWS {
            let share = m.div_ceil(threads).next_multiple_of(TILE_ROWS);
            x.par_chunks(share * k)
                .zip(out.par_chunks_mut(share * n))
                .for_each(|(x, out)| self.product_rows(x, x.len() / k, out));
        } else {
            self.product_rows(x, m, out);
        }
    }

    fn product_rows(&self, x: &[f32], m: usize, out: &mut [f32]) {
        match &self.values {
            FactorValues::Packed(w) => w.matmul(x, m, out),
            FactorValues::Plain(w) => {
                let k = self.k;
                for (x, out) in x.chunks_exact(k).zip(out.chunks_exact_mut(self.n)) {
                    for (w, out) in w.chunks_exact(k).zip(out.iter_mut()) {
                        *out = x.iter().zip(w).fold(0.0, |acc, (&x, &w)| x.mul_add(w, acc));
                    }
                }
            }
        }
    }
}

/// One adapter's update of one fused projection: the `A` of each adapted part stacked, and per
/// part its `B` and where its columns start in the fused output.
#[derive(Debug)]
pub(crate) struct LowRankGroup {
    inputs: usize,
    /// `[sum of the parts' ranks, inputs]`.
    a: Factor,
    parts: Vec<LowRankPart>,
}

#[derive(Debug)]
struct LowRankPart {
    /// The part's first column in the fused output.
    column: usize,
    /// The part's first row of the stacked `A` (its first column of `A x`).
    first: usize,
    rank: usize,
    /// `[outputs, rank]`.
    b: Factor,
}

/// One part of a group, as loaded: `a` `[rank, inputs]` and `b` `[outputs, rank]` row-major,
/// its columns from `column` in the fused output.
pub(crate) struct PartValues {
    pub column: usize,
    pub rank: usize,
    pub outputs: usize,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
}

/// One adapter's buffers for [`LowRankGroup::compute`], kept from step to step.
#[derive(Debug, Default)]
pub(crate) struct LowRankScratch {
    /// The step's rows that name the adapter, ascending.
    pub(crate) rows: Vec<usize>,
    /// Their inputs, gathered (when not every row of the step).
    x: Vec<f32>,
    /// `A x`, `[rows, sum of ranks]`.
    t: Vec<f32>,
    /// One part's columns of `t`, `[rows, rank]` (when the group has several).
    part_t: Vec<f32>,
    /// Per part, `B (A x)`: `[rows, outputs]`.
    deltas: Vec<Vec<f32>>,
}

impl LowRankGroup {
    /// The group of `parts` (in their order), each reading `inputs` values a row.
    pub(crate) fn new(inputs: usize, parts: Vec<PartValues>) -> Self {
        let ranks: usize = parts.iter().map(|p| p.rank).sum();
        let mut a = Vec::with_capacity(ranks * inputs);
        let mut first = 0;
        let parts = parts
            .into_iter()
            .map(|p| {
                assert_eq!(p.a.len(), p.rank * inputs, "A size");
                a.extend_from_slice(&p.a);
                let part = LowRankPart {
                    column: p.column,
                    first,
                    rank: p.rank,
                    b: Factor::new(p.b, p.outputs, p.rank),
                };
                first += p.rank;
                part
            })
            .collect();
        Self {
            inputs,
            a: Factor::new(a, ranks, inputs),
            parts,
        }
    }

    /// Part `part`'s `A` row `k` and `B` row `o` (for checks, not the step).
    pub(crate) fn a_row(&self, part: usize, k: usize) -> Vec<f32> {
        self.a.row(self.parts[part].first + k)
    }

    pub(crate) fn b_row(&self, part: usize, o: usize) -> Vec<f32> {
        self.parts[part].b.row(o)
    }

    /// Part `part`'s rank and outputs.
    pub(crate) fn part_shape(&self, part: usize) -> (usize, usize) {
        let part = &self.parts[part];
        (part.rank, part.b.n)
    }

    /// `B (A x[row])` of every part, for every row of `scratch.rows` (ascending, not
    /// empty), `x` `[step rows, inputs]`: into the scratch, for [`Self::add_row`].
    pub(crate) fn compute(&self, x: &[f32], scratch: &mut LowRankScratch) {
        let LowRankScratch {
            rows,
            x: gathered,
            t,
            part_t,
            deltas,
        } = scratch;
        let (m, inputs) = (rows.len(), self.inputs);
        let x = if m * inputs == x.len() {
            x
        } else {
            gathered.clear();
            for &row in rows.iter() {
                gathered.extend_from_slice(&x[row * inputs..][..inputs]);
            }
            gathered
        };
        let ranks = self.a.n;
        let t = sized(t, m * ranks);
        self.a.product(x, m, t);
        if deltas.len() < self.parts.len() {
            deltas.resize_with(self.parts.len(), Vec::new);
        }
        for (part, delta) in self.parts.iter().zip(deltas.iter_mut()) {
            let t_part: &[f32] = if self.parts.len() == 1 {
                t
            } else {
                let part_t = sized(part_t, m * part.rank);
                for (dst, src) in part_t
                    .chunks_exact_mut(part.rank)
                    .zip(t.chunks_exact(ranks))
                {
                    dst.copy_from_slice(&src[part.first..][..part.rank]);
                }
                part_t
            };
            part.b.product(t_part, m, sized(delta, m * part.b.n));
        }
    }

    /// `out[column + o] += scale * delta[o]` for every part, `out` one step row of the fused
    /// output and `delta` its update: the row at `position` in the `scratch.rows` of the last
    /// [`Self::compute`].
    pub(crate) fn add_row(
        &self,
        scale: f32,
        scratch: &LowRankScratch,
        position: usize,
        out: &mut [f32],
    ) {
        for (part, delta) in self.parts.iter().zip(&scratch.deltas) {
            let outputs = part.b.n;
            let delta = &delta[position * outputs..][..outputs];
            for (out, d) in out[part.column..][..outputs].iter_mut().zip(delta) {
                *out += scale * d;
            }
        }
    }
}

/// `buffer` holding exactly `len` values (their contents stale), growing it when needed.
fn sized(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    &mut buffer[..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761);
                (h >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    fn plain(values: Vec<f32>, n: usize, k: usize) -> Factor {
        Factor {
            n,
            k,
            values: FactorValues::Plain(values),
        }
    }

    /// The packed kernels and the plain loops give the same bits, for any number of rows.
    #[test]
    fn packed_and_plain_factors_agree_bit_for_bit() {
        if !gemm::available() {
            eprintln!("skipped: this CPU has no packed kernels to compare");
            return;
        }
        for &(n, k) in &[(16usize, 96usize), (48, 40), (40, 16), (7, 33)] {
            let w = values(n * k, 1);
            let (packed, plain) = (Factor::new(w.clone(), n, k), plain(w, n, k));
            for m in [1usize, 5, 6, 13, 40] {
                let x = values(m * k, 2);
                let (mut a, mut b) = (vec![0.0; m * n], vec![1.0; m * n]);
                packed.product(&x, m, &mut a);
                plain.product(&x, m, &mut b);
                assert_eq!(a, b, "n {n} k {k} m {m}");
            }
        }
    }

    /// A row's update is the same alone, among all rows of a step, and gathered from some.
    #[test]
    fn a_row_gets_the_same_update_in_any_step() {
        let (inputs, n) = (40, 3 + 24 + 5);
        let part = |column, rank, outputs, seed| PartValues {
            column,
            rank,
            outputs,
            a: values(rank * inputs, seed),
            b: values(outputs * rank, seed + 1),
        };
        // Two parts with a column before them that no update touches.
        let group = LowRankGroup::new(inputs, vec![part(3, 4, 24, 3), part(27, 2, 5, 5)]);
        let rows = 20;
        let x = values(rows * inputs, 7);
        let base = values(rows * n, 8);
        let mut scratch = LowRankScratch::default();
        let mut run = |x: &[f32], out: &mut [f32], picked: &[usize]| {
            scratch.rows.clear();
            scratch.rows.extend_from_slice(picked);
            group.compute(x, &mut scratch);
            for (position, &row) in picked.iter().enumerate() {
                group.add_row(0.75, &scratch, position, &mut out[row * n..][..n]);
            }
        };
        let mut all = base.clone();
        run(&x, &mut all, &(0..rows).collect::<Vec<_>>());
        let mut some = base.clone();
        let picked: Vec<usize> = (0..rows).filter(|r| r % 3 != 1).collect();
        run(&x, &mut some, &picked);
        for row in 0..rows {
            let mut alone = base[row * n..][..n].to_vec();
            run(&x[row * inputs..][..inputs], &mut alone, &[0]);
            assert_eq!(alone, all[row * n..][..n], "row {row} alone and among all");
            let want = if picked.contains(&row) {
                &alone[..]
            } else {
                &base[row * n..][..n]
            };
            assert_eq!(want, &some[row * n..][..n], "row {row} among some");
        }
        // Columns outside the parts are never touched.
        for row in 0..rows {
            assert_eq!(all[row * n..][..3], base[row * n..][..3]);
        }
    }
}
