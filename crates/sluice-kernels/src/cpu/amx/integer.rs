//! Quantized weights on AMX tiles as their integers, each 32-k step's product scaled after it.
//!
//! Every format but Q6_K scales its weights per block of 32 k (a Q4_K or Q5_K sub-block, a
//! legacy block): `w = s * q + o`, with `q` an integer of at most 8 bits, which bf16 holds
//! exactly, and `s` and `o` per column and block (`o = 0`, `+m` or `-dmin * mn`). So
//! `x . w = sum_j (s_j * (x . q)_j + o_j * S_j)`, where `(x . q)_j` is block j's product and
//! `S_j` the sum of x over block j, and neither `q` nor the products need splitting:
//!
//! - a 32-k step of a 16x16 output tile is two products, `x_hi . q + x_lo . q`, instead of the
//!   split kernel's three (`x_hi . w_hi + x_lo . w_hi + x_hi . w_lo`);
//! - a weight tile is the integers converted to bf16 (2 bytes a weight written), not `s * q +
//!   o` formed in f32 and split (4 bytes a weight). Dequantizing was about 40% of a 64-row
//!   decode step of Qwen2.5-1.5B Q4_K_M on the split kernel.
//!
//! The price is that each step's 16x16 product is stored and added to f32 sums held in
//! registers, `acc += s_j * T_j` (16 FMAs a step). The minimums' part, `sum_j o_j * S_j`, is a
//! product over the blocks: the split kernel ([`accumulate`]) multiplies the activations'
//! block sums (split by [`split_rows`]) by the minimums (split here), once per output block,
//! and its result seeds the sums.
//!
//! That trade pays only where dequantizing is a large share of the work, at few rows per
//! weight: steps of up to [`MAX_ROWS`] rows, of the formats [`supports`] takes.
//!
//! Precision: `x_hi + x_lo` carries x to about 2^-17 of itself and `q` is exact, so each
//! block's product is at least as exact as the split kernel's; the sums then add the scaled
//! blocks in f32 (about 1e-6 of `sum |x w|` measured, against the split kernel's 2^-16). A
//! row's result still depends only on that row and the weights.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

use super::{
    accumulate_rows, emit_pair, interleave, pair_integers, store, zero_sums, Chunk, A_STEP_BYTES,
    BLOCK_M, GROUP_N, PASS_STEPS, PASS_TILE_BYTES, STEP_BYTES, TILE_BYTES, TILE_K, TILE_M, TILE_N,
};
use crate::cpu::dequant_avx512::{f16x16, sub_scales};
use crate::cpu::{scratch, CacheLine};
use crate::disjoint::DisjointSlice;
use crate::quant_format::{MinKind, PanelLayout, QuantFormat};

/// Steps of at most this many rows take this path; larger ones the split kernel. Each step's
/// stored and scaled products cost more than the third product they save, so the path pays
/// only where dequantizing is a large share, at few rows per weight. On the AMX host
/// (Qwen2.5-1.5B's [1536] x [1536, 17920] Q4_K, ms per call, alternated runs): 32 rows
/// 4.42/4.38 -> 3.26/3.15, 64 rows 6.25/6.12 -> 5.57/5.28, 512 rows 32.9/33.0 -> 34.8/36.8.
pub(super) const MAX_ROWS: usize = 64;

/// Bytes of a group's integer tiles per 32-k step: the tiles of columns 0-15 and 16-31.
const Q_STEP_BYTES: usize = 2 * TILE_BYTES;

thread_local! {
    /// Per worker: a task's integer tiles over one pass's steps.
    static INTEGER_TILES: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
    /// Per worker: a task's scales (f32, per group `[step][32 columns]`).
    static SCALES: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
    /// Per worker: a task's minimums, split into tiles (per group `k / 32 / 32` rounded up
    /// steps of [`STEP_BYTES`]).
    static MINIMUMS: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
    /// Per worker: a task's 32x32 sums per row block and column group, between passes.
    static BLOCK_OUT: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
}

/// Quantized panels (see `gemm::Panels::Quant`) of a format this path takes.
#[derive(Clone, Copy)]
pub(super) struct Panels<'a> {
    pub(super) format: QuantFormat,
    pub(super) bytes: &'a [u8],
    pub(super) panel_bytes: usize,
}

