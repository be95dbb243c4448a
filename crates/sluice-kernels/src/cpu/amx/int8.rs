//! K-quant weights on AMX int8 tiles against activations quantized to int8: the arithmetic of
//! llama.cpp's quantized kernels (and of `--weights quantized`), at AMX's int8 rate. Opt-in
//! ([`crate::cpu::gemm::PackedMatrix::use_amx_int8`]): a row's result then carries the int8
//! rounding of its activations, where the split kernel's is about 2^-16.
//!
//! Per row and super-block of 256 k, the activations are `x = xd * xq` with `xq` int8 (`xd =
//! max |x| / 127`, rounded to nearest even, as `int8_matmul`'s super-blocks). A K-quant weight
//! is `w = d * w' - dmin * mn` with `w' = sc * q` the sub-block's integer scale times the
//! integer (Q6_K: `sc * (q - 32)`, no minimum), `d` and `dmin` per column and super-block. So
//! `x . w = sum_sb xd * d * (xq . w') - sum_j dmin * mn_j * S_j`:
//!
//! - `xq . w'` is exact in int32 on the tiles. `w'` has up to 13 bits, so it is two int8
//!   limbs, `w' = 128 * hi + lo` with `lo` in `0..128`; a 64-k step of a 16x16 output tile is
//!   two products (`xq . hi`, `xq . lo`) into two int32 tiles, stored once per super-block and
//!   added to f32 sums times `xd * d`. (AMX multiplies int8 at the rate it multiplies bf16
//!   pairs, so a 64-k step costs what the split kernel's 32-k product of one term does.)
//! - The minimums' part takes the activations' exact sums `S_j` per 32 k, not their int8
//!   rounding: it is the integer path's split product ([`super::integer`]), which seeds the
//!   sums.
//!
//! The weights are dequantized per call, each 16-column panel's 64-k step into an `lo` and an
//! `hi` tile in AMX's B layout (a tile row holds 4 k of each of the 16 columns). The k order
//! inside a tile is whatever the panels unpack into cheaply, and the activation tiles are
//! laid out in the same order: tile row `2j + h` holds k `8j + h + 2t`, `t = 0..4`, of its step
//! (a Q4_K panel byte holds k `2p` and `2p + 1` in its nibbles).
//!
//! A row's result depends only on that row and the weights: batching stays invisible within
//! this path.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use rayon::prelude::*;

use super::integer::{scales_of, seed_sums, Panels};
use super::{
    block_sums_rows, for_each_chunk, run_tasks, BLOCK_M, GROUP_N, PASS_TILE_BYTES, STEP_BYTES,
    TILE_BYTES, TILE_K, TILE_M, TILE_N,
};
use crate::cpu::dequant_avx512::f16x16;
use crate::cpu::{scratch, CacheLine};
use crate::disjoint::DisjointSlice;
use crate::quant_format::{MinKind, QuantFormat};

/// k per int8 tile step: 16 tile rows of 4 bytes a column.
const STEP_K: usize = 64;
/// k per K-quant super-block, the span of one activation scale and one weight scale `d`.
const SUPER: usize = 256;
/// Tile steps per super-block.
const SUPER_STEPS: usize = SUPER / STEP_K;
/// Bytes of a 32-row block's activation tiles per step: rows 0-15, then 16-31.
const A8_STEP_BYTES: usize = 2 * TILE_BYTES;
/// Bytes of a column group's weight tiles per step: `lo` of both panels, then `hi`.
const W8_STEP_BYTES: usize = 4 * TILE_BYTES;
/// Bytes of a column group's weight tiles per super-block.
const SUPER_BYTES: usize = SUPER_STEPS * W8_STEP_BYTES;

/// Whether a format takes this path: the K-quants, whose integer scales fold into `w'`.
pub(crate) fn supports(format: QuantFormat) -> bool {
    matches!(
        format,
        QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K
    )
}

/// Whether this CPU multiplies int8 on AMX tiles (AMX-INT8 besides the split kernel's
/// AMX-BF16) and permutes bytes (AVX-512 VBMI), and the process holds the tile state.
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        // cpuid leaf 7 exists wherever `super::available` holds.
        super::available()
            && is_x86_feature_detected!("avx512vbmi")
            && __cpuid_count(7, 0).edx >> 25 & 1 == 1
    })
}

