//! Quantized matrix products with int8 activations (`--weights auto` and `quantized`): the
//! weights keep their GGUF blocks' integers and scales (regrouped at load into the kernels'
//! panels where a kernel reads panels), and each activation row is quantized to int8, so a
//! block's contribution is an integer dot product and a multiply-add of scales. Every format of
//! [`QuantFormat`] is read, in one of two activation forms ([`ActivationBlocks`]):
//! - the legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and MXFP4 against blocks of 32
//!   activations, each with a scale and the sum of its quants (as llama.cpp's Q8_1);
//! - the K-quants (Q4_K, Q5_K, Q6_K) against super-blocks of 256 activations with one scale and
//!   the integer sums of each 16 quants (as llama.cpp's Q8_K). The sub-blocks' integer scales
//!   then multiply inside the integer dot product, so a super-block takes one float step per
//!   activation row, not eight.
//!
//! Each form's arithmetic is fixed here, once, for every kernel that computes it (the issue
//! "one arithmetic per weight format"): per block the kernel forms exact integers, then one
//! float epilogue, written once, adds them to the row's running sums, block after block from
//! the first:
//! - the K-quants: per super-block `isum = sum(w' * xq)` over its 256 weights (`w' = sc * q`,
//!   Q6_K's `sc * (q - 32)`) and, for Q4_K and Q5_K, `imin = sum_j mn_j * xs_j` over its eight
//!   32-weight sub-blocks (`xs_j` the integer sum of their activations), then
//!   [`k_super_block`];
//! - the legacy formats: per block of 32 `isum = sum((q - offset) * xq)` (the offset 8 of Q4_0
//!   and 16 of Q5_0; Q8_0's `q` signed), then [`legacy_block`]: `isum` times `d * xd` into one
//!   sum and, for Q4_1 and Q5_1, the minimum times the block's activation sum (`xd *
//!   sum(xq)`, as llama.cpp's Q8_1 keeps it) into another, added last ([`legacy_total`]);
//! - MXFP4 as a legacy format without minimum, as llama.cpp's `ggml_vec_dot_mxfp4_q8_0`:
//!   `isum = sum(E2M1_VALUES[code] * xq)` (the E2M1 values doubled), `d` the block's E8M0 scale
//!   halved ([`e8m0_half`](crate::quant_format::e8m0_half), an f32 power of two, not an f16).
//!
//! Integers are exact whatever instruction sums them, so every kernel of this arithmetic gives
//! each output bit for bit the same float, whatever the rows beside it.
//!
//! Paths, picked once per process:
//! - AVX-512 VNNI: every format repacked at load into panels of 16 weight rows, each
//!   `vpdpbusd` 4 weights of each of the 16 rows against 4 broadcast activations, so that a
//!   lane is one output for the whole product (`kquant_vnni.rs` the K-quants,
//!   `legacy_panel.rs` the legacy formats);
//! - AVX2: the legacy formats from the same panels, each half of 8 rows by `maddubs` + `madd`
//!   (`legacy_panel.rs`); the K-quants in their GGUF blocks (`kquant_avx2.rs`);
//! - scalar loops with the same arithmetic, the oracles the SIMD paths are tested against.
//!   Without AVX2 only the legacy layouts and MXFP4 are taken ([`QuantMatrix::new`] declines the
//!   rest).

use half::f16;
use rayon::prelude::*;

use crate::disjoint::DisjointSlice;
use crate::quant_format::{
    QuantFormat, BLOCK_WEIGHTS as BLOCK, E2M1_VALUES, K_BLOCK_WEIGHTS as SUPER,
};

#[cfg(target_arch = "x86_64")]
mod kquant_avx2;
#[cfg(target_arch = "x86_64")]
mod kquant_vnni;
#[cfg(target_arch = "x86_64")]
mod legacy_panel;
#[cfg(target_arch = "x86_64")]
mod panels;
#[cfg(target_arch = "x86_64")]
mod x86;

/// A `[rows, cols]` weight matrix in GGUF blocks, rows being output features.
pub struct QuantMatrix {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    row_bytes: usize,
    path: Path,
    /// Where `data` holds [`kquant_vnni`]'s panels instead of GGUF rows: the offset of the
    /// first (64-byte aligned).
    panels_at: Option<usize>,
}

/// The activation blocks a matrix's kernel reads ([`QuantMatrix::activation_blocks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationBlocks {
    /// 32 quants with a scale, for the legacy formats.
    Of32,
    /// 256 quants with a scale and the sums of each 16, for the K-quants.
    Of256,
}

/// Activation rows quantized for [`QuantMatrix::matmul`], in the forms asked for, number for
/// number as llama.cpp rounds them (its Q8_0/Q8_1 blocks for the legacy formats: quants from
/// `127 / amax` rounded to even, the scale and Q8_1's sum kept as f16; its Q8_K blocks for the
/// K-quants: scale `1 / (127 / amax)`), so that a quantized file computes what llama.cpp
/// computes from it up to the order of float sums. A layer whose
/// parts differ in format (Q4_K_M's V in Q6_K beside a Q4_K Q and K need one form; a Q5_0
/// matrix beside a Q4_K one, both) quantizes each form once.
#[derive(Default)]
pub struct QuantizedActivations {
    of32: Blocks32,
    of256: Blocks256,
}

/// Per block of 32 a scale, the integer sum of its quants (the offsets of Q4_0, Q5_0 and the
/// panels' Q8_0 subtract multiples of it, exactly) and that sum times the scale (Q4_1's and
/// Q5_1's minimums multiply it).
#[derive(Default)]
struct Blocks32 {
    quants: Vec<i8>,
    scales: Vec<f32>,
    isums: Vec<i32>,
    sums: Vec<f32>,
    rows: usize,
    blocks_per_row: usize,
}