/// Whether a format takes this path: one read through its panel layout (the K-quants, Q5_0,
/// Q5_1), whose split dequantizer is the costly one, that scales its weights per 32 k or more
/// (not Q6_K's 16). The legacy layouts' own split dequantizer is cheap enough that this path
/// measured level or slower (SmolLM2's Q4_1, 64 rows: 73.9/74.4 -> 74.2/76.9 ms a step).
/// Not MXFP4, which no AMX path reads (`PackedMatrix::use_amx_from` declines it).
pub(crate) fn supports(format: QuantFormat) -> bool {
    !format.is_legacy_layout()
        && format != QuantFormat::Mxfp4
        && format.panel_layout().sub_rows >= TILE_K
}

/// Multiplies the chunk's rows by column groups `first .. first + count` and writes the valid
/// part of each 32x32 output block: the task's scales and minimums, the minimums' product
/// into each output block's sums, then passes of k as [`super::multiply_task`] makes them,
/// each dequantizing the groups' integer tiles of the pass and adding every 16x16 output
/// tile's scaled steps to its sums.
///
/// # Safety
/// The calling thread's tiles are configured ([`super::configure_tiles`]) and the CPU has
/// AVX-512F, BW, BF16 and F16C; `panels` holds a matrix of `chunk.k` input features and
/// `chunk.n` outputs in a format [`supports`] takes, `chunk.acts` the split rows and, for a
/// format with minimums, `chunk.block_sums` their block sums; `out` is at least
/// `[chunk.first_row + chunk.rows, chunk.ldo]` with `chunk.col0 + chunk.n <= chunk.ldo`, and
/// no other task writes these groups' columns of these rows meanwhile.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,f16c")]
pub(super) unsafe fn multiply_task(
    panels: Panels<'_>,
    chunk: &Chunk<'_>,
    first: usize,
    count: usize,
    out: DisjointSlice<'_, f32>,
) {
    let l = panels.format.panel_layout();
    let steps = chunk.k / TILE_K;
    // Steps of the minimums' product: one per 32 blocks of k.
    let min_steps = steps.div_ceil(TILE_K);
    let blocks = chunk.padded / BLOCK_M;
    let block_floats = BLOCK_M * GROUP_N;
    // Steps of up to 64 rows (one or two blocks): passes as long as L2 holds their integer
    // tiles, as the split kernel makes them for such steps.
    let pass_steps = (PASS_TILE_BYTES / (count * Q_STEP_BYTES)).max(PASS_STEPS);
    // SAFETY: the tile configuration, the CPU features, the operands' sizes and the exclusive
    // columns are the caller's promise; every buffer is resized to what it is addressed with
    // below, and every store to `out` is masked to the task's valid rows and columns.
    unsafe {
        INTEGER_TILES.with(|tiles| {
            SCALES.with(|scales| {
                MINIMUMS.with(|minimums| {
                    BLOCK_OUT.with(|sums| {
                        let mut tiles = tiles.borrow_mut();
                        let tiles = CacheLine::bytes_mut(scratch(
                            &mut tiles,
                            CacheLine::count(count * pass_steps.min(steps) * Q_STEP_BYTES),
                        ));
                        let mut scales = scales.borrow_mut();
                        let scales = scratch(&mut scales, CacheLine::count(count * steps * 128))
                            .as_mut_ptr() as *mut f32;
                        let mut minimums = minimums.borrow_mut();
                        let min_bytes = min_steps * STEP_BYTES;
                        let minimums = CacheLine::bytes_mut(scratch(
                            &mut minimums,
                            if l.min == MinKind::None {
                                0
                            } else {
                                CacheLine::count(count * min_bytes)
                            },
                        ));
                        let mut sums = sums.borrow_mut();
                        let sums = scratch(
                            &mut sums,
                            CacheLine::count(blocks * count * block_floats * 4),
                        )
                        .as_mut_ptr() as *mut f32;

                        for i in 0..count {
                            let mins = if l.min == MinKind::None {
                                None
                            } else {
                                Some(&mut minimums[i * min_bytes..][..min_bytes])
                            };
                            scales_of(
                                panels,
                                chunk.k,
                                first + i,
                                Some(scales.add(i * steps * GROUP_N)),
                                mins,
                            );
                        }
                        seed_sums(
                            sums,
                            (l.min != MinKind::None).then_some(&*minimums),
                            chunk.block_sums,
                            count,
                            chunk.k,
                            chunk.rows,
                            chunk.padded,
                        );

                        let acts = CacheLine::bytes(chunk.acts).as_ptr();
                        // A step's 16x16 product, stored for the scaling.
                        let mut product = [CacheLine::default(); TILE_M];
                        let product = product.as_mut_ptr() as *mut f32;
                        for s0 in (0..steps).step_by(pass_steps) {
                            let ns = pass_steps.min(steps - s0);
                            let last = s0 + ns == steps;
                            let pass_bytes = ns * Q_STEP_BYTES;
                            for i in 0..count {
                                let part = tiles.as_mut_ptr().add(i * pass_bytes);
                                integers(panels, first + i, s0, ns, part);
                            }
                            for blk in 0..blocks {
                                let a = acts.add((blk * steps + s0) * A_STEP_BYTES);
                                for i in 0..count {
                                    let c = sums.add((blk * count + i) * block_floats);
                                    let q = tiles.as_ptr().add(i * pass_bytes);
                                    let s = scales.add((i * steps + s0) * GROUP_N);
                                    for (rt, ct) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                                        let r0 = blk * BLOCK_M + rt * TILE_M;
                                        let col = (first + i) * GROUP_N + ct * TILE_N;
                                        // Tiles of padding rows only (a step of 16 rows pads
                                        // its block to 32) or of columns past the matrix:
                                        // nothing to compute.
                                        if r0 >= chunk.rows || col >= chunk.n {
                                            continue;
                                        }
                                        let c = c.add(rt * TILE_M * GROUP_N + ct * TILE_N);
                                        let mut acc = [_mm512_setzero_ps(); TILE_M];
                                        for (r, acc) in acc.iter_mut().enumerate() {
                                            *acc = _mm512_loadu_ps(c.add(r * GROUP_N));
                                        }
                                        scaled_steps(
                                            &mut acc,
                                            a.add(rt * TILE_BYTES),
                                            q.add(ct * TILE_BYTES),
                                            s.add(ct * TILE_N),
                                            ns,
                                            product,
                                        );
                                        if !last {
                                            for (r, acc) in acc.iter().enumerate() {
                                                _mm512_storeu_ps(c.add(r * GROUP_N), *acc);
                                            }
                                            continue;
                                        }
                                        let mask = (u32::MAX >> (32 - TILE_N.min(chunk.n - col)))
                                            as __mmask16;
                                        let rows = TILE_M.min(chunk.rows - r0);
                                        for (r, acc) in acc.iter().take(rows).enumerate() {
                                            let dst = out.as_mut_ptr().add(
                                                (chunk.first_row + r0 + r) * chunk.ldo
                                                    + chunk.col0
                                                    + col,
                                            );
                                            _mm512_mask_storeu_ps(dst, mask, *acc);
                                        }
                                    }
                                }
                            }
                        }
                    })
                })
            })
        })
    }
}