thread_local! {
    /// Per calling thread: the activations' int8 tiles.
    static QUANTS: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
    /// Per calling thread: the activations' scales, `[block][super-block][32 rows]`.
    static ROW_SCALES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Per calling thread: the activations' sums per 32 k, split (for the minimums).
    static BLOCK_SUMS: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
    /// Per worker: a task's weight tiles over one pass's super-blocks.
    static WEIGHT_TILES: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
    /// Per worker: a task's minimums, split into tiles.
    static MINIMUMS: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
    /// Per worker: a task's 32x32 sums per row block and column group, between passes.
    static BLOCK_OUT: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
}

/// The rows of one call's chunk, quantized.
struct Chunk<'a> {
    quants: &'a [u8],
    row_scales: &'a [f32],
    block_sums: &'a [CacheLine],
    k: usize,
    rows: usize,
    padded: usize,
    n: usize,
    ldo: usize,
    col0: usize,
    first_row: usize,
}

/// `out[r * ldo + col0 + c] = (x[m, k] . W^T)[r, c]` with `W` the K-quant `panels` (`n`
/// columns) and `x` quantized to int8 per row and super-block.
///
/// # Panics
/// Unless [`available`], [`supports`] the format, and `k` is a multiple of 256 (the caller
/// checks the sizes: `out.len() == m * ldo`, `col0 + n <= ldo`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    panels: Panels<'_>,
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
    ldo: usize,
    col0: usize,
) {
    // The unsafe calls below rely on these.
    assert!(
        available() && supports(panels.format) && k.is_multiple_of(SUPER),
        "AMX int8 tiles need AMX-INT8, a K-quant and k % 256 == 0"
    );
    debug_assert_eq!(x.len(), m * k);
    debug_assert!(out.len() == m * ldo && col0 + n <= ldo);
    let with_sums = panels.format.panel_layout().min != MinKind::None;
    let out = DisjointSlice::new(out);
    // Taken out of their slots for the call, not borrowed: while this thread waits for the
    // pool below it may run another job, even another step's product (steps entering the pool
    // from two threads), which then finds the slots empty and grows buffers of its own.
    let (mut quants, mut scales, mut sums) = (QUANTS.take(), ROW_SCALES.take(), BLOCK_SUMS.take());
    for_each_chunk(m, k, |row, rows, padded| {
        let x = &x[row * k..(row + rows) * k];
        // SAFETY: AVX-512 BF16 and VBMI by `available`; the sizes as asserted.
        unsafe {
            quantize_rows(x, k, rows, padded, &mut quants, &mut scales);
            if with_sums {
                block_sums_rows(x, k, rows, padded, &mut sums);
            }
        }
        let chunk = Chunk {
            quants: CacheLine::bytes(&quants),
            row_scales: &scales,
            block_sums: if with_sums { &sums } else { &[] },
            k,
            rows,
            padded,
            n,
            ldo,
            col0,
            first_row: row,
        };
        // SAFETY: AMX-INT8 granted by `available`; each task writes only the columns of its
        // groups `first..` of rows `row..row+rows`, inside `out` by the size checks.
        unsafe {
            run_tasks(n, |first, count| {
                multiply_task(panels, &chunk, first, count, out)
            })
        };
    });
    QUANTS.set(quants);
    ROW_SCALES.set(scales);
    BLOCK_SUMS.set(sums);
}

/// A tile row's byte `8j + 4h + t` takes k `8j + h + 2t` of its 64: the activations in the
/// weight tiles' k order (module docs).
static A_ORDER: [u8; 64] = {
    let mut order = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let (j, h, t) = (i / 8, i % 8 / 4, i % 4);
        order[i] = (8 * j + h + 2 * t) as u8;
        i += 1;
    }
    order
};