/// Per super-block of 256 the quants, a scale (`amax / 127`), the integer sum of each 16 quants
/// (Q6_K's `q - 32` subtracts 32 times them, exactly), and of each 32 (Q4_K's and Q5_K's
/// integer minimums multiply them, exactly).
#[derive(Default)]
struct Blocks256 {
    quants: Vec<i8>,
    scales: Vec<f32>,
    sums16: Vec<i16>,
    sums32: Vec<i16>,
    rows: usize,
    blocks_per_row: usize,
}

impl QuantizedActivations {
    /// Quantizes `x: [rows, cols]` in the form `blocks`, keeping the other form as it was.
    ///
    /// # Panics
    /// When `cols` is not a whole number of the form's blocks (a [`QuantMatrix`] of that form
    /// has no other width).
    pub fn quantize(&mut self, x: &[f32], rows: usize, cols: usize, blocks: ActivationBlocks) {
        assert_eq!(x.len(), rows * cols, "activation size");
        match blocks {
            ActivationBlocks::Of32 => self.of32.quantize(x, rows, cols),
            ActivationBlocks::Of256 => self.of256.quantize(x, rows, cols),
        }
    }

    /// The rows held in the form `blocks`.
    pub fn rows(&self, blocks: ActivationBlocks) -> usize {
        match blocks {
            ActivationBlocks::Of32 => self.of32.rows,
            ActivationBlocks::Of256 => self.of256.rows,
        }
    }

    fn row(&self, row: usize) -> ActRow<'_> {
        let b = &self.of32;
        let nb = b.blocks_per_row;
        let cols = nb * BLOCK;
        ActRow {
            quants: &b.quants[row * cols..][..cols],
            scales: &b.scales[row * nb..][..nb],
            sums: &b.sums[row * nb..][..nb],
        }
    }

    fn super_row(&self, row: usize) -> SuperRow<'_> {
        let b = &self.of256;
        let nb = b.blocks_per_row;
        let cols = nb * SUPER;
        SuperRow {
            quants: &b.quants[row * cols..][..cols],
            scales: &b.scales[row * nb..][..nb],
            sums16: &b.sums16[row * cols / 16..][..cols / 16],
            sums32: &b.sums32[row * cols / BLOCK..][..cols / BLOCK],
        }
    }

    /// Weights per row of the form `blocks`.
    fn cols(&self, blocks: ActivationBlocks) -> usize {
        match blocks {
            ActivationBlocks::Of32 => self.of32.blocks_per_row * BLOCK,
            ActivationBlocks::Of256 => self.of256.blocks_per_row * SUPER,
        }
    }
}

impl Blocks32 {
    fn quantize(&mut self, x: &[f32], rows: usize, cols: usize) {
        assert_eq!(cols % BLOCK, 0, "activation width");
        let nb = cols / BLOCK;
        self.rows = rows;
        self.blocks_per_row = nb;
        self.quants.resize(rows * cols, 0);
        self.scales.resize(rows * nb, 0.0);
        self.isums.resize(rows * nb, 0);
        self.sums.resize(rows * nb, 0.0);
        // llama.cpp's Q8_0 and Q8_1 blocks, number for number: the quants from `127 / amax`
        // (ties to even), the scale `amax / 127` kept as f16, and Q8_1's sum `d * sum(q)` as
        // f16, which is what every dot product of those blocks reads.
        let one = |(((xs, qs), scale), (isum, sum)): Block32Parts<'_>| {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut total = 0i32;
            for (q, v) in qs.iter_mut().zip(xs) {
                let r = (v * inv).round_ties_even() as i32;
                *q = r as i8;
                total += r;
            }
            *scale = f16::from_f32(d).to_f32();
            *isum = total;
            *sum = f16::from_f32(d * total as f32).to_f32();
        };
        // As `Blocks256::quantize`: a decode step's few rows on the caller's thread.
        if rows < QUANTIZE_PARALLEL_ROWS {
            x.chunks_exact(BLOCK)
                .zip(self.quants.chunks_exact_mut(BLOCK))
                .zip(self.scales.iter_mut())
                .zip(self.isums.iter_mut().zip(self.sums.iter_mut()))
                .for_each(one);
        } else {
            x.par_chunks_exact(BLOCK)
                .zip(self.quants.par_chunks_exact_mut(BLOCK))
                .zip(self.scales.par_iter_mut())
                .zip(self.isums.par_iter_mut().zip(self.sums.par_iter_mut()))
                .with_min_len(nb)
                .for_each(one);
        }
    }
}

/// One block of 32 activations and the places of its quants, scale and sums, as the
/// quantizer's zipped iterators hand them over.
type Block32Parts<'a> = (
    ((&'a [f32], &'a mut [i8]), &'a mut f32),
    (&'a mut i32, &'a mut f32),
);