/// Starts the sums of each 32x32 output block (per row block of `padded` rows, `count` column
/// groups, at `sums`) from its minimums' product: the activations' split sums per 32 k
/// (`block_sums`, [`super::split_rows`]'s layout) by each group's split minimums (`minimums`,
/// [`scales_of`]'s tiles, one group after another); zero without minimums.
///
/// # Safety
/// The thread's tiles are configured; `sums` holds `padded / 32 * count` blocks of 32x32 f32,
/// `minimums` `count` groups' tiles for `k` input features and `block_sums` the sums of
/// `padded` rows (`rows` of them valid).
pub(super) unsafe fn seed_sums(
    sums: *mut f32,
    minimums: Option<&[u8]>,
    block_sums: &[CacheLine],
    count: usize,
    k: usize,
    rows: usize,
    padded: usize,
) {
    let min_steps = (k / TILE_K).div_ceil(TILE_K);
    let block_floats = BLOCK_M * GROUP_N;
    // SAFETY: the sizes and the tile configuration are the caller's promise.
    unsafe {
        for blk in 0..padded / BLOCK_M {
            for i in 0..count {
                let c = sums.add((blk * count + i) * block_floats);
                let Some(minimums) = minimums else {
                    std::ptr::write_bytes(c, 0, block_floats);
                    continue;
                };
                zero_sums();
                accumulate_rows(
                    minimums.as_ptr().add(i * min_steps * STEP_BYTES),
                    CacheLine::bytes(block_sums)
                        .as_ptr()
                        .add(blk * min_steps * A_STEP_BYTES),
                    min_steps,
                    rows - blk * BLOCK_M,
                );
                store(c, GROUP_N * 4);
            }
        }
    }
}