/// Quantizes `x: [rows, k]` to int8 tiles, per 32-row block and step the tile of rows 0-15
/// then 16-31 ([`A8_STEP_BYTES`]), and each row's super-block scales into `scales`
/// (`[block][k / 256][32]`). Rows past `rows` up to `padded` are zero.
///
/// # Safety
/// The CPU has AVX-512F, BW and VBMI; `x` holds `rows * k` values, `rows <= padded`, `padded`
/// is a multiple of 32 and `k` of 256.
unsafe fn quantize_rows(
    x: &[f32],
    k: usize,
    rows: usize,
    padded: usize,
    tiles: &mut Vec<CacheLine>,
    scales: &mut Vec<f32>,
) {
    let block_bytes = k / STEP_K * A8_STEP_BYTES;
    let block_scales = k / SUPER * BLOCK_M;
    let blocks = padded / BLOCK_M;
    let tiles = CacheLine::bytes_mut(scratch(tiles, CacheLine::count(blocks * block_bytes)));
    scratch(scales, blocks * block_scales)
        .par_chunks_mut(block_scales)
        .zip(tiles.par_chunks_mut(block_bytes))
        .enumerate()
        // SAFETY: the CPU features and sizes are the caller's promise; block `blk`'s tiles and
        // scales are the chunks it is handed.
        .for_each(|(blk, (scales, tiles))| unsafe {
            quantize_block(x, k, rows, blk, tiles, scales)
        });
}

/// [`quantize_rows`] for the 32-row block `blk`.
///
/// # Safety
/// As [`quantize_rows`]; `tiles` holds `k / 64` steps of [`A8_STEP_BYTES`] and `scales`
/// `k / 256 * 32` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn quantize_block(
    x: &[f32],
    k: usize,
    rows: usize,
    blk: usize,
    tiles: &mut [u8],
    scales: &mut [f32],
) {
    assert!(tiles.len() == k / STEP_K * A8_STEP_BYTES && scales.len() == k / SUPER * BLOCK_M);
    let base = tiles.as_mut_ptr();
    // SAFETY: the CPU features are the caller's promise; every read is inside row `r < rows`
    // of `x` (`sb * 256 + 256 <= k`), every write inside `tiles` (step `< k / 64`, tile row
    // `< 32`) by the assert.
    unsafe {
        let order = _mm512_loadu_si512(A_ORDER.as_ptr() as *const __m512i);
        for sb in 0..k / SUPER {
            for within in 0..BLOCK_M {
                let r = blk * BLOCK_M + within;
                let tile_row = |st: usize| {
                    let step = sb * SUPER_STEPS + st;
                    base.add(
                        step * A8_STEP_BYTES + within / TILE_M * TILE_BYTES + within % TILE_M * 64,
                    ) as *mut __m512i
                };
                if r >= rows {
                    // Padding rows: zero, so their products are finite and then discarded.
                    scales[sb * BLOCK_M + within] = 0.0;
                    for st in 0..SUPER_STEPS {
                        _mm512_storeu_si512(tile_row(st), _mm512_setzero_si512());
                    }
                    continue;
                }
                let src = x.as_ptr().add(r * k + sb * SUPER);
                let mut amax = _mm512_setzero_ps();
                for i in 0..SUPER / 16 {
                    amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(src.add(16 * i))));
                }
                let d = _mm512_reduce_max_ps(amax) / 127.0;
                let inv = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
                scales[sb * BLOCK_M + within] = d;
                for st in 0..SUPER_STEPS {
                    // Rounded to nearest even (the default rounding mode); |x / d| <= 127, so
                    // the narrowing keeps every value.
                    let q = |i: usize| {
                        let v = _mm512_loadu_ps(src.add(st * STEP_K + 16 * i));
                        _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv)))
                    };
                    let v = _mm512_inserti64x4(
                        _mm512_castsi256_si512(_mm256_set_m128i(q(1), q(0))),
                        _mm256_set_m128i(q(3), q(2)),
                        1,
                    );
                    _mm512_storeu_si512(tile_row(st), _mm512_permutexvar_epi8(order, v));
                }
            }
        }
    }
}

