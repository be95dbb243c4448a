//! f32 matrix products against weights packed once at load, for the forward's linear layers.
//!
//! A general gemm packs its operands on every call; with a decode batch of 64 rows against a
//! 576x3072 weight, repacking the weight cost about as much as multiplying (measured: gemm's
//! `pack_lhs` at 24% of a step). Here weights are packed at load into panels of 16 output
//! features stored k-major (`[panel][k][16]`), and an AVX-512 microkernel keeps a 6-row x
//! 64-column tile of outputs in 24 registers while it streams the panels: per k, 4 panel loads
//! and 6 broadcasts feed 24 FMAs. Work is split over column groups, so each thread streams its
//! own share of the weights once per 6 rows of activations, from L2.
//!
//! This file packs the weights and picks the kernels; the microkernels are by instruction set:
//! [`avx512`] (the f32 panels, the legacy layouts Q4_0, Q4_1 and Q8_0 on their own kernel, and
//! every other layout), and [`avx2`], 8-lane kernels that run the same panels on CPUs with AVX2
//! and FMA but not AVX-512. All compute every output column as the same chain of FMAs, so
//! which kernel runs never changes a result.

use rayon::prelude::*;

use crate::disjoint::DisjointSlice;
use crate::quant_format::{QuantFormat, ScaleKind, PANEL_COLUMNS as PANEL};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
/// Rows of activations per register tile.
const MR: usize = 6;

pub struct PackedMatrix {
    /// Output features.
    n: usize,
    /// Input features.
    k: usize,
    panels: Panels,
    /// Steps of at least this many rows run on AMX tiles ([`crate::cpu::amx`]) instead, with the
    /// weights tiled once at load.
    /// `None` tiles: dequantized from the panels at every call.
    amx: Option<(usize, Option<Vec<crate::cpu::CacheLine>>)>,
    /// Those AMX steps quantize the activations to int8 and multiply on int8 tiles
    /// ([`Self::use_amx_int8`]).
    amx_int8: bool,
}

/// The weights of a packed matrix, panel by panel (16 output features each, zero-padded past
/// `n`).
enum Panels {
    /// `[panel][k][16]` f32.
    F32(Vec<f32>),
    /// GGUF blocks regrouped by panel: `[panel][k / super_rows]` panel-blocks laid out as
    /// [`PanelLayout`](crate::quant_format::PanelLayout) says (for Q4_0, Q4_1 and Q8_0: 16 f16
    /// scales, 16 f16 minimums for Q4_1, then the quants of 32 k-rows x 16 columns).
    Quant {
        format: QuantFormat,
        bytes: Vec<u8>,
        panel_bytes: usize,
    },
}

/// Bytes of one panel-block of the format with const id `id`.
pub(crate) const fn panel_block_bytes(id: u8) -> usize {
    QuantFormat::from_id(id).panel_layout().block_bytes()
}