/// Adds `steps` 32-k steps of one 16x16 output tile to `acc`: per step, the activations' hi
/// and lo tiles (at `a`, [`A_STEP_BYTES`] a step) times the integer tile (at `q`,
/// [`Q_STEP_BYTES`] a step), stored at `product` and added times the step's 16 column scales
/// (at `s`, [`GROUP_N`] floats a step).
///
/// # Safety
/// The thread's tiles are configured and the CPU has AVX-512F; the operands hold `steps`
/// steps, `product` 1 KiB on a 64-byte boundary.
#[inline(always)]
unsafe fn scaled_steps(
    acc: &mut [__m512; TILE_M],
    a: *const u8,
    q: *const u8,
    s: *const f32,
    steps: usize,
    product: *mut f32,
) {
    // SAFETY: the caller's promise: tile loads read 16 rows of 64 bytes inside each step, the
    // store writes the 1 KiB at `product`.
    unsafe {
        for step in 0..steps {
            let a = a.add(step * A_STEP_BYTES);
            asm!(
                "tilezero tmm0",
                "tileloadd tmm4, [{hi} + {st}*1]",
                "tileloadd tmm6, [{q} + {st}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm5, [{lo} + {st}*1]",
                "tdpbf16ps tmm0, tmm5, tmm6",
                "tilestored [{p} + {st}*1], tmm0",
                hi = in(reg) a,
                lo = in(reg) a.add(2 * TILE_BYTES),
                q = in(reg) q.add(step * Q_STEP_BYTES),
                p = in(reg) product,
                st = in(reg) 64usize,
                options(nostack)
            );
            let scale = _mm512_loadu_ps(s.add(step * GROUP_N));
            for (r, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(_mm512_load_ps(product.add(r * TILE_N)), scale, *acc);
            }
        }
    }
}

/// The scale and the signed minimum (`w = s * q + o`) of the 16 columns of a panel at `panel`
/// in its 32-k block `step`.
///
/// # Safety
/// AVX-512F and F16C; `panel` is a panel of layout `l` covering block `step`.
#[inline(always)]
unsafe fn block_scales(l: PanelLayout, panel: *const u8, step: usize) -> (__m512, __m512) {
    // SAFETY: the panel-block is inside the panel: the caller's promise.
    unsafe {
        let per_block = l.super_rows / TILE_K;
        let blk = panel.add(step / per_block * l.block_bytes());
        let d = f16x16(blk);
        let m = if l.min == MinKind::None {
            _mm512_setzero_ps()
        } else {
            f16x16(blk.add(l.min_at()))
        };
        let (s, o) = sub_scales(l, blk, step % per_block * TILE_K / l.sub_rows, d, m);
        match l.min {
            MinKind::SubScaled => (s, _mm512_sub_ps(_mm512_setzero_ps(), o)),
            _ => (s, o),
        }
    }
}

/// Group `g`'s column scales into `scales` (`[k / 32][32]` f32), if asked, and, with
/// `minimums`, its signed minimums split into tiles: the `B` operand of the product
/// `sum_j S_j * o_j` over the blocks j, 32 blocks a step in [`STEP_BYTES`] (hi tiles of both
/// panels, then lo). A panel past the matrix's end has zero scales and minimums.
///
/// # Safety
/// AVX-512F, BW, BF16 and F16C; `panels` holds a matrix of `k` input features; `scales` (if
/// any) has `k` floats; `minimums` is `k / 32` rounded up to a multiple of 32, divided by 32,
/// steps.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,f16c")]
pub(super) unsafe fn scales_of(
    panels: Panels<'_>,
    k: usize,
    g: usize,
    scales: Option<*mut f32>,
    minimums: Option<&mut [u8]>,
) {
    let l = panels.format.panel_layout();
    let steps = k / TILE_K;
    let num_panels = panels.bytes.len() / panels.panel_bytes;
    let minimums = minimums.map(|m| {
        assert_eq!(m.len(), steps.div_ceil(TILE_K) * STEP_BYTES);
        m.as_mut_ptr()
    });
    // SAFETY: the CPU features are the caller's promise; panel `p < num_panels` is read inside
    // its bytes, `scales` written at `step < k / 32`, the minimums' tiles at pairs of steps
    // `< steps.div_ceil(32) * 32`.
    unsafe {
        for panel in 0..2 {
            let p = 2 * g + panel;
            let at = (p < num_panels).then(|| panels.bytes.as_ptr().add(p * panels.panel_bytes));
            let of = |step: usize| match at {
                Some(w) if step < steps => block_scales(l, w, step),
                _ => (_mm512_setzero_ps(), _mm512_setzero_ps()),
            };
            // Two blocks at a time: the minimums' tile rows interleave them.
            let pairs = match minimums {
                Some(_) => steps.div_ceil(TILE_K) * (TILE_K / 2),
                None => steps.div_ceil(2),
            };
            for pair in 0..pairs {
                let (even, odd) = (of(2 * pair), of(2 * pair + 1));
                for (step, (s, _)) in [(2 * pair, even), (2 * pair + 1, odd)] {
                    match scales {
                        Some(scales) if step < steps => {
                            _mm512_storeu_ps(scales.add(step * GROUP_N + panel * TILE_N), s)
                        }
                        _ => {}
                    }
                }
                if let Some(minimums) = minimums {
                    let (first, second) = interleave(even.1, odd.1);
                    emit_pair(
                        minimums,
                        pair / (TILE_K / 2),
                        panel,
                        pair % (TILE_K / 2),
                        first,
                        second,
                    );
                }
            }
        }
    }
}