impl Blocks256 {
    fn quantize(&mut self, x: &[f32], rows: usize, cols: usize) {
        assert_eq!(cols % SUPER, 0, "activation width");
        let nb = cols / SUPER;
        self.rows = rows;
        self.blocks_per_row = nb;
        self.quants.resize(rows * cols, 0);
        self.scales.resize(rows * nb, 0.0);
        self.sums16.resize(rows * cols / 16, 0);
        self.sums32.resize(rows * cols / BLOCK, 0);
        let one = |((((xs, qs), scale), sums16), sums32): SuperBlockParts<'_>| {
            super_block(
                xs,
                qs,
                scale,
                sums16.try_into().expect("16 sums"),
                sums32.try_into().expect("8 sums"),
            )
        };
        // A step of a few rows (a decode step's) quantizes in less time than handing work to
        // the pool's threads takes.
        if rows < QUANTIZE_PARALLEL_ROWS {
            x.chunks_exact(SUPER)
                .zip(self.quants.chunks_exact_mut(SUPER))
                .zip(self.scales.iter_mut())
                .zip(self.sums16.chunks_exact_mut(16))
                .zip(self.sums32.chunks_exact_mut(8))
                .for_each(one);
        } else {
            x.par_chunks_exact(SUPER)
                .zip(self.quants.par_chunks_exact_mut(SUPER))
                .zip(self.scales.par_iter_mut())
                .zip(self.sums16.par_chunks_exact_mut(16))
                .zip(self.sums32.par_chunks_exact_mut(8))
                .with_min_len(nb)
                .for_each(one);
        }
    }
}

/// One super-block's activations and the places of its quants, scale and sums, as the
/// quantizer's zipped iterators hand them over.
type SuperBlockParts<'a> = (
    (((&'a [f32], &'a mut [i8]), &'a mut f32), &'a mut [i16]),
    &'a mut [i16],
);

/// The fewest activation rows whose quantization runs on every thread (measured: a
/// 64-row decode step of Qwen2.5-Coder-1.5B spent about 3% of its samples quantizing on one).
const QUANTIZE_PARALLEL_ROWS: usize = 4;

/// One super-block of activations `xs`: its quants, scale and integer sums of 16 and of 32.
fn super_block(
    xs: &[f32],
    qs: &mut [i8],
    scale: &mut f32,
    sums16: &mut [i16; 16],
    sums32: &mut [i16; 8],
) {
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    // llama.cpp's Q8_K, number for number: `iscale = 127 / amax` (it divides by the signed
    // maximum and negates, which flips the quants' and the scale's signs together: the same
    // products), the quants `iscale * x` rounded to even, the scale `1 / iscale`. |v * inv| <=
    // 127, so the cast never saturates.
    let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let d = if amax != 0.0 { 1.0 / inv } else { 0.0 };
    for (q, v) in qs.iter_mut().zip(xs) {
        *q = (v * inv).round_ties_even() as i8;
    }
    for (s, g) in sums16.iter_mut().zip(qs.chunks_exact(16)) {
        *s = g.iter().map(|&q| q as i16).sum();
    }
    for (s, pair) in sums32.iter_mut().zip(sums16.chunks_exact(2)) {
        *s = pair[0] + pair[1];
    }
    *scale = d;
}

/// Output rows computed together by one task: big enough to amortise scheduling, small enough
/// to balance 2..N cores on the smallest matrices (128 rows).
const ROWS_PER_TASK: usize = 32;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(ROWS_PER_TASK.is_multiple_of(panels::PANEL_ROWS));

/// A panel module's writer of row `r` of a block (`kquant_vnni::put`, `legacy_panel::put`).
#[cfg(target_arch = "x86_64")]
type PanelWriter = fn(QuantFormat, &crate::quant_format::DecodedBlock, usize, &mut [u8]);

/// How `format`'s panel module lays out a block ([`QuantMatrix::panelled`]): the bytes a GGUF
/// block of 16 rows takes there, and its writer.
#[cfg(target_arch = "x86_64")]
fn panel_layout(format: QuantFormat) -> (usize, PanelWriter) {
    if format.is_k_quant() {
        (kquant_vnni::block_bytes(format), kquant_vnni::put)
    } else {
        (legacy_panel::block_bytes(format), legacy_panel::put)
    }
}

/// Activation rows one pass over a weight row serves (the scalar path's legacy formats): each
/// weight block is decoded once for all of them.
const ACT_ROWS: usize = 4;

/// The most activation rows a pass over a panel serves, of either panel module.
#[cfg(target_arch = "x86_64")]
const MAX_PANEL_ACT_ROWS: usize = 8;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(kquant_vnni::PANEL_ACT_ROWS <= MAX_PANEL_ACT_ROWS);

/// As [`ACT_ROWS`] for the K-quants: their activations need no float step per 32, which leaves
/// registers for more rows, and the unpacking of each 32 weights (a shift, masks and the
/// scales' shuffles) is shared by twice as many.
const K_ACT_ROWS: usize = 8;

/// Which kernel multiplies a matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Avx2,
    Vnni,
    Scalar,
}

impl QuantMatrix {
    /// A matrix of `rows` output features over `cols` inputs, `data` being its rows of GGUF
    /// `format` blocks; `None` when `cols` is not a whole number of blocks, `data` has the
    /// wrong size, or no kernel of this CPU reads the format (without AVX2 only the legacy
    /// Q4_0, Q4_1, Q8_0 and MXFP4 are read).
    pub fn new(format: QuantFormat, data: Vec<u8>, rows: usize, cols: usize) -> Option<Self> {
        Self::with_path(format, data, rows, cols, Self::path_for(format)?)
    }