/// Multiplies the chunk's rows by column groups `first .. first + count` and writes the valid
/// part of each 32x32 output block: the groups' `d` and minimums, the minimums' product into
/// each output block's sums, then passes of super-blocks, each dequantizing the groups' weight
/// tiles of the pass and adding every 16x16 output tile's scaled super-blocks to its sums.
///
/// # Safety
/// The calling thread's tiles are configured ([`super::configure_tiles`]) and the CPU has AMX-INT8,
/// AVX-512F, BW, BF16, VBMI and F16C; `panels` holds a matrix of `chunk.k` input features and
/// `chunk.n` outputs in a format [`supports`] takes, `chunk` the quantized rows and, for a
/// format with minimums, their block sums; `out` is at least `[chunk.first_row + chunk.rows,
/// chunk.ldo]` with `chunk.col0 + chunk.n <= chunk.ldo`, and no other task writes these
/// groups' columns of these rows meanwhile.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx512vbmi,f16c")]
unsafe fn multiply_task(
    panels: Panels<'_>,
    chunk: &Chunk<'_>,
    first: usize,
    count: usize,
    out: DisjointSlice<'_, f32>,
) {
    let l = panels.format.panel_layout();
    let with_mins = l.min != MinKind::None;
    let k = chunk.k;
    let supers = k / SUPER;
    let steps = k / STEP_K;
    // The minimums' product as the integer path makes it: per 32-k block, 32 blocks a step.
    let min_steps = (k / TILE_K).div_ceil(TILE_K);
    let min_bytes = min_steps * STEP_BYTES;
    let blocks = chunk.padded / BLOCK_M;
    let block_floats = BLOCK_M * GROUP_N;
    // Steps of one or two 32-row blocks: passes as long as L2 holds their weight tiles.
    let pass = if blocks <= 2 {
        (PASS_TILE_BYTES / (count * SUPER_BYTES)).max(1)
    } else {
        1
    };
    // SAFETY: the tile configuration, the CPU features, the operands' sizes and the exclusive
    // columns are the caller's promise; every buffer is resized to what it is addressed with
    // below, and every store to `out` is masked to the task's valid rows and columns.
    unsafe {
        WEIGHT_TILES.with(|tiles| {
            MINIMUMS.with(|minimums| {
                BLOCK_OUT.with(|sums| {
                    let mut tiles = tiles.borrow_mut();
                    let tiles = CacheLine::bytes_mut(scratch(
                        &mut tiles,
                        CacheLine::count(count * pass.min(supers) * SUPER_BYTES),
                    ));
                    let mut minimums = minimums.borrow_mut();
                    let minimums = CacheLine::bytes_mut(scratch(
                        &mut minimums,
                        if with_mins {
                            CacheLine::count(count * min_bytes)
                        } else {
                            0
                        },
                    ));
                    let mut sums = sums.borrow_mut();
                    let sums = scratch(
                        &mut sums,
                        CacheLine::count(blocks * count * block_floats * 4),
                    )
                    .as_mut_ptr() as *mut f32;

                    for i in 0..count {
                        if with_mins {
                            scales_of(
                                panels,
                                k,
                                first + i,
                                None,
                                Some(&mut minimums[i * min_bytes..][..min_bytes]),
                            );
                        }
                    }
                    seed_sums(
                        sums,
                        with_mins.then_some(&*minimums),
                        chunk.block_sums,
                        count,
                        k,
                        chunk.rows,
                        chunk.padded,
                    );

                    // A super-block's four int32 products (`hi`, `lo` of rows 0-15, then
                    // of rows 16-31), stored for the scaling.
                    let mut product = [CacheLine::default(); 4 * TILE_M];
                    let product = product.as_mut_ptr() as *mut i32;
                    for sb0 in (0..supers).step_by(pass) {
                        let ns = pass.min(supers - sb0);
                        let last = sb0 + ns == supers;
                        let pass_bytes = ns * SUPER_BYTES;
                        for i in 0..count {
                            let part = tiles.as_mut_ptr().add(i * pass_bytes);
                            weight_tiles(panels, first + i, sb0, ns, part);
                        }
                        for blk in 0..blocks {
                            let a = chunk
                                .quants
                                .as_ptr()
                                .add((blk * steps + sb0 * SUPER_STEPS) * A8_STEP_BYTES);
                            let xd = chunk
                                .row_scales
                                .as_ptr()
                                .add((blk * supers + sb0) * BLOCK_M);
                            let r0 = blk * BLOCK_M;
                            let valid_rows = BLOCK_M.min(chunk.rows - r0);
                            for i in 0..count {
                                let c = sums.add((blk * count + i) * block_floats);
                                let w = tiles.as_ptr().add(i * pass_bytes);
                                for ct in 0..2 {
                                    let col = (first + i) * GROUP_N + ct * TILE_N;
                                    // Columns past the matrix: nothing to compute (the
                                    // others' panel exists: `col < n`).
                                    if col >= chunk.n {
                                        continue;
                                    }
                                    let c = c.add(ct * TILE_N);
                                    // The panel-block of super-block `sb0`: its `d` first.
                                    let d = panels.bytes.as_ptr().add(
                                        col / TILE_N * panels.panel_bytes + sb0 * l.block_bytes(),
                                    );
                                    scaled_super_blocks(
                                        c,
                                        a,
                                        w.add(ct * TILE_BYTES),
                                        d,
                                        l.block_bytes(),
                                        xd,
                                        ns,
                                        valid_rows,
                                        product,
                                    );
                                    if !last {
                                        continue;
                                    }
                                    let mask =
                                        (u32::MAX >> (32 - TILE_N.min(chunk.n - col))) as __mmask16;
                                    for r in 0..valid_rows {
                                        let dst = out.as_mut_ptr().add(
                                            (chunk.first_row + r0 + r) * chunk.ldo
                                                + chunk.col0
                                                + col,
                                        );
                                        let v = _mm512_loadu_ps(c.add(r * GROUP_N));
                                        _mm512_mask_storeu_ps(dst, mask, v);
                                    }
                                }
                            }
                        }
                    }
                })
            })
        })
    }
}

