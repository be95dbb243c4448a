//! What the panel kernels share: how many weight rows a panel holds and how a matrix is
//! repacked into panels. Each panel module (`kquant_vnni.rs`, `legacy_panel.rs`) lays out a
//! block of its formats; this driver walks the rows and blocks.

use rayon::prelude::*;

use crate::quant_format::{DecodedBlock, QuantFormat};

/// Weight rows per panel: one per 32-bit lane of a 512-bit register.
pub(super) const PANEL_ROWS: usize = 16;

/// The weight rows `row(0..rows)` (each `row_bytes` bytes of GGUF `format` blocks) as panels
/// of [`PANEL_ROWS`] rows, `out_block` bytes a GGUF block of the 16 rows, row `r` of each
/// block written by `put(decoded block, r, its panel block)`; the last panel's missing rows
/// stay zero. Written from byte `at` of the result, where `at` makes the panels 64-byte
/// aligned. The rows are read where they lie (a model file's map), so loading holds no
/// second copy of them.
pub(super) fn repack<'a>(
    format: QuantFormat,
    row: &(dyn Fn(usize) -> &'a [u8] + Sync),
    rows: usize,
    row_bytes: usize,
    out_block: usize,
    put: &(dyn Fn(&DecodedBlock, usize, &mut [u8]) + Sync),
) -> (Vec<u8>, usize) {
    let in_block = format.block_bytes();
    let panel = row_bytes / in_block * out_block;
    let panels = rows.div_ceil(PANEL_ROWS);
    let mut out = vec![0u8; panels * panel + 63];
    let at = out.as_ptr().align_offset(64).min(63);
    out[at..at + panels * panel]
        .par_chunks_mut(panel)
        .enumerate()
        .for_each(|(p, dst)| {
            for (b, dst) in dst.chunks_exact_mut(out_block).enumerate() {
                for r in 0..PANEL_ROWS.min(rows - p * PANEL_ROWS) {
                    let row = row(p * PANEL_ROWS + r);
                    debug_assert_eq!(row.len(), row_bytes);
                    put(&format.decode(&row[b * in_block..][..in_block]), r, dst);
                }
            }
        });
    (out, at)
}

/// Bytes of one panel over `cols` weights of `format`, `out_block` bytes a GGUF block of its
/// 16 rows.
pub(super) fn panel_bytes(format: QuantFormat, cols: usize, out_block: usize) -> usize {
    cols / format.block_weights() * out_block
}