    /// As [`new`](Self::new), the matrix's row `r` being `row(r)`: the rows are read where
    /// they lie (a model file's map, in any order), copied once into the layout the kernel
    /// reads. `None` also when a row is not a weight row's length.
    pub fn from_rows<'a>(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        row: impl Fn(usize) -> &'a [u8] + Sync,
    ) -> Option<Self> {
        let path = Self::path_for(format)?;
        let row_bytes = Self::row_bytes_of(format, cols)?;
        if (0..rows).any(|r| row(r).len() != row_bytes) {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        if Self::panelled(format, path) {
            return Some(Self::panels(format, rows, cols, row_bytes, &row, path));
        }
        let mut data = Vec::with_capacity(rows * row_bytes);
        for r in 0..rows {
            data.extend_from_slice(row(r));
        }
        Self::with_path(format, data, rows, cols, path)
    }

    /// The kernel this CPU multiplies `format` with, or `None` when it has none.
    fn path_for(format: QuantFormat) -> Option<Path> {
        if vnni_available() {
            Some(Path::Vnni)
        } else if avx2_available() {
            Some(Path::Avx2)
        } else if format.is_legacy_layout() || format == QuantFormat::Mxfp4 {
            Some(Path::Scalar)
        } else {
            None
        }
    }

    /// Bytes of a row of `cols` weights of `format`, or `None` when `cols` is not a whole
    /// number of blocks, or none.
    fn row_bytes_of(format: QuantFormat, cols: usize) -> Option<usize> {
        (cols > 0 && cols.is_multiple_of(format.block_weights()))
            .then(|| cols / format.block_weights() * format.block_bytes())
    }

    fn with_path(
        format: QuantFormat,
        data: Vec<u8>,
        rows: usize,
        cols: usize,
        path: Path,
    ) -> Option<Self> {
        let row_bytes = Self::row_bytes_of(format, cols)?;
        if data.len() != rows * row_bytes {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        if Self::panelled(format, path) {
            let row = |r: usize| &data[r * row_bytes..][..row_bytes];
            return Some(Self::panels(format, rows, cols, row_bytes, &row, path));
        }
        Some(Self {
            format,
            rows,
            cols,
            data,
            row_bytes,
            path,
            panels_at: None,
        })
    }

    /// Whether `path` reads `format` from panels: the legacy formats on AVX2 and AVX-512 VNNI
    /// ([`legacy_panel`]), the K-quants on AVX-512 VNNI ([`kquant_vnni`]).
    #[cfg(target_arch = "x86_64")]
    fn panelled(format: QuantFormat, path: Path) -> bool {
        match path {
            Path::Vnni => true,
            Path::Avx2 => legacy_panel::supports(format),
            Path::Scalar => false,
        }
    }

    /// The rows `row(0..rows)` repacked into panels for `path` ([`Self::panelled`]).
    #[cfg(target_arch = "x86_64")]
    fn panels<'a>(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        row_bytes: usize,
        row: &(dyn Fn(usize) -> &'a [u8] + Sync),
        path: Path,
    ) -> Self {
        let (out_block, put) = panel_layout(format);
        let put = |blk: &_, r, dst: &mut _| put(format, blk, r, dst);
        let (data, at) = panels::repack(format, row, rows, row_bytes, out_block, &put);
        Self {
            format,
            rows,
            cols,
            data,
            row_bytes,
            path,
            panels_at: Some(at),
        }
    }

    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Bytes the weights take (their blocks, or the panels they were repacked into).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The activation form this matrix's kernel reads.
    pub fn activation_blocks(&self) -> ActivationBlocks {
        if self.format.is_k_quant() {
            ActivationBlocks::Of256
        } else {
            ActivationBlocks::Of32
        }
    }

    /// `out[t, r] = sum_c x[t, c] * W[r, c]` for the activation rows in `acts` (quantized in
    /// this matrix's [`activation_blocks`](Self::activation_blocks)); `out` is
    /// `[rows, self.rows]` row-major.
    pub fn matmul(&self, acts: &QuantizedActivations, out: &mut [f32]) {
        self.matmul_into(acts, out, self.rows, 0);
    }

    /// As [`matmul`](Self::matmul), writing columns `col0..col0 + self.rows` of `out`, which
    /// has `ldo` columns: fused projections whose parts have different formats write one
    /// output.
    pub fn matmul_into(
        &self,
        acts: &QuantizedActivations,
        out: &mut [f32],
        ldo: usize,
        col0: usize,
    ) {
        let blocks = self.activation_blocks();
        let t = acts.rows(blocks);
        assert_eq!(acts.cols(blocks), self.cols, "activation width");
        assert!(col0 + self.rows <= ldo, "columns past the output's width");
        assert_eq!(out.len(), t * ldo, "output size");
        let act_rows = match blocks {
            ActivationBlocks::Of32 => ACT_ROWS,
            ActivationBlocks::Of256 => K_ACT_ROWS,
        };
        let out = DisjointSlice::new(out);
        #[cfg(target_arch = "x86_64")]
        if let Some(at) = self.panels_at {
            return self.panels_into(at, acts, &out, ldo, col0);
        }
        (0..self.rows.div_ceil(ROWS_PER_TASK))
            .into_par_iter()
            .for_each(|task| {
                let rows = task * ROWS_PER_TASK..self.rows.min((task + 1) * ROWS_PER_TASK);
                let mut dots = [0f32; ROWS_PER_TASK * K_ACT_ROWS];
                let mut first = 0;
                while first < t {
                    let n = act_rows.min(t - first);
                    let dots = &mut dots[..rows.len() * n];
                    self.dots(rows.clone(), acts, first..first + n, dots);
                    for (r, row_dots) in rows.clone().zip(dots.chunks_exact(n)) {
                        for (i, &v) in row_dots.iter().enumerate() {
                            // SAFETY: in bounds by the asserts above; column `col0 + r` of every
                            // activation row is written by this task alone (tasks own disjoint
                            // weight rows).
                            unsafe { out.slice_mut((first + i) * ldo + col0 + r, 1)[0] = v };
                        }
                    }
                    first += n;
                }
            });
    }

    /// [`matmul_into`](Self::matmul_into) from panels ([`Self::panelled`], at byte `at` of
    /// `data`): each task's weight rows against every tile of activation rows, written as
    /// contiguous runs of each activation row's output.
    #[cfg(target_arch = "x86_64")]
    fn panels_into(
        &self,
        at: usize,
        acts: &QuantizedActivations,
        out: &DisjointSlice<'_, f32>,
        ldo: usize,
        col0: usize,
    ) {
        use panels::PANEL_ROWS;
        let blocks = self.activation_blocks();
        let t = acts.rows(blocks);
        let vnni = self.path == Path::Vnni;
        let bytes = panels::panel_bytes(self.format, self.cols, panel_layout(self.format).0);
        let act_rows = match blocks {
            ActivationBlocks::Of32 => legacy_panel::act_rows(vnni),
            ActivationBlocks::Of256 => kquant_vnni::PANEL_ACT_ROWS,
        };
        let (b32, b256) = (&acts.of32, &acts.of256);
        let legacy = legacy_panel::PanelActs {
            quants: &b32.quants,
            scales: &b32.scales,
            isums: &b32.isums,
            sums: &b32.sums,
            cols: self.cols,
        };
        let k = kquant_vnni::PanelActs {
            quants: &b256.quants,
            scales: &b256.scales,
            sums16: &b256.sums16,
            sums32: &b256.sums32,
            cols: self.cols,
        };
        (0..self.rows.div_ceil(ROWS_PER_TASK))
            .into_par_iter()
            .for_each(|task| {
                let rows = task * ROWS_PER_TASK..self.rows.min((task + 1) * ROWS_PER_TASK);
                let panels = &self.data[at + rows.start / PANEL_ROWS * bytes..]
                    [..rows.len().div_ceil(PANEL_ROWS) * bytes];
                let mut dots = [0f32; ROWS_PER_TASK * MAX_PANEL_ACT_ROWS];
                let mut first = 0;
                while first < t {
                    let n = act_rows.min(t - first);
                    let dots = &mut dots[..rows.len() * n];
                    // SAFETY: panels are only made on `Path::Vnni` (the CPU has AVX2, FMA,
                    // F16C and AVX-512 F, BW, VL and VNNI) or, for the legacy formats,
                    // `Path::Avx2` (AVX2, FMA and F16C), for a format the panel module takes;
                    // `panels` are whole panels of `self.cols` weights holding the task's
                    // rows, the activations hold every row of `first..first + n`, of as many
                    // weights (asserted by `matmul_into`), and `n` is at most the module's
                    // rows a pass.
                    unsafe {
                        match blocks {
                            ActivationBlocks::Of32 => legacy_panel::rows_dot(
                                self.format,
                                panels,
                                rows.len(),
                                &legacy,
                                first..first + n,
                                dots,
                                vnni,
                            ),
                            ActivationBlocks::Of256 => kquant_vnni::rows_dot(
                                self.format,
                                panels,
                                rows.len(),
                                &k,
                                first..first + n,
                                dots,
                            ),
                        }
                    };
                    for (i, run) in dots.chunks_exact(rows.len()).enumerate() {
                        // SAFETY: in bounds by `matmul_into`'s asserts; columns `col0 + rows`
                        // of every activation row are written by this task alone (tasks own
                        // disjoint weight rows).
                        let to = unsafe {
                            out.slice_mut((first + i) * ldo + col0 + rows.start, run.len())
                        };
                        to.copy_from_slice(run);
                    }
                    first += n;
                }
            });
    }

    /// Weight rows `rows` against activation rows `act_rows` (at most [`ACT_ROWS`], or
    /// [`K_ACT_ROWS`] for the K-quants):
    /// `dots[i * act_rows.len() + a]` is the `i`-th weight row times the `a`-th activation row.
    #[inline]
    fn dots(
        &self,
        rows: std::ops::Range<usize>,
        acts: &QuantizedActivations,
        act_rows: std::ops::Range<usize>,
        dots: &mut [f32],
    ) {
        let weights = &self.data[rows.start * self.row_bytes..rows.end * self.row_bytes];
        let n = act_rows.len();
        match self.path {
            // Panels (`panels_into`) take the K-quants on AVX-512 VNNI and the legacy formats on
            // both; what is left on AVX2 is the K-quants.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => {
                let first = act_rows.start;
                let a: [SuperRow<'_>; K_ACT_ROWS] =
                    std::array::from_fn(|i| acts.super_row(first + i.min(n - 1)));
                // SAFETY: as above, for a K-quant format whose activation rows hold as many
                // super-blocks as a weight row (asserted by `matmul_into`).
                unsafe {
                    kquant_avx2::rows_dot(self.format, weights, self.row_bytes, &a[..n], dots)
                }
            }
            _ => {
                for (w, row_dots) in weights
                    .chunks_exact(self.row_bytes)
                    .zip(dots.chunks_exact_mut(n))
                {
                    for (d, a) in row_dots.iter_mut().zip(act_rows.clone()) {
                        *d = self.scalar_dot(w, acts, a);
                    }
                }
            }
        }
    }

    /// Weight row `w` times activation row `a` by the scalar oracle of the matrix's form.
    fn scalar_dot(&self, w: &[u8], acts: &QuantizedActivations, a: usize) -> f32 {
        match self.activation_blocks() {
            ActivationBlocks::Of32 => scalar_row_dot(self.format, w, &acts.row(a)),
            ActivationBlocks::Of256 => scalar_super_row_dot(self.format, w, &acts.super_row(a)),
        }
    }
}

/// One activation row's blocks of 32, as the legacy kernels read them.
struct ActRow<'a> {
    quants: &'a [i8],
    scales: &'a [f32],
    sums: &'a [f32],
}