/// Adds `supers` super-blocks of one 32x16 output block to its sums at `c` (32 rows,
/// [`GROUP_N`] floats apart): per super-block, its four steps' products of the activation
/// tiles of rows 0-15 and 16-31 (at `a`, [`A8_STEP_BYTES`] a step) by the `hi` and the `lo`
/// weight tile (at `w`, [`W8_STEP_BYTES`] a step) into four int32 tiles, stored at `product`,
/// joined (`128 * hi + lo`, exact) and added times `xd` of each row (at `xd`, [`BLOCK_M`]
/// floats a super-block) and `d` of each column (the panel's f16 `d` at `d`, `block_bytes` a
/// super-block).
/// With `valid_rows <= 16` (a 16-row step pads its block to 32), rows 16-31 are skipped.
///
/// # Safety
/// The thread's tiles are configured and the CPU has AMX-INT8, AVX-512F and F16C; the operands
/// hold `supers` super-blocks, `product` 4 KiB on a 64-byte boundary.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn scaled_super_blocks(
    c: *mut f32,
    a: *const u8,
    w: *const u8,
    d: *const u8,
    block_bytes: usize,
    xd: *const f32,
    supers: usize,
    valid_rows: usize,
    product: *mut i32,
) {
    // SAFETY: the caller's promise: tile loads read 16 rows of 64 bytes inside each step, the
    // stores write the 4 KiB at `product`, the sums 32 rows at `c`.
    unsafe {
        let both = valid_rows > TILE_M;
        for sb in 0..supers {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
            for st in 0..SUPER_STEPS {
                let step = sb * SUPER_STEPS + st;
                let (a, w) = (a.add(step * A8_STEP_BYTES), w.add(step * W8_STEP_BYTES));
                if both {
                    asm!(
                        "tileloadd tmm4, [{a0} + {st}*1]",
                        "tileloadd tmm6, [{hi} + {st}*1]",
                        "tdpbssd tmm0, tmm4, tmm6",
                        "tileloadd tmm7, [{lo} + {st}*1]",
                        "tdpbssd tmm1, tmm4, tmm7",
                        "tileloadd tmm5, [{a1} + {st}*1]",
                        "tdpbssd tmm2, tmm5, tmm6",
                        "tdpbssd tmm3, tmm5, tmm7",
                        a0 = in(reg) a,
                        a1 = in(reg) a.add(TILE_BYTES),
                        hi = in(reg) w.add(2 * TILE_BYTES),
                        lo = in(reg) w,
                        st = in(reg) 64usize,
                        options(nostack, readonly)
                    );
                } else {
                    asm!(
                        "tileloadd tmm4, [{a0} + {st}*1]",
                        "tileloadd tmm6, [{hi} + {st}*1]",
                        "tdpbssd tmm0, tmm4, tmm6",
                        "tileloadd tmm7, [{lo} + {st}*1]",
                        "tdpbssd tmm1, tmm4, tmm7",
                        a0 = in(reg) a,
                        hi = in(reg) w.add(2 * TILE_BYTES),
                        lo = in(reg) w,
                        st = in(reg) 64usize,
                        options(nostack, readonly)
                    );
                }
            }
            // hi and lo of rows 0-15, then of rows 16-31.
            asm!(
                "tilestored [{p0} + {st}*1], tmm0",
                "tilestored [{p1} + {st}*1], tmm1",
                "tilestored [{p2} + {st}*1], tmm2",
                "tilestored [{p3} + {st}*1], tmm3",
                p0 = in(reg) product,
                p1 = in(reg) product.add(TILE_M * TILE_N),
                p2 = in(reg) product.add(2 * TILE_M * TILE_N),
                p3 = in(reg) product.add(3 * TILE_M * TILE_N),
                st = in(reg) 64usize,
                options(nostack)
            );
            let d = f16x16(d.add(sb * block_bytes));
            for r in 0..if both { BLOCK_M } else { TILE_M } {
                let p = product.add((r / TILE_M * 2 * TILE_M + r % TILE_M) * TILE_N);
                let hi = _mm512_load_si512(p as *const __m512i);
                let lo = _mm512_load_si512(p.add(TILE_M * TILE_N) as *const __m512i);
                let joined = _mm512_add_epi32(_mm512_slli_epi32(hi, 7), lo);
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(*xd.add(sb * BLOCK_M + r)));
                let sum = c.add(r * GROUP_N);
                _mm512_storeu_ps(
                    sum,
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(joined), scale, _mm512_loadu_ps(sum)),
                );
            }
        }
    }
}