/// Whether this CPU runs the packed kernel: AVX2, FMA and F16C (x86-64-v3), or AVX-512.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the AVX-512 microkernels run (every panel format).
fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVX512: OnceLock<bool> = OnceLock::new();
        *AVX512.get_or_init(|| {
            available()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
        }) && super::allows(super::KernelTier::Avx512)
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Steps of at least this many rows dequantize each quantized panel once into f32 (per call,
/// in a per-thread scratch) and multiply it on the f32 kernel, instead of dequantizing it in
/// registers for every six rows: the same numbers, a fraction of the work for prefills and
/// large batches.
const DEQUANTIZE_ONCE_MIN_ROWS: usize = 12;

/// At most this many bytes of dequantized panels (1.5 MiB) are multiplied together on AVX-512,
/// so they stay in L2 while every six rows stream them. Measured on a 2 MiB L2, 16 rows of
/// Qwen2.5-1.5B's down projection (k = 8960, 573 KB a panel): four panels at a time 3.1 ms,
/// one 2.8, two 2.4-2.6.
const DEQUANTIZED_BYTES: usize = 3 << 19;

/// Dequantizes one quantized panel over `k` into `[k][16]` f32 rows.
///
/// Safety (of a call): the CPU has what [`panel_to_f32`] chose the function for, the pointer
/// holds one panel covering `k`, and the output `k * 16` floats.
#[cfg(target_arch = "x86_64")]
type PanelToF32 = unsafe fn(*const u8, usize, *mut f32);

/// The kernel that dequantizes one panel of `format` into f32 rows with the exact kernels'
/// arithmetic: AVX-512 where the CPU has it, else AVX2, FMA and F16C ([`available`]); the two
/// write the same floats.
#[cfg(target_arch = "x86_64")]
fn panel_to_f32(format: QuantFormat) -> PanelToF32 {
    if avx512() {
        return match format {
            QuantFormat::Q4_0 => avx512::dequantize_panel::<{ QuantFormat::Q4_0_ID }>,
            QuantFormat::Q4_1 => avx512::dequantize_panel::<{ QuantFormat::Q4_1_ID }>,
            QuantFormat::Q5_0 => avx512::dequantize_panel::<{ QuantFormat::Q5_0_ID }>,
            QuantFormat::Q5_1 => avx512::dequantize_panel::<{ QuantFormat::Q5_1_ID }>,
            QuantFormat::Q8_0 => avx512::dequantize_panel::<{ QuantFormat::Q8_0_ID }>,
            QuantFormat::Q4K => avx512::dequantize_panel::<{ QuantFormat::Q4K_ID }>,
            QuantFormat::Q5K => avx512::dequantize_panel::<{ QuantFormat::Q5K_ID }>,
            QuantFormat::Q6K => avx512::dequantize_panel::<{ QuantFormat::Q6K_ID }>,
            QuantFormat::Mxfp4 => avx512::dequantize_panel::<{ QuantFormat::MXFP4_ID }>,
        };
    }
    match format {
        QuantFormat::Q4_0 => avx2::dequantize_panel::<{ QuantFormat::Q4_0_ID }>,
        QuantFormat::Q4_1 => avx2::dequantize_panel::<{ QuantFormat::Q4_1_ID }>,
        QuantFormat::Q5_0 => avx2::dequantize_panel::<{ QuantFormat::Q5_0_ID }>,
        QuantFormat::Q5_1 => avx2::dequantize_panel::<{ QuantFormat::Q5_1_ID }>,
        QuantFormat::Q8_0 => avx2::dequantize_panel::<{ QuantFormat::Q8_0_ID }>,
        QuantFormat::Q4K => avx2::dequantize_panel::<{ QuantFormat::Q4K_ID }>,
        QuantFormat::Q5K => avx2::dequantize_panel::<{ QuantFormat::Q5K_ID }>,
        QuantFormat::Q6K => avx2::dequantize_panel::<{ QuantFormat::Q6K_ID }>,
        QuantFormat::Mxfp4 => avx2::dequantize_panel::<{ QuantFormat::MXFP4_ID }>,
    }
}

thread_local! {
    /// A task's panels in f32 (`k * 16` floats each: one on AVX2, up to four on AVX-512) per
    /// worker, kept between calls.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Where one register tile reads its activations and writes its outputs: what the
/// microkernels of every instruction set ([`avx2`], [`avx512`]) are handed.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Tile {
    /// Row 0 of the tile's activations; row `r` starts at `x + r * k`.
    pub x: *const f32,
    pub k: usize,
    /// Output of row 0, first column of the tile; row `r` at `out + r * ldo`.
    pub out: *mut f32,
    pub ldo: usize,
    /// Columns of the tile that exist (the rest is padding of the last panel).
    pub valid: usize,
}

/// Calls the microkernel specialised for `rows` (1..=MR) and `count` panels (4, 2 or 1; a
/// group cut short at the matrix edge goes one panel at a time).
macro_rules! tiles {
    // A quantized kernel: its format's const id goes after the tile's shape.
    ($t:expr, $rows:expr, $count:expr, $stride:expr, $w:expr, $module:ident::$kernel:ident::<$fmt:tt>, [$($mr:literal)*]) => {
        match ($rows, $count) {
            $(($mr, 4) => $module::$kernel::<$mr, 4, $fmt>(&$t, $w, $stride),
              ($mr, 2) => $module::$kernel::<$mr, 2, $fmt>(&$t, $w, $stride),
              ($mr, 1) => $module::$kernel::<$mr, 1, $fmt>(&$t, $w, $stride),)*
            (_, c) => {
                for p in 0..c {
                    let t = Tile {
                        out: $t.out.add(p * PANEL),
                        valid: $t.valid.saturating_sub(p * PANEL).min(PANEL),
                        ..$t
                    };
                    match $rows {
                        $($mr => $module::$kernel::<$mr, 1, $fmt>(&t, $w.add(p * $stride), $stride),)*
                        _ => unreachable!("rows is 1..=MR"),
                    }
                }
            }
        }
    };
    ($t:expr, $rows:expr, $count:expr, $stride:expr, $w:expr, $module:ident::$kernel:ident, [$($mr:literal)*]) => {
        match ($rows, $count) {
            $(($mr, 4) => $module::$kernel::<$mr, 4>(&$t, $w, $stride),
              ($mr, 2) => $module::$kernel::<$mr, 2>(&$t, $w, $stride),
              ($mr, 1) => $module::$kernel::<$mr, 1>(&$t, $w, $stride),)*
            (_, c) => {
                for p in 0..c {
                    let t = Tile {
                        out: $t.out.add(p * PANEL),
                        valid: $t.valid.saturating_sub(p * PANEL).min(PANEL),
                        ..$t
                    };
                    match $rows {
                        $($mr => $module::$kernel::<$mr, 1>(&t, $w.add(p * $stride), $stride),)*
                        _ => unreachable!("rows is 1..=MR"),
                    }
                }
            }
        }
    };
}

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
        Self {
            n,
            k,
            panels: Panels::F32(panels),
            amx: None,
            amx_int8: false,
        }
    }

    /// Regroups a GGUF matrix (`data`: `[n, k]` weights as rows of `format` blocks) into
    /// quantized panels; `None` when `k` is not a whole number of blocks or `data` has the
    /// wrong size.
    pub fn pack_quantized(format: QuantFormat, data: &[u8], n: usize, k: usize) -> Option<Self> {
        let row_bytes = k / format.block_weights() * format.block_bytes();
        if data.len() != n * row_bytes {
            return None;
        }
        Self::pack_quantized_rows(format, n, k, |r| &data[r * row_bytes..][..row_bytes])
    }

    /// Like [`Self::pack_quantized`], with output feature `r`'s GGUF blocks at `row(r)`: rows
    /// can come from several tensors, or in another order, straight from a mapped file.
    /// `None` when `k` is not a whole number of blocks or a row has the wrong size.
    pub fn pack_quantized_rows<'a>(
        format: QuantFormat,
        n: usize,
        k: usize,
        row: impl Fn(usize) -> &'a [u8] + Sync,
    ) -> Option<Self> {
        let layout = format.panel_layout();
        if k == 0 || !k.is_multiple_of(layout.super_rows) {
            return None;
        }
        let gb = format.block_bytes();
        let nb = k / layout.super_rows;
        if (0..n).any(|r| row(r).len() != nb * gb) {
            return None;
        }
        let pb = layout.block_bytes();
        let panel_bytes = nb * pb;
        let num_panels = n.div_ceil(PANEL);
        let mut bytes = vec![0u8; num_panels * panel_bytes];
        bytes
            .par_chunks_mut(panel_bytes)
            .enumerate()
            .for_each(|(p, panel)| {
                for col in 0..PANEL.min(n - p * PANEL) {
                    let src = row(p * PANEL + col);
                    for (kb, block) in src.chunks_exact(gb).enumerate() {
                        let b = format.decode(block);
                        let dst = &mut panel[kb * pb..][..pb];
                        match layout.scale {
                            ScaleKind::F16 => {
                                dst[2 * col..2 * col + 2].copy_from_slice(&b.d.to_le_bytes())
                            }
                            ScaleKind::E8M0 => dst[col] = b.d as u8,
                        }
                        if layout.min != crate::quant_format::MinKind::None {
                            let at = layout.min_at() + 2 * col;
                            dst[at..at + 2].copy_from_slice(&b.m.to_le_bytes());
                        }
                        if layout.sub_scales {
                            for sub in 0..layout.subs() {
                                dst[layout.scales_at() + sub * PANEL + col] = b.sc[sub] as u8;
                                if layout.min == crate::quant_format::MinKind::SubScaled {
                                    dst[layout.mins_at() + sub * PANEL + col] = b.mn[sub] as u8;
                                }
                            }
                        }
                        let quants = &mut dst[layout.quants_at()..];
                        if layout.nibbles {
                            for pair in 0..layout.super_rows / 2 {
                                quants[pair * PANEL + col] =
                                    (b.q[2 * pair] as u8 & 0x0F) | ((b.q[2 * pair + 1] as u8) << 4);
                            }
                        } else {
                            for (kk, &q) in b.q[..layout.super_rows].iter().enumerate() {
                                quants[kk * PANEL + col] = q as u8;
                            }
                        }
                    }
                }
            });
        Some(Self {
            n,
            k,
            panels: Panels::Quant {
                format,
                bytes,
                panel_bytes,
            },
            amx: None,
            amx_int8: false,
        })
    }

    /// The quantized format of the panels, `None` for f32 panels.
    pub fn format(&self) -> Option<QuantFormat> {
        match &self.panels {
            Panels::F32(_) => None,
            Panels::Quant { format, .. } => Some(*format),
        }
    }

    /// Bytes the panels take.
    pub fn bytes(&self) -> usize {
        match &self.panels {
            Panels::F32(p) => p.len() * 4,
            Panels::Quant { bytes, .. } => bytes.len(),
        }
    }

    /// Whether the matrix still holds its panels, so [`Self::dequantize_column`] can read
    /// them: false once [`Self::use_amx_only`] has freed f32 panels (the tiles keep each weight
    /// as two bf16 terms, not its f32 value).
    pub fn holds_panels(&self) -> bool {
        match &self.panels {
            Panels::F32(p) => p.len() == self.n.div_ceil(PANEL) * self.k * PANEL,
            Panels::Quant { .. } => true,
        }
    }

    /// Output feature `c`'s weights, dequantized with the reference arithmetic (the values the
    /// kernels multiply by): an embedding row read from an lm_head's panels. Panics where the
    /// panels are gone ([`Self::holds_panels`]).
    pub fn dequantize_column(&self, c: usize, out: &mut [f32]) {
        assert!(
            self.holds_panels(),
            "the f32 panels were freed for AMX tiles"
        );
        assert!(c < self.n, "column {c} of {}", self.n);
        assert_eq!(out.len(), self.k, "one column of k weights");
        let (p, col) = (c / PANEL, c % PANEL);
        match &self.panels {
            Panels::F32(panels) => {
                let panel = &panels[p * self.k * PANEL..][..self.k * PANEL];
                for (kk, o) in out.iter_mut().enumerate() {
                    *o = panel[kk * PANEL + col];
                }
            }
            Panels::Quant {
                format,
                bytes,
                panel_bytes,
            } => {
                use crate::quant_format::{weight, MinKind};
                let layout = format.panel_layout();
                let pb = layout.block_bytes();
                let f16 =
                    |b: &[u8], at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
                let panel = &bytes[p * panel_bytes..][..*panel_bytes];
                for (sb, out) in out.chunks_exact_mut(layout.super_rows).enumerate() {
                    let blk = &panel[sb * pb..][..pb];
                    let d = match layout.scale {
                        ScaleKind::F16 => f16(blk, 2 * col),
                        ScaleKind::E8M0 => crate::quant_format::e8m0_half(blk[col]),
                    };
                    let m = if layout.min == MinKind::None {
                        0.0
                    } else {
                        f16(blk, layout.min_at() + 2 * col)
                    };
                    let quants = &blk[layout.quants_at()..];
                    for (sub, out) in out.chunks_exact_mut(layout.sub_rows).enumerate() {
                        let (s, m) = if layout.sub_scales {
                            let sc = blk[layout.scales_at() + sub * PANEL + col] as i8;
                            let mn = if layout.min == MinKind::SubScaled {
                                blk[layout.mins_at() + sub * PANEL + col] as i8
                            } else {
                                0
                            };
                            (d * sc as f32, m * mn as f32)
                        } else {
                            (d, m)
                        };
                        for (i, o) in out.iter_mut().enumerate() {
                            let kk = sub * layout.sub_rows + i;
                            let q = if layout.nibbles {
                                let byte = quants[kk / 2 * PANEL + col];
                                (if kk % 2 == 0 { byte & 0x0F } else { byte >> 4 }) as i8
                            } else {
                                quants[kk * PANEL + col] as i8
                            };
                            *o = weight(layout, q, s, m);
                        }
                    }
                }
            }
        }
    }

    pub fn out_features(&self) -> usize {
        self.n
    }

    /// Lets steps of at least `min_rows` rows run on AMX tiles, whose split-bf16 products
    /// carry a relative error of about 2^-16 (f32: 2^-24), at several times the f32 kernel's
    /// rate. The weights are tiled now (4 bytes each). Returns whether AMX will be used: the
    /// CPU must have AMX-BF16, `k` be a multiple of 32 and the panels not be MXFP4.
    pub fn use_amx_from(&mut self, min_rows: usize) -> bool {
        self.enable_amx(min_rows, true)
    }

    /// Like [`Self::use_amx_from`], but dequantizes the panels into tiles at every call instead
    /// of holding them: reads the quantized panels' bytes only.
    pub fn use_amx_dequantizing_from(&mut self, min_rows: usize) -> bool {
        self.enable_amx(min_rows, false)
    }

    fn enable_amx(&mut self, min_rows: usize, pretile: bool) -> bool {
        // Every panel format but MXFP4 is tiled, dequantized in the tile kernel (which has no
        // E8M0 scales or E2M1 codes yet).
        #[cfg(target_arch = "x86_64")]
        if available()
            && crate::cpu::amx::available()
            && self.k.is_multiple_of(32)
            && self.format() != Some(QuantFormat::Mxfp4)
        {
            let tiles =
                pretile.then(|| crate::cpu::amx::tile_all(self.amx_source(), self.n, self.k));
            self.amx = Some((min_rows, tiles));
            return true;
        }
        let _ = (min_rows, pretile);
        false
    }

    #[cfg(target_arch = "x86_64")]
    fn amx_source(&self) -> crate::cpu::amx::Source<'_> {
        use crate::cpu::amx::Source;
        match &self.panels {
            Panels::F32(p) => Source::F32(p),
            Panels::Quant {
                format,
                bytes,
                panel_bytes,
            } => Source::Quant {
                format: *format,
                bytes,
                panel_bytes: *panel_bytes,
            },
        }
    }

    /// Lets steps of at least `min_rows` rows run on AMX tiles as int8: quantize the
    /// activations to int8 per row and 256 inputs and multiply the K-quant panels' integers
    /// on int8 tiles: llama.cpp's arithmetic (a result differs from `f32`'s by the activations'
    /// rounding, up to 2^-8 of each super-block's largest), at about twice the split-bf16
    /// kernels' speed. Returns whether it will: the matrix must already dequantize its panels
    /// on AMX, be Q4_K, Q5_K or Q6_K with `k` a multiple of 256, and the CPU have AMX-INT8
    /// and AVX-512 VBMI.
    pub fn use_amx_int8(&mut self, min_rows: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let (Some((rows, None)), Panels::Quant { format, .. }) = (&mut self.amx, &self.panels) {
            if crate::cpu::amx::int8_supports(*format) && self.k.is_multiple_of(256) {
                *rows = min_rows;
                self.amx_int8 = true;
            }
        }
        let _ = min_rows;
        self.amx_int8
    }

    /// Whether [`Self::use_amx_int8`] took.
    pub fn uses_amx_int8(&self) -> bool {
        self.amx_int8
    }

    /// Runs every step on AMX tiles and frees the f32 panels: for weights with no quantized
    /// panels to read at small steps, where holding both would double the memory. At one row
    /// the tiles cost what the panels do (both read 4 bytes per weight), and a row's result
    /// no longer depends on the step's size at all. Returns false (keeping the panels) where
    /// AMX is missing.
    pub fn use_amx_only(&mut self) -> bool {
        if !self.use_amx_from(1) {
            return false;
        }
        if let Panels::F32(p) = &mut self.panels {
            *p = Vec::new();
        }
        true
    }

    pub fn in_features(&self) -> usize {
        self.k
    }

    /// `out[m, n] = x[m, k] . W^T`. Panics if the sizes disagree or the CPU lacks the kernel
    /// (check [`available`] first).
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        assert_eq!(out.len(), m * self.n, "output size");
        self.matmul_into(x, m, out, self.n, 0);
    }

    /// `out[r * ldo + col0 + c] = (x[m, k] . W^T)[r, c]`: this matrix's columns of a wider
    /// output, as when projections of different formats share one output. Panics as
    /// [`Self::matmul`] does, or if the columns do not fit in `ldo`.
    pub fn matmul_into(&self, x: &[f32], m: usize, out: &mut [f32], ldo: usize, col0: usize) {
        assert!(available(), "the packed kernel needs AVX2, FMA and F16C");
        assert_eq!(x.len(), m * self.k, "activation size");
        assert!(col0 + self.n <= ldo, "columns past the output row");
        assert_eq!(out.len(), m * ldo, "output size");
        #[cfg(target_arch = "x86_64")]
        if let Some((_, tiles)) = self.amx.as_ref().filter(|(min, _)| m >= *min) {
            if self.amx_int8 {
                crate::cpu::amx::matmul_int8(
                    self.amx_source(),
                    self.n,
                    self.k,
                    x,
                    m,
                    out,
                    ldo,
                    col0,
                );
                return;
            }
            let weights = match tiles {
                Some(t) => crate::cpu::amx::Weights::Tiles(t),
                None => crate::cpu::amx::Weights::Dequantize(self.amx_source()),
            };
            crate::cpu::amx::matmul(weights, self.n, self.k, x, m, out, ldo, col0);
            return;
        }
        let num_panels = self.n.div_ceil(PANEL);
        // Four panels (64 columns) per task unless that leaves too few tasks to share, or a
        // count the threads cannot share evenly: 9 tasks on 2 threads finish after 5 tasks'
        // time, not 4.5 (SmolLM2's 576-column projections).
        let threads = rayon::current_num_threads();
        let shares_evenly = |group: usize| {
            let tasks = num_panels.div_ceil(group);
            tasks >= 4 * threads && (tasks.is_multiple_of(threads) || tasks >= 16 * threads)
        };
        let group = [4, 2].into_iter().find(|&g| shares_evenly(g)).unwrap_or(1);
        let out = DisjointSlice::new(out);
        (0..num_panels.div_ceil(group))
            .into_par_iter()
            .for_each(|g| {
                let first = g * group;
                let count = group.min(num_panels - first);
                // SAFETY: the kernel's CPU features checked above; each task writes only columns of
                // its own panels, and all pointers stay within `x`, `self.panels` and `out` by the
                // size checks.
                unsafe { self.columns(x, m, first, count, out, ldo, col0) };
            });
    }

    /// Computes panels `first..first + count` of every row of `x` into `out` (rows `ldo` apart,
    /// this matrix's column 0 at `col0`).
    ///
    /// # Safety
    /// The CPU has the packed kernel ([`available`]); `x` holds `m * k` values and `out`
    /// `m * ldo`, with `col0 + n <= ldo`; no other task writes these panels' columns of `out`
    /// meanwhile.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn columns(
        &self,
        x: &[f32],
        m: usize,
        first: usize,
        count: usize,
        out: DisjointSlice<'_, f32>,
        ldo: usize,
        col0: usize,
    ) {
        let wide = avx512();
        // SAFETY: in bounds of `x`, the panels and `out` by the caller's sizes (at most `first + count`
        // panels); the microkernels' CPU features and the exclusive columns are the caller's promise.
        unsafe {
            if !wide {
                return self.columns_avx2(x, m, first, count, out, ldo, col0);
            }
            let col = first * PANEL;
            let valid = (self.n - col).min(count * PANEL);
            // The tile of this task's columns from activation row `row`.
            let tile_at = |row: usize| Tile {
                x: x.as_ptr().add(row * self.k),
                k: self.k,
                out: out.as_mut_ptr().add(row * ldo + col0 + col),
                ldo,
                valid,
            };
            if let (
                Panels::Quant {
                    format,
                    bytes,
                    panel_bytes,
                },
                true,
            ) = (&self.panels, m >= DEQUANTIZE_ONCE_MIN_ROWS)
            {
                // Dequantize the task's panels once into f32 and run every six rows on the f32
                // tile: in registers each six rows would redo that work (as many instructions
                // as their FMAs at four panels a tile).
                let dequantize = panel_to_f32(*format);
                let stride = self.k * PANEL;
                // Panels dequantized and multiplied together: four feed the widest tile, but
                // past L2 they are slower than fewer (four of Qwen2.5-1.5B's down projection
                // are 2.3 MB).
                let together = [4, 2, 1]
                    .into_iter()
                    .find(|&g| g * stride * 4 <= DEQUANTIZED_BYTES)
                    .unwrap_or(1)
                    .min(count);
                return SCRATCH.with(|scratch| {
                    let scratch = &mut *scratch.borrow_mut();
                    let scratch = crate::cpu::scratch(scratch, together * stride);
                    for pass in (0..count).step_by(together) {
                        let panels = together.min(count - pass);
                        for p in 0..panels {
                            dequantize(
                                bytes.as_ptr().add((first + pass + p) * panel_bytes),
                                self.k,
                                scratch.as_mut_ptr().add(p * stride),
                            );
                        }
                        let w = scratch.as_ptr();
                        let mut row = 0;
                        while row < m {
                            let rows = MR.min(m - row);
                            let t = tile_at(row);
                            let t = Tile {
                                out: t.out.add(pass * PANEL),
                                valid: t.valid.saturating_sub(pass * PANEL),
                                ..t
                            };
                            tiles!(t, rows, panels, stride, w, avx512::tile, [1 2 3 4 5 6]);
                            row += rows;
                        }
                    }
                });
            }
            let mut row = 0;
            while row < m {
                let rows = MR.min(m - row);
                let t = tile_at(row);
                match &self.panels {
                    Panels::F32(p) => {
                        let w = p.as_ptr().add(first * self.k * PANEL);
                        tiles!(t, rows, count, self.k * PANEL, w, avx512::tile, [1 2 3 4 5 6]);
                    }
                    Panels::Quant {
                        format,
                        bytes,
                        panel_bytes,
                    } => {
                        let w = bytes.as_ptr().add(first * panel_bytes);
                        let stride = *panel_bytes;
                        // The legacy layouts on their own kernel, the others by their layout.
                        macro_rules! quant {
                            ($kernel:ident, $id:ident) => {
                                tiles!(t, rows, count, stride, w, avx512::$kernel::<{ QuantFormat::$id }>, [1 2 3 4 5 6])
                            };
                        }
                        match *format {
                            QuantFormat::Q4_0 => quant!(legacy_qtile, Q4_0_ID),
                            QuantFormat::Q4_1 => quant!(legacy_qtile, Q4_1_ID),
                            QuantFormat::Q8_0 => quant!(legacy_qtile, Q8_0_ID),
                            QuantFormat::Q5_0 => quant!(qtile, Q5_0_ID),
                            QuantFormat::Q5_1 => quant!(qtile, Q5_1_ID),
                            QuantFormat::Q4K => quant!(qtile, Q4K_ID),
                            QuantFormat::Q5K => quant!(qtile, Q5K_ID),
                            QuantFormat::Q6K => quant!(qtile, Q6K_ID),
                            QuantFormat::Mxfp4 => quant!(qtile, MXFP4_ID),
                        }
                    }
                }
                row += rows;
            }
        }
    }

    /// [`Self::columns`] on the AVX2 kernels: six rows of one panel, or up to three rows of two
    /// panels (a decode step's single row keeps four FMA chains in flight).
    ///
    /// # Safety
    /// As [`Self::columns`].
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn columns_avx2(
        &self,
        x: &[f32],
        m: usize,
        first: usize,
        count: usize,
        out: DisjointSlice<'_, f32>,
        ldo: usize,
        col0: usize,
    ) {
        type Kernel = unsafe fn(&Tile, *const u8, usize);
        macro_rules! quant {
            ($id:expr, $rows:expr, $nr:expr) => {
                match ($rows, $nr) {
                    (1, 2) => avx2::qtile::<1, 2, { $id }> as Kernel,
                    (2, 2) => avx2::qtile::<2, 2, { $id }>,
                    (3, 2) => avx2::qtile::<3, 2, { $id }>,
                    (1, _) => avx2::qtile::<1, 1, { $id }>,
                    (2, _) => avx2::qtile::<2, 1, { $id }>,
                    (3, _) => avx2::qtile::<3, 1, { $id }>,
                    (4, _) => avx2::qtile::<4, 1, { $id }>,
                    (5, _) => avx2::qtile::<5, 1, { $id }>,
                    _ => avx2::qtile::<6, 1, { $id }>,
                }
            };
        }
        /// The f32 kernel behind the quantized kernels' signature.
        ///
        /// # Safety
        /// As [`avx2::tile`], with `w` the panels' first float and `stride` in bytes.
        unsafe fn f32_tile<const MR: usize, const NR: usize>(
            t: &Tile,
            w: *const u8,
            stride: usize,
        ) {
            // SAFETY: forwarded: the caller makes [`avx2::tile`]'s promise.
            unsafe { avx2::tile::<MR, NR>(t, w as *const f32, stride / 4) }
        }
        let kernel = |rows: usize, nr: usize| -> Kernel {
            match &self.panels {
                Panels::F32(_) => match (rows, nr) {
                    (1, 2) => f32_tile::<1, 2>,
                    (2, 2) => f32_tile::<2, 2>,
                    (3, 2) => f32_tile::<3, 2>,
                    (1, _) => f32_tile::<1, 1>,
                    (2, _) => f32_tile::<2, 1>,
                    (3, _) => f32_tile::<3, 1>,
                    (4, _) => f32_tile::<4, 1>,
                    (5, _) => f32_tile::<5, 1>,
                    _ => f32_tile::<6, 1>,
                },
                Panels::Quant { format, .. } => match *format {
                    QuantFormat::Q4_0 => quant!(QuantFormat::Q4_0_ID, rows, nr),
                    QuantFormat::Q4_1 => quant!(QuantFormat::Q4_1_ID, rows, nr),
                    QuantFormat::Q5_0 => quant!(QuantFormat::Q5_0_ID, rows, nr),
                    QuantFormat::Q5_1 => quant!(QuantFormat::Q5_1_ID, rows, nr),
                    QuantFormat::Q8_0 => quant!(QuantFormat::Q8_0_ID, rows, nr),
                    QuantFormat::Q4K => quant!(QuantFormat::Q4K_ID, rows, nr),
                    QuantFormat::Q5K => quant!(QuantFormat::Q5K_ID, rows, nr),
                    QuantFormat::Q6K => quant!(QuantFormat::Q6K_ID, rows, nr),
                    QuantFormat::Mxfp4 => quant!(QuantFormat::MXFP4_ID, rows, nr),
                },
            }
        };
        let (base, stride) = match &self.panels {
            Panels::F32(p) => (p.as_ptr() as *const u8, self.k * PANEL * 4),
            Panels::Quant {
                bytes, panel_bytes, ..
            } => (bytes.as_ptr(), *panel_bytes),
        };
        // SAFETY: every tile lies inside panels `first..first + count` and rows `0..m` (the
        // caller's sizes); the scratch holds `k * 16` floats; the kernels' CPU features are the
        // caller's promise.
        unsafe {
            if let (Panels::Quant { format, .. }, true) =
                (&self.panels, m >= DEQUANTIZE_ONCE_MIN_ROWS)
            {
                let dequantize = panel_to_f32(*format);
                SCRATCH.with(|scratch| {
                    let scratch = &mut *scratch.borrow_mut();
                    let scratch = crate::cpu::scratch(scratch, self.k * PANEL);
                    for p in first..first + count {
                        dequantize(base.add(p * stride), self.k, scratch.as_mut_ptr());
                        let col = p * PANEL;
                        let mut row = 0;
                        while row < m {
                            let rows = MR.min(m - row);
                            let t = Tile {
                                x: x.as_ptr().add(row * self.k),
                                k: self.k,
                                out: out.as_mut_ptr().add(row * ldo + col0 + col),
                                ldo,
                                valid: (self.n - col).min(PANEL),
                            };
                            let w = scratch.as_ptr() as *const u8;
                            match rows {
                                1 => f32_tile::<1, 1>(&t, w, 0),
                                2 => f32_tile::<2, 1>(&t, w, 0),
                                3 => f32_tile::<3, 1>(&t, w, 0),
                                4 => f32_tile::<4, 1>(&t, w, 0),
                                5 => f32_tile::<5, 1>(&t, w, 0),
                                _ => f32_tile::<6, 1>(&t, w, 0),
                            }
                            row += rows;
                        }
                    }
                });
                return;
            }
            let mut row = 0;
            while row < m {
                let rows = MR.min(m - row);
                let mut p = first;
                while p < first + count {
                    let nr = if rows <= 3 && first + count - p >= 2 {
                        2
                    } else {
                        1
                    };
                    let col = p * PANEL;
                    let t = Tile {
                        x: x.as_ptr().add(row * self.k),
                        k: self.k,
                        out: out.as_mut_ptr().add(row * ldo + col0 + col),
                        ldo,
                        valid: (self.n - col).min(nr * PANEL),
                    };
                    kernel(rows, nr)(&t, base.add(p * stride), stride);
                    p += nr;
                }
                row += rows;
            }
        }
    }

    /// # Safety
    /// Never called: [`available`] is false off x86_64.
    #[cfg(not(target_arch = "x86_64"))]
    #[allow(clippy::too_many_arguments)]
    unsafe fn columns(
        &self,
        _: &[f32],
        _: usize,
        _: usize,
        _: usize,
        _: DisjointSlice<'_, f32>,
        _: usize,
        _: usize,
    ) {
        unreachable!("available() is false off x86_64")
    }
}

#[cfg(test)]
mod tests;