/// One activation row's super-blocks of 256, as the K-quant kernels read them.
struct SuperRow<'a> {
    quants: &'a [i8],
    scales: &'a [f32],
    sums16: &'a [i16],
    sums32: &'a [i16],
}

/// Adds one K-quant super-block to a row's running float sum `acc`: the one float epilogue of
/// the K-quants' int8 arithmetic, which every kernel of it calls (module docs). `isum` is the
/// super-block's exact `sum(w' * xq)`, `imin` its exact `sum_j mn_j * xs_j` (`None` for Q6_K,
/// which has no minimums), `d` and `dmin` the weights' super-block scales and `xd` the
/// activations'. Two fused multiply-adds, in this order: whether a kernel inlines them into
/// its vector code or a scalar loop calls them, they round the same.
#[inline(always)]
pub(crate) fn k_super_block(
    acc: f32,
    isum: i32,
    imin: Option<i32>,
    d: f32,
    dmin: f32,
    xd: f32,
) -> f32 {
    let acc = (isum as f32).mul_add(d * xd, acc);
    match imin {
        Some(imin) => (imin as f32).mul_add(-(dmin * xd), acc),
        None => acc,
    }
}

/// AVX2, FMA and F16C: the packed kernel's own requirement, so one detection serves both.
fn avx2_available() -> bool {
    crate::cpu::gemm::available()
}