/// Group `g`'s weight tiles of super-blocks `sb0 .. sb0 + supers` into `tiles`
/// ([`SUPER_BYTES`] a super-block; a panel past the end is zero).
///
/// # Safety
/// AVX-512F, BW and VBMI; `panels` holds a matrix covering those super-blocks in a format
/// [`supports`] takes, `tiles` `supers` super-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn weight_tiles(panels: Panels<'_>, g: usize, sb0: usize, supers: usize, tiles: *mut u8) {
    let num_panels = panels.bytes.len() / panels.panel_bytes;
    // SAFETY: the CPU features and the sizes are the caller's promise.
    unsafe {
        for panel in 0..2 {
            let p = 2 * g + panel;
            let base = tiles.add(panel * TILE_BYTES);
            if p >= num_panels {
                for step in 0..supers * SUPER_STEPS {
                    let at = base.add(step * W8_STEP_BYTES);
                    std::ptr::write_bytes(at, 0, TILE_BYTES);
                    std::ptr::write_bytes(at.add(2 * TILE_BYTES), 0, TILE_BYTES);
                }
                continue;
            }
            let w = panels.bytes.as_ptr().add(p * panels.panel_bytes);
            let of_format = match panels.format {
                QuantFormat::Q4K => panel_tiles::<{ QuantFormat::Q4K_ID }>,
                QuantFormat::Q5K => panel_tiles::<{ QuantFormat::Q5K_ID }>,
                QuantFormat::Q6K => panel_tiles::<{ QuantFormat::Q6K_ID }>,
                other => unreachable!("{other:?} does not take the int8 path (`supports`)"),
            };
            of_format(w, sb0, supers, base);
        }
    }
}

/// A byte order of a weight tile row: byte `4c + t` (k `t` of column `c`) takes byte
/// `stride * t + offset + c` of its source.
const fn tile_order(stride: usize, offset: usize) -> [u8; 64] {
    let mut order = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        order[i] = (stride * (i % 4) + offset + i / 4) as u8;
        i += 1;
    }
    order
}

/// The low (or high) nibbles of four pair rows of a panel, 16 columns each, into 4 k of each
/// column.
static FROM_PAIRS: [u8; 64] = tile_order(16, 0);

/// Eight k rows of a panel (16 columns a row, two registers) into k `h + 2t` of each column:
/// the even rows (`h = 0`), or the odd.
static FROM_ROWS: [[u8; 64]; 2] = [tile_order(32, 0), tile_order(32, 16)];

/// A column's byte (its scale) over its 4 bytes.
static COLUMN_OF: [u8; 64] = tile_order(0, 0);