/// Group `g`'s integer tiles of steps `step0 .. step0 + nsteps` into `tiles` ([`Q_STEP_BYTES`]
/// a step: the tile of panel `2g`, then of `2g + 1`; a panel past the end is zero).
///
/// # Safety
/// AVX-512F, BW and BF16; `panels` holds a matrix covering those steps, `tiles` `nsteps`
/// steps.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn integers(panels: Panels<'_>, g: usize, step0: usize, nsteps: usize, tiles: *mut u8) {
    let num_panels = panels.bytes.len() / panels.panel_bytes;
    // SAFETY: the CPU features and the sizes are the caller's promise.
    unsafe {
        for panel in 0..2 {
            let p = 2 * g + panel;
            let base = tiles.add(panel * TILE_BYTES);
            if p >= num_panels {
                for step in 0..nsteps {
                    std::ptr::write_bytes(base.add(step * Q_STEP_BYTES), 0, TILE_BYTES);
                }
                continue;
            }
            let w = panels.bytes.as_ptr().add(p * panels.panel_bytes);
            let of_format = match panels.format {
                QuantFormat::Q5_0 => panel_integers::<{ QuantFormat::Q5_0_ID }>,
                QuantFormat::Q5_1 => panel_integers::<{ QuantFormat::Q5_1_ID }>,
                QuantFormat::Q4K => panel_integers::<{ QuantFormat::Q4K_ID }>,
                QuantFormat::Q5K => panel_integers::<{ QuantFormat::Q5K_ID }>,
                other => unreachable!("{other:?} does not take the integer path (`supports`)"),
            };
            of_format(w, step0, nsteps, base);
        }
    }
}

/// One panel's integers of steps `step0 ..` as bf16 (exact: at most 8 bits), one tile a step
/// [`Q_STEP_BYTES`] apart from `base`, in AMX's pair-interleaved B layout.
///
/// # Safety
/// AVX-512F, BW and BF16; `w` holds one panel of `FMT` covering the steps, `base` `nsteps`
/// steps.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn panel_integers<const FMT: u8>(w: *const u8, step0: usize, nsteps: usize, base: *mut u8) {
    // SAFETY: every load is inside the panel-block of its super-block by the layout's offsets,
    // every store inside step `out_step < nsteps`: the caller's promise.
    unsafe {
        let l = const { QuantFormat::from_id(FMT).panel_layout() };
        let per_block = l.super_rows / TILE_K;
        // bf16 of `i - nibble_offset` at word i: a nibble's value by one permute.
        let mut table = [0u16; 32];
        for (i, t) in table.iter_mut().enumerate() {
            *t = ((i as i32 - l.nibble_offset) as f32)
                .to_bits()
                .wrapping_shr(16) as u16;
        }
        let table = _mm512_loadu_si512(table.as_ptr() as *const __m512i);
        for out_step in 0..nsteps {
            let step = step0 + out_step;
            let blk = w.add(step / per_block * l.block_bytes());
            let r0 = step % per_block * TILE_K;
            for pair in 0..TILE_K / 2 {
                let row = r0 + 2 * pair;
                let bf = if l.nibbles {
                    // Byte c holds column c's even k-row in its low nibble, the odd in its
                    // high one: dword c becomes the words (low, high), the tile row's order.
                    let q = _mm_loadu_si128(
                        blk.add(l.quants_at() + row / 2 * TILE_N) as *const __m128i
                    );
                    let z = _mm512_cvtepu8_epi32(q);
                    let words = _mm512_ternarylogic_epi32(
                        z,
                        _mm512_slli_epi32(z, 12),
                        _mm512_set1_epi32(0x000F_000F),
                        0xA8, // (a | b) & c
                    );
                    _mm512_permutexvar_epi16(words, table)
                } else {
                    let (first, second) = pair_integers::<FMT>(blk, row);
                    std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(
                        _mm512_cvtepi32_ps(second),
                        _mm512_cvtepi32_ps(first),
                    ))
                };
                _mm512_storeu_si512(
                    base.add(out_step * Q_STEP_BYTES + pair * 64) as *mut __m512i,
                    bf,
                );
            }
        }
    }
}