fn vnni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            avx2_available()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
        }) && super::allows(super::KernelTier::Avx512Vnni)
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A legacy weight row against an activation row by the legacy formats' one arithmetic
/// (module docs), the oracle of every kernel of it: each block decoded by
/// [`QuantFormat::decode`], its integer dot summed exactly, then [`legacy_block`], block after
/// block from the first, and [`legacy_total`].
fn scalar_row_dot(format: QuantFormat, w: &[u8], a: &ActRow<'_>) -> f32 {
    // Q4_0's decoded `q` is its nibble (the offset 8 applied here); Q5_0's and Q8_0's are
    // already signed; Q4_1's and Q5_1's take no offset; MXFP4's is a code, read through the
    // table.
    let offset = if format == QuantFormat::Q4_0 { 8 } else { 0 };
    let signed = |q: i8| match format {
        QuantFormat::Mxfp4 => E2M1_VALUES[q as usize] as i32,
        _ => q as i32 - offset,
    };
    let has_min = legacy_has_min(format);
    let (mut main, mut mins) = (0f32, 0f32);
    for (b, blk) in w.chunks_exact(format.block_bytes()).enumerate() {
        let dec = format.decode(blk);
        let xq = &a.quants[b * BLOCK..][..BLOCK];
        let isum: i32 = dec.q[..BLOCK]
            .iter()
            .zip(xq)
            .map(|(&q, &x)| signed(q) * x as i32)
            .sum();
        let d = format.scale(&dec);
        let m = f16::from_bits(dec.m).to_f32();
        (main, mins) = legacy_block(
            main,
            mins,
            isum,
            d,
            a.scales[b],
            has_min.then_some((m, a.sums[b])),
        );
    }
    legacy_total(main, mins)
}

/// Whether `format` (a legacy one) has a minimum per block (`w = d * q + m`).
fn legacy_has_min(format: QuantFormat) -> bool {
    matches!(format, QuantFormat::Q4_1 | QuantFormat::Q5_1)
}

/// Adds one legacy block to a row's two running float sums: the one float epilogue of the
/// legacy formats' int8 arithmetic, which every kernel of it follows (module docs). `isum` is
/// the block's exact `sum((q - offset) * xq)`, `d` the weights' scale and `xd` the
/// activations'; `min` is the weights' minimum and the activations' sum times their scale
/// (`xd * sum(xq)`), for Q4_1 and Q5_1. One fused multiply-add into each sum: vector kernels
/// compute the same two, lane by lane.
#[inline(always)]
fn legacy_block(
    main: f32,
    mins: f32,
    isum: i32,
    d: f32,
    xd: f32,
    min: Option<(f32, f32)>,
) -> (f32, f32) {
    let main = (isum as f32).mul_add(d * xd, main);
    match min {
        Some((m, sum)) => (main, m.mul_add(sum, mins)),
        None => (main, mins),
    }
}

/// A legacy row's result from its two running sums ([`legacy_block`]).
#[inline(always)]
fn legacy_total(main: f32, mins: f32) -> f32 {
    main + mins
}

/// A K-quant weight row against a row of super-block activations by the K-quants' one
/// arithmetic (module docs): each super-block decoded by [`QuantFormat::decode`], its integers
/// summed exactly, then [`k_super_block`]. (Q6_K's decoded `q` is already signed: `q - 32`.)
fn scalar_super_row_dot(format: QuantFormat, w: &[u8], a: &SuperRow<'_>) -> f32 {
    let mut total = 0f32;
    for (b, blk) in w.chunks_exact(format.block_bytes()).enumerate() {
        let dec = format.decode(blk);
        let d = f16::from_bits(dec.d).to_f32();
        let dmin = f16::from_bits(dec.m).to_f32();
        let xq = &a.quants[b * SUPER..][..SUPER];
        let isum: i32 = (0..SUPER)
            .map(|i| {
                let sc = match format {
                    QuantFormat::Q6K => dec.sc[i / 16] as i32,
                    _ => dec.sc[i / 32] as u8 as i32,
                };
                sc * dec.q[i] as i32 * xq[i] as i32
            })
            .sum();
        let imin = (format != QuantFormat::Q6K).then(|| {
            (0..SUPER / BLOCK)
                .map(|j| dec.mn[j] as u8 as i32 * a.sums32[b * SUPER / BLOCK + j] as i32)
                .sum()
        });
        total = k_super_block(total, isum, imin, d, dmin, a.scales[b]);
    }
    total
}