/// One panel's `lo` and `hi` tiles of super-blocks `sb0 ..`, [`W8_STEP_BYTES`] a step from
/// `base` (`hi` two tiles after `lo`): per 8 k of a sub-block, the integers of the even and
/// the odd k (Q6_K's `q - 32` back to `q`), times the sub-block's integer scales by
/// `maddubs` (one byte of each pair times the scale, the other times zero) into 16-bit
/// `w'`, then split into the limbs' bytes (Q6_K's `w' - 32 * sc` first).
///
/// # Safety
/// AVX-512F, BW and VBMI; `w` holds one panel of `FMT` covering the super-blocks, `base`
/// `supers` super-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn panel_tiles<const FMT: u8>(w: *const u8, sb0: usize, supers: usize, base: *mut u8) {
    // SAFETY: every load is inside the panel-block of its super-block by the layout's offsets,
    // every store inside step `< supers * 4`: the caller's promise.
    unsafe {
        let l = const { QuantFormat::from_id(FMT).panel_layout() };
        let signed = FMT == QuantFormat::Q6K_ID;
        let load = |v: &[u8; 64]| _mm512_loadu_si512(v.as_ptr() as *const __m512i);
        let (from_pairs, column_of) = (load(&FROM_PAIRS), load(&COLUMN_OF));
        let from_rows = [load(&FROM_ROWS[0]), load(&FROM_ROWS[1])];
        let low = _mm512_set1_epi8(0x0F);
        let seven_bits = _mm512_set1_epi8(0x7F);
        let thirty_two = _mm512_set1_epi8(32);
        const EVEN: __mmask64 = 0x5555_5555_5555_5555;
        const ODD: __mmask64 = !EVEN;
        for s in 0..supers {
            let blk = w.add((sb0 + s) * l.block_bytes());
            for sub in 0..l.subs() {
                let sc = _mm512_castsi128_si512(_mm_loadu_si128(
                    blk.add(l.scales_at() + sub * TILE_N) as *const __m128i,
                ));
                // Dword c: (sc_c, 0, sc_c, 0) and (0, sc_c, 0, sc_c).
                let sc_even = _mm512_maskz_permutexvar_epi8(EVEN, column_of, sc);
                let sc_odd = _mm512_maskz_permutexvar_epi8(ODD, column_of, sc);
                let offset = if signed {
                    _mm512_maddubs_epi16(thirty_two, sc_even)
                } else {
                    _mm512_setzero_si512()
                };
                for eight in 0..l.sub_rows / 8 {
                    let k0 = sub * l.sub_rows + 8 * eight;
                    let quants = blk.add(l.quants_at());
                    let halves = if l.nibbles {
                        let v = _mm512_loadu_si512(quants.add(k0 / 2 * TILE_N) as *const __m512i);
                        [
                            _mm512_permutexvar_epi8(from_pairs, _mm512_and_si512(v, low)),
                            _mm512_permutexvar_epi8(
                                from_pairs,
                                _mm512_and_si512(_mm512_srli_epi16(v, 4), low),
                            ),
                        ]
                    } else {
                        let v0 = _mm512_loadu_si512(quants.add(k0 * TILE_N) as *const __m512i);
                        let v1 = _mm512_loadu_si512(quants.add(k0 * TILE_N + 64) as *const __m512i);
                        from_rows.map(|order| {
                            let q = _mm512_permutex2var_epi8(v0, order, v1);
                            if signed {
                                _mm512_add_epi8(q, thirty_two)
                            } else {
                                q
                            }
                        })
                    };
                    let step = s * SUPER_STEPS + k0 / STEP_K;
                    for (h, q) in halves.into_iter().enumerate() {
                        let even = _mm512_sub_epi16(_mm512_maddubs_epi16(q, sc_even), offset);
                        let odd = _mm512_sub_epi16(_mm512_maddubs_epi16(q, sc_odd), offset);
                        let lo = _mm512_and_si512(
                            _mm512_mask_blend_epi8(ODD, even, _mm512_slli_epi16(odd, 8)),
                            seven_bits,
                        );
                        let hi = _mm512_mask_blend_epi8(
                            ODD,
                            _mm512_srai_epi16(even, 7),
                            _mm512_slli_epi16(odd, 1),
                        );
                        let row = 2 * (k0 % STEP_K / 8) + h;
                        let at = base.add(step * W8_STEP_BYTES + row * 64);
                        _mm512_storeu_si512(at as *mut __m512i, lo);
                        _mm512_storeu_si512(at.add(2 * TILE_BYTES) as *mut __m512i, hi);
                    }
                }
            }
        }
    }
}