#[cfg(test)]
mod tests {
    use crate::testing::{quantized_matrix, random_blocks, random_values};
    use candle_core::{Device, Tensor};

    use super::*;

    /// Every path this CPU can run, the scalar oracle last.
    fn paths() -> Vec<Path> {
        let mut paths = Vec::new();
        if avx2_available() {
            paths.push(Path::Avx2);
        }
        if vnni_available() {
            paths.push(Path::Vnni);
        }
        paths.push(Path::Scalar);
        paths
    }

    fn product(m: &QuantMatrix, x: &[f32], t: usize) -> Vec<f32> {
        let mut acts = QuantizedActivations::default();
        acts.quantize(x, t, m.cols(), m.activation_blocks());
        let mut out = vec![0f32; t * m.rows()];
        m.matmul(&acts, &mut out);
        out
    }

    /// `x [t, cols]` times the dequantized `dense [rows, cols]`, transposed, in f32.
    fn dense_product(dense: &[f32], rows: usize, cols: usize, x: &[f32], t: usize) -> Vec<f32> {
        let wd = Tensor::from_vec(dense.to_vec(), (rows, cols), &Device::Cpu).unwrap();
        let xt = Tensor::from_vec(x.to_vec(), (t, cols), &Device::Cpu).unwrap();
        xt.matmul(&wd.t().unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    }

    /// Every format through every path against the scalar oracle, on random bytes in every
    /// field (bit patterns no quantizer writes included), with 1..=12 activation rows (the
    /// kernels take rows 4 (8 for the K-quants) at a time, then the rest) and rows of up to 11
    /// blocks (the legacy kernels take blocks 8 at a time, then the rest).
    #[test]
    fn simd_paths_equal_the_scalar_oracle_on_random_blocks() {
        for format in QuantFormat::ALL {
            let bw = format.block_weights();
            // Weight rows 40, 33, 65, 7...: whole and partial panels of 16 (AVX-512 VNNI's
            // K-quants; a partial panel's missing rows are computed and not stored).
            for &(rows, blocks, t) in &[
                (40usize, 2usize, 1usize),
                (33, 3, 5),
                (65, 1, 9),
                (7, 4, 12),
                // 11 blocks: the legacy kernels' group of 8 and a tail of 3.
                (9, 11, 3),
                // 17 rows: two whole passes of 8 and one; 15, a pass and a partial one of 7.
                (12, 2, 17),
                (6, 2, 15),
                (5, 1, 2),
                // One row over 19 blocks: a decode step's product.
                (10, 19, 1),
            ] {
                let cols = blocks * bw;
                let (bytes, _) = random_blocks(rows, cols, format, 7 + rows as u64);
                let x = random_values(t * cols, 11);
                let oracle =
                    QuantMatrix::with_path(format, bytes.clone(), rows, cols, Path::Scalar)
                        .unwrap();
                let want = product(&oracle, &x, t);
                for path in paths() {
                    let m =
                        QuantMatrix::with_path(format, bytes.clone(), rows, cols, path).unwrap();
                    let got = product(&m, &x, t);
                    // Every format has one arithmetic (module docs): bit for bit.
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{format:?} {path:?} rows {rows} cols {cols} t {t} at {i}: {a} vs scalar {b}"
                        );
                    }
                }
            }
        }
    }

    /// The integer sums' largest values, where a 16-bit step of a SIMD path would saturate
    /// first: every quant and scale at its maximum, against activations all +127 or all -127,
    /// through every path, bit for bit against the scalar oracle.
    #[test]
    fn the_largest_sums_stay_exact() {
        // Q8_0's quants all -128 too: the largest magnitude, and its panels' unsigned 0;
        // MXFP4's codes all 7 too (+12; 0xF is -12).
        let cases = QuantFormat::ALL
            .into_iter()
            .map(|f| (f, 0xFF))
            .chain([(QuantFormat::Q8_0, 0x80), (QuantFormat::Mxfp4, 0x77)]);
        for (format, fill) in cases {
            let (rows, cols) = (3, 2 * SUPER);
            let mut bytes = vec![fill; rows * cols / format.block_weights() * format.block_bytes()];
            // Finite scales: `d` (and the minimums) 1.0; Q6_K's i8 scales 127.
            let d_at: &[usize] = match format {
                QuantFormat::Q6K => &[208],
                QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => &[0],
                _ => &[0, 2],
            };
            for block in bytes.chunks_exact_mut(format.block_bytes()) {
                if format == QuantFormat::Mxfp4 {
                    // E8M0's 1.0 halved (the largest codes are 6.0).
                    block[0] = 128;
                    continue;
                }
                for &at in d_at {
                    block[at..at + 2].copy_from_slice(&half::f16::ONE.to_le_bytes());
                }
                if format == QuantFormat::Q6K {
                    block[192..208].fill(127);
                }
            }
            for sign in [1.0f32, -1.0] {
                for t in [1, 2, 8] {
                    let x = vec![sign; t * cols];
                    let oracle =
                        QuantMatrix::with_path(format, bytes.clone(), rows, cols, Path::Scalar)
                            .unwrap();
                    let want = product(&oracle, &x, t);
                    for path in paths() {
                        let m = QuantMatrix::with_path(format, bytes.clone(), rows, cols, path)
                            .unwrap();
                        let got = product(&m, &x, t);
                        assert!(
                            got.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{format:?} {path:?} sign {sign} t {t}: {got:?} vs scalar {want:?}"
                        );
                    }
                }
            }
        }
    }

    /// The int8 product tracks the f32 product of candle's dequantized weights: only the
    /// activations' rounding to int8 differs.
    #[test]
    fn products_track_the_dequantized_weights() {
        for format in QuantFormat::ALL {
            let bw = format.block_weights();
            for &(rows, cols, t) in &[(40usize, 2 * bw, 1usize), (200, 3 * bw, 3), (33, bw, 8)] {
                let (bytes, dense) = quantized_matrix(rows, cols, format, 3);
                let m = QuantMatrix::new(format, bytes, rows, cols)
                    .unwrap_or_else(|| panic!("{format:?} has a kernel on this CPU"));
                let x = random_values(t * cols, 11);
                let got = product(&m, &x, t);
                let exact = dense_product(&dense, rows, cols, &x, t);
                let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (a, e) in got.iter().zip(&exact) {
                    assert!(
                        (a - e).abs() <= 0.02 * scale,
                        "{format:?}: {a} vs dequantized {e}"
                    );
                }
            }
        }
    }

    /// Columns written into a wider output equal the matrix's own product, and nothing else of
    /// the output is touched.
    #[test]
    fn matmul_into_writes_only_its_columns() {
        let (bytes, _) = random_blocks(24, 256, QuantFormat::Q6K, 5);
        let m = QuantMatrix::new(QuantFormat::Q6K, bytes, 24, 256).unwrap();
        let t = 6;
        let x = random_values(t * 256, 2);
        let own = product(&m, &x, t);
        let mut acts = QuantizedActivations::default();
        acts.quantize(&x, t, 256, ActivationBlocks::Of256);
        let (ldo, col0) = (40, 9);
        let mut wide = vec![f32::NAN; t * ldo];
        m.matmul_into(&acts, &mut wide, ldo, col0);
        for row in 0..t {
            for c in 0..ldo {
                let v = wide[row * ldo + c];
                if (col0..col0 + 24).contains(&c) {
                    assert_eq!(v, own[row * 24 + c - col0]);
                } else {
                    assert!(v.is_nan(), "column {c} of row {row} was written");
                }
            }
        }
    }

    /// A row's result does not depend on how many rows share the step (batching is invisible).
    #[test]
    fn a_row_alone_equals_it_in_a_batch() {
        for format in QuantFormat::ALL {
            // 10 blocks: a group of 8 and a tail of 2 in the legacy kernels.
            let cols = 10 * format.block_weights();
            let (bytes, _) = random_blocks(20, cols, format, 9);
            let m = QuantMatrix::new(format, bytes, 20, cols).unwrap();
            let t = 11;
            let x = random_values(t * cols, 4);
            let batch = product(&m, &x, t);
            for row in 0..t {
                let alone = product(&m, &x[row * cols..][..cols], 1);
                assert_eq!(alone, batch[row * 20..][..20], "{format:?} row {row}");
            }
        }
    }

    #[test]
    fn wrong_sizes_are_declined() {
        let (bytes, _) = quantized_matrix(32, 256, QuantFormat::Q4_0, 1);
        assert!(QuantMatrix::new(QuantFormat::Q4_0, bytes.clone(), 32, 255).is_none());
        assert!(QuantMatrix::new(QuantFormat::Q8_0, bytes, 32, 256).is_none());
        let (bytes, _) = quantized_matrix(32, 256, QuantFormat::Q5_0, 1);
        assert!(QuantMatrix::new(QuantFormat::Q4K, bytes.clone(), 32, 256).is_none());
        // Q4_K rows are whole super-blocks of 256.
        assert!(QuantMatrix::new(QuantFormat::Q4K, bytes, 64, 128).is_none());
        assert!(QuantMatrix::new(QuantFormat::Q4K, Vec::new(), 64, 0).is_none());
        let (bytes, _) = quantized_matrix(32, 256, QuantFormat::Q4K, 1);
        let short = |r: usize| &bytes[r * 144..][..if r == 5 { 100 } else { 144 }];
        assert!(QuantMatrix::from_rows(QuantFormat::Q4K, 32, 256, short).is_none());
    }

    /// Rows read where they lie, in any order, make the matrix of those rows copied in that
    /// order: every format, every path of this CPU, bit for bit.
    #[test]
    fn rows_read_in_place_equal_rows_copied() {
        for format in QuantFormat::ALL {
            let (rows, cols, t) = (37, 2 * format.block_weights(), 9);
            let (bytes, _) = random_blocks(rows, cols, format, 3);
            let rb = bytes.len() / rows;
            let reversed: Vec<u8> = (0..rows)
                .rev()
                .flat_map(|r| bytes[r * rb..][..rb].iter().copied())
                .collect();
            let x = random_values(t * cols, 5);
            let copied = QuantMatrix::new(format, reversed, rows, cols).unwrap();
            let in_place =
                QuantMatrix::from_rows(format, rows, cols, |r| &bytes[(rows - 1 - r) * rb..][..rb])
                    .unwrap();
            let (a, b) = (product(&copied, &x, t), product(&in_place, &x, t));
            assert!(
                a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{format:?}"
            );
        }
    }
}
