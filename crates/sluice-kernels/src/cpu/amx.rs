//! Matrix products on Intel AMX tiles, for steps of many rows (prefill chunks, large decode
//! batches), where the f32 FMA kernel of [`crate::cpu::gemm`] is bound by arithmetic.
//!
//! AMX multiplies bf16 pairs into f32 sums at 16x the rate of AVX-512 f32 FMAs, but bf16 keeps
//! only 8 significant bits. Each operand is therefore split into two bf16 terms, `v = hi + lo`
//! (16 significant bits), and three products are summed: `hi*hi + lo*hi + hi*lo`. The dropped
//! `lo*lo` term and the rounding of `lo` bound each product's relative error by about 2^-16
//! instead of f32's 2^-24: far below the 4-bit quantization of the weights, at a third of the
//! tile rate, which is still about 5x the f32 kernel.
//!
//! Quantized weights are not stored as bf16: each task dequantizes its output columns (up to
//! `TASK_GROUPS` groups of 32) from the packed panels into hi/lo tiles in an L2-resident
//! buffer (an eighth of the bytes to read at Q4), a pass of k at a time, and multiplies a
//! chunk of activation rows (up to `CHUNK_BYTES`) by them: each 32-row block's activations
//! of the pass are loaded from L3 once and stay in L1 for all of the task's groups
//! (`multiply_task`). Steps of up to 64 rows of the K-quants, Q5_0 and Q5_1 instead multiply
//! the weights' integers, unsplit, and scale each 32-k block's product (module `integer`):
//! two products instead of three, and weight tiles converted from the integers, 2 bytes a
//! weight, instead of formed in f32 and split into 4. With `--amx-int8` (opt-in), the K-quants'
//! steps instead round the activations to int8 and multiply on int8 tiles (`matmul_int8`,
//! module `int8`), at twice the k per product. Weights held as f32 are
//! tiled once at load ([`tile_all`]). A row's result depends only on that row and the weights (every
//! output element sums its K range in the same order), so batching stays invisible within this
//! path.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::{Cell, RefCell};
use std::sync::OnceLock;

use rayon::prelude::*;

mod int8;
mod integer;

#[cfg(test)]
pub(crate) use integer::supports as multiplies_integers;

use crate::cpu::dequant_avx512::{f16x16, sub_scales, weight};
use crate::cpu::{scratch, CacheLine};
use crate::disjoint::DisjointSlice;
use crate::quant_format::{MinKind, QuantFormat};

/// Output columns of one tile (16 f32 = 64 bytes per tile row).
const TILE_N: usize = 16;
/// Rows of one tile.
const TILE_M: usize = 16;
/// k per tile step: 16 tile rows of bf16 pairs.
const TILE_K: usize = 32;
/// Columns per task: two B tiles.
const GROUP_N: usize = 2 * TILE_N;
/// Rows per register block: two A tiles.
const BLOCK_M: usize = 2 * TILE_M;
/// Bytes of one tile (16 rows x 64 bytes).
const TILE_BYTES: usize = 1024;
/// Column groups a task multiplies at most: each 32-row block's activations, loaded from L3
/// once, feed this many groups from L1.
const TASK_GROUPS: usize = 8;
/// 32-k steps per pass over a task's rows: one pass's activations of a 32-row block (8 x 4
/// KiB) stay in L1 while each of the task's groups multiplies them, its partial sums stored
/// between passes (exact f32, so the sums are those of one uninterrupted pass).
const PASS_STEPS: usize = 8;
/// Weight tiles of one pass at most for steps of one or two 32-row blocks (see
/// [`multiply_task`]).
const PASS_TILE_BYTES: usize = 1 << 20;
/// Activation bytes (hi and lo) split at a time; every column group dequantizes its weights
/// once per chunk and streams the chunk through them. Chunks that fit L2 (1 MiB) made a
/// 512-token prefill of Qwen2.5-1.5B dequantize each weight about 7 times (16 times for its
/// k = 8960 down projection) and spend about 40% of its time doing so; reading the activations
/// from L3 costs less (forward bench, paired: prefill 512 3391/3459 -> 2730/2639 ms at 16 MiB,
/// 64 decode rows 540/585 -> 523/488, SmolLM2 unchanged). 16 MiB bounds the buffer.
const CHUNK_BYTES: usize = 16 << 20;

/// Where the weights of a matrix are dequantized from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// `[panel][k][16]` f32 panels.
    F32(&'a [f32]),
    /// Quantized panels (see `gemm::Panels::Quant`), dequantized here with the exact kernels'
    /// arithmetic: the legacy layouts (per 32-k block, 16 f16 scales, 16 f16 minimums for Q4_1,
    /// then the quants) by code of their own, the others (K-quants, Q5_0, Q5_1) through their
    /// [`PanelLayout`](crate::quant_format::PanelLayout) ([`dequantize_layout`]).
    Quant {
        format: QuantFormat,
        bytes: &'a [u8],
        panel_bytes: usize,
    },
}

/// The weights of a product: tiled at load, or dequantized per call from their panels (an
/// eighth of the bytes to read for Q4 formats, for the cost of converting them).
#[derive(Clone, Copy)]
pub(crate) enum Weights<'a> {
    Tiles(&'a [CacheLine]),
    Dequantize(Source<'a>),
}

/// Whether this CPU has AMX-BF16 and the kernel granted this process the tile state, and
/// kernels may use it ([`super::limit_kernels`]).
pub fn available() -> bool {
    hardware() && super::allows(super::KernelTier::Amx)
}

/// Whether this CPU has AMX-BF16 and the kernel granted this process the tile state.
pub(crate) fn hardware() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        if !(is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512bf16"))
        {
            return false;
        }
        // cpuid leaf 7 exists on every CPU with AVX-512.
        let leaf7 = __cpuid_count(7, 0);
        let amx_bf16 = leaf7.edx >> 22 & 1 == 1;
        let amx_tile = leaf7.edx >> 24 & 1 == 1;
        if !(amx_bf16 && amx_tile) {
            return false;
        }
        // Linux hands out the 8 KiB tile state only on request (arch_prctl
        // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); without it the first tile instruction
        // faults.
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain syscall with integer arguments.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    })
}

/// The palette-1 tile configuration: every tile is 16 rows x 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

thread_local! {
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
    /// Per calling thread: the activations split into hi and lo rows.
    static ACTIVATIONS: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
    /// Per calling thread: the activations' sums per 32-k step, split likewise.
    static BLOCK_SUMS: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
    /// Per worker: a task's weight tiles over one pass's steps, when dequantized per call.
    static GROUP_TILES: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
    /// Per worker: a task's 32x32 partial sums, per row block and column group, between passes.
    static SUMS: RefCell<Vec<CacheLine>> = const { RefCell::new(Vec::new()) };
}

/// Loads the tile configuration once per thread (it stays until the thread releases it).
///
/// # Safety
/// [`available`] is true (the CPU has AMX and the kernel granted this process the tile state).
unsafe fn configure_tiles() {
    // SAFETY: AMX is available (the caller's promise), and `cfg` is a valid palette-1
    // configuration that outlives the instruction.
    unsafe {
        if CONFIGURED.get() {
            return;
        }
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = TILE_M as u8;
        }
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        CONFIGURED.set(true);
    }
}

/// `out[r * ldo + col0 + c] = (x[m, k] . W^T)[r, c]`: the product into columns `col0 ..
/// col0 + n` of an output `ldo` wide (a part of a fused projection, or all of it). The caller
/// checks [`available`], `k % 32 == 0` and the sizes (`out.len() == m * ldo`, `col0 + n <=
/// ldo`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    weights: Weights<'_>,
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
    ldo: usize,
    col0: usize,
) {
    // The unsafe calls below rely on both; one cached load and a modulo per product.
    assert!(
        available() && k.is_multiple_of(TILE_K),
        "AMX tiles need AMX and k % 32 == 0"
    );
    debug_assert_eq!(x.len(), m * k);
    debug_assert!(out.len() == m * ldo && col0 + n <= ldo);
    let out = DisjointSlice::new(out);
    // Steps of decode size with quantized weights scaled per 32-k block go on tiles as their
    // integers ([`integer`]); with minimums, that product needs the activations' block sums
    // too.
    let integers = match weights {
        Weights::Dequantize(Source::Quant {
            format,
            bytes,
            panel_bytes,
        }) if m <= integer::MAX_ROWS && integer::supports(format) => Some(integer::Panels {
            format,
            bytes,
            panel_bytes,
        }),
        _ => None,
    };
    let with_sums = integers.is_some_and(|p| p.format.panel_layout().min != MinKind::None);
    // Taken out of their slots for the call, not borrowed: while this thread waits for the
    // pool below it may run another job, even another step's product (steps entering the pool
    // from two threads), which then finds the slots empty and grows buffers of its own.
    let (mut acts, mut sums) = (ACTIVATIONS.take(), BLOCK_SUMS.take());
    for_each_chunk(m, k, |row, rows, padded| {
        let x = &x[row * k..(row + rows) * k];
        // SAFETY: AVX-512 BF16 checked by `available`.
        unsafe {
            split_rows(
                x,
                k,
                rows,
                padded,
                &mut acts,
                with_sums.then_some(&mut sums),
            )
        };
        let chunk = Chunk {
            acts: &acts,
            block_sums: if with_sums { &sums } else { &[] },
            k,
            rows,
            padded,
            n,
            ldo,
            col0,
            first_row: row,
        };
        // SAFETY: AMX granted by `available`; each task writes only the columns of its groups
        // `first..` of rows `row..row+rows`, inside `out` by the size checks.
        unsafe {
            run_tasks(n, |first, count| match integers {
                Some(panels) => integer::multiply_task(panels, &chunk, first, count, out),
                None => multiply_task(weights, &chunk, first, count, out),
            })
        };
    });
    ACTIVATIONS.set(acts);
    BLOCK_SUMS.set(sums);
}

/// Calls `f(row, rows, padded)` for each chunk of a product's `m` rows of `k` inputs: as many
/// rows as [`CHUNK_BYTES`] of f32 activations hold, `padded` to whole 32-row blocks.
fn for_each_chunk(m: usize, k: usize, mut f: impl FnMut(usize, usize, usize)) {
    let chunk_rows = (CHUNK_BYTES / (4 * k)).max(BLOCK_M) / BLOCK_M * BLOCK_M;
    let mut row = 0;
    while row < m {
        let rows = chunk_rows.min(m - row);
        f(row, rows, rows.div_ceil(BLOCK_M) * BLOCK_M);
        row += rows;
    }
}

/// Shares the column groups (32 columns each) of `n` outputs among tasks on the pool and runs
/// `task(first, count)` for each, on a worker whose tiles are configured: as many groups a task
/// (up to [`TASK_GROUPS`]) as leave each thread three tasks or more to balance.
///
/// # Safety
/// [`available`] is true.
unsafe fn run_tasks(n: usize, task: impl Fn(usize, usize) + Sync) {
    let groups = n.div_ceil(GROUP_N);
    let threads = rayon::current_num_threads();
    let per_task = [TASK_GROUPS, 4, 2]
        .into_iter()
        .find(|&t| groups.div_ceil(t) >= 3 * threads)
        .unwrap_or(1);
    (0..groups.div_ceil(per_task))
        .into_par_iter()
        .for_each(|t| {
            let first = t * per_task;
            // SAFETY: AMX is available (the caller's promise).
            unsafe { configure_tiles() };
            task(first, per_task.min(groups - first));
        });
}

/// Whether this CPU has the int8 tiles (AMX-INT8 and AVX-512 VBMI besides [`available`]'s
/// features) that [`crate::cpu::gemm::PackedMatrix::use_amx_int8`] multiplies on.
pub fn int8_available() -> bool {
    int8::available()
}

/// Whether [`matmul_int8`] can multiply `format` on this CPU.
pub(crate) fn int8_supports(format: QuantFormat) -> bool {
    int8::available() && int8::supports(format)
}

/// [`matmul`] of K-quant panels against activations quantized to int8 per row and 256 k, on
/// int8 tiles ([`int8`]). The caller checks [`int8_supports`] for the panels' format, `k %
/// 256 == 0` and the sizes, as for [`matmul`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_int8(
    source: Source<'_>,
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
    ldo: usize,
    col0: usize,
) {
    let Source::Quant {
        format,
        bytes,
        panel_bytes,
    } = source
    else {
        panic!("int8 tiles multiply quantized panels only");
    };
    let panels = integer::Panels {
        format,
        bytes,
        panel_bytes,
    };
    int8::matmul(panels, n, k, x, m, out, ldo, col0);
}

/// Every column group's hi/lo tiles (4 bytes per weight, as f32 panels), dequantized once at
/// load, for weights whose panels are f32 anyway: dequantizing those per call would read as
/// many bytes and convert them too.
pub(crate) fn tile_all(source: Source<'_>, n: usize, k: usize) -> Vec<CacheLine> {
    assert!(
        available() && k.is_multiple_of(TILE_K),
        "AMX tiles need AMX and k % 32 == 0"
    );
    let group_bytes = k / TILE_K * STEP_BYTES;
    let mut all = vec![CacheLine::default(); CacheLine::count(n.div_ceil(GROUP_N) * group_bytes)];
    CacheLine::bytes_mut(&mut all)
        .par_chunks_mut(group_bytes)
        .enumerate()
        // SAFETY: AVX-512 BF16 and k checked above; each group fills its own `tiles`.
        .for_each(|(g, tiles)| unsafe { dequantize_group(source, k, g, 0, tiles) });
    all
}

/// Splits `x: [rows, k]` into bf16 hi and lo parts, laid out tile by tile so that every tile
/// load reads 1 KiB in a row: per 32-row block and 32-k step, the hi tiles of rows 0-15 and
/// 16-31, then the lo tiles ([`A_STEP_BYTES`]). Rows past `rows` up to `padded` are zero. The
/// blocks are split in parallel (on the calling thread alone, this was 5% of a 512-token
/// prefill, with the other core idle).
///
/// With `sums`, each row's sums over its 32-k steps (`k / 32` of them, zero up to a multiple
/// of 32) are split into `sums` the same way: the activations of the product by the
/// minimums of weights scaled per 32-k block ([`integer`]).
///
/// # Safety
/// The CPU has AVX-512F, BW and BF16; `x` holds `rows * k` values, `rows <= padded`,
/// `padded` is a multiple of 32 and `k` of 32.
unsafe fn split_rows(
    x: &[f32],
    k: usize,
    rows: usize,
    padded: usize,
    tiles: &mut Vec<CacheLine>,
    sums: Option<&mut Vec<CacheLine>>,
) {
    let steps = k / TILE_K;
    let block_bytes = steps * A_STEP_BYTES;
    let tiles = CacheLine::bytes_mut(scratch(tiles, CacheLine::count(padded * k * 4)));
    let sum_block_bytes = steps.div_ceil(TILE_K) * A_STEP_BYTES;
    let sums = match sums {
        Some(sums) => CacheLine::bytes_mut(scratch(
            sums,
            CacheLine::count(padded / BLOCK_M * sum_block_bytes),
        )),
        None => &mut [],
    };
    let per_block = |blk: usize, block: &mut [u8], sums: Option<&mut [u8]>| {
        // SAFETY: the CPU features are the caller's promise; block `blk` covers rows
        // `blk * 32 ..` of `x` and is `block_bytes` long, its sums `sum_block_bytes`.
        unsafe { split_block(x, k, rows, blk, block, sums) }
    };
    let blocks = tiles.par_chunks_mut(block_bytes).enumerate();
    if sums.is_empty() {
        blocks.for_each(|(blk, block)| per_block(blk, block, None));
    } else {
        blocks
            .zip(sums.par_chunks_mut(sum_block_bytes))
            .for_each(|((blk, block), sums)| per_block(blk, block, Some(sums)));
    }
}

/// The block sums of [`split_rows`] alone, for a product that takes the activations
/// themselves in another form ([`int8`]).
///
/// # Safety
/// The CPU has AVX-512F, BW and BF16; `x` holds `rows * k` values, `rows <= padded`, `padded`
/// is a multiple of 32 and `k` of 32.
unsafe fn block_sums_rows(
    x: &[f32],
    k: usize,
    rows: usize,
    padded: usize,
    sums: &mut Vec<CacheLine>,
) {
    let sum_block_bytes = (k / TILE_K).div_ceil(TILE_K) * A_STEP_BYTES;
    let sums = CacheLine::bytes_mut(scratch(
        sums,
        CacheLine::count(padded / BLOCK_M * sum_block_bytes),
    ));
    sums.par_chunks_mut(sum_block_bytes)
        .enumerate()
        // SAFETY: the CPU features and sizes are the caller's promise; block `blk`'s sums are
        // `sum_block_bytes` long, as `split_sums` writes them.
        .for_each(|(blk, s)| unsafe { split_sums(x, k, rows, blk, s.as_mut_ptr() as *mut u16) });
}

/// [`split_rows`] for the 32-row block `blk`, into `block` (its `k / 32` steps) and `sums`.
///
/// # Safety
/// The CPU has AVX-512F, BW and BF16; `x` holds `rows * k` values, `k` is a multiple of 32,
/// `block` holds `k / 32` steps of [`A_STEP_BYTES`] and `sums` (if any) `k / 32` rounded up to
/// a multiple of 32, divided by 32, such steps.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn split_block(
    x: &[f32],
    k: usize,
    rows: usize,
    blk: usize,
    block: &mut [u8],
    sums: Option<&mut [u8]>,
) {
    let steps = k / TILE_K;
    assert_eq!(block.len(), steps * A_STEP_BYTES);
    let sums = sums.map(|sums| {
        assert_eq!(sums.len(), steps.div_ceil(TILE_K) * A_STEP_BYTES);
        sums.as_mut_ptr() as *mut u16
    });
    let base = block.as_mut_ptr() as *mut u16;
    // SAFETY: the CPU features are the caller's promise; every write below is inside `block`
    // or `sums` (step `s < steps` or `< sums.len() / A_STEP_BYTES`, `half * TILE_BYTES +
    // row * 64 + 64 <= 2 KiB`, the lo tile 2 KiB further), every read inside row `r < rows`
    // of `x`.
    unsafe {
        // The tile row of block row `within` in step `s`.
        let tile_row = |base: *mut u16, s: usize, within: usize| {
            let (half, row) = (within / TILE_M, within % TILE_M);
            base.add((s * A_STEP_BYTES + half * TILE_BYTES) / 2 + row * 32)
        };
        // Step by step, so the stores fill each tile in order (row by row, they hopped 4 KiB
        // a store).
        for s in 0..steps {
            for within in 0..BLOCK_M {
                let r = blk * BLOCK_M + within;
                let at = tile_row(base, s, within);
                if r >= rows {
                    // Padding rows: zero, so their products are finite and then discarded.
                    split_into(at, _mm512_setzero_ps(), _mm512_setzero_ps());
                    continue;
                }
                let v =
                    |part: usize| _mm512_loadu_ps(x.as_ptr().add(r * k + s * TILE_K + 16 * part));
                split_into(at, v(0), v(1));
            }
        }
        if let Some(sums) = sums {
            split_sums(x, k, rows, blk, sums);
        }
    }
}

/// Block `blk`'s sums of [`split_rows`]: each row's sums over its 32-k steps, split into
/// `sums` as activation tiles.
///
/// # Safety
/// The CPU has AVX-512F, BW and BF16; `x` holds `rows * k` values, `k` is a multiple of 32 and
/// `sums` holds `k / 32` rounded up to a multiple of 32, divided by 32, steps of
/// [`A_STEP_BYTES`].
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn split_sums(x: &[f32], k: usize, rows: usize, blk: usize, sums: *mut u16) {
    let steps = k / TILE_K;
    // SAFETY: the CPU features and the sizes are the caller's promise: every write is inside
    // step `t < steps.div_ceil(32)` of `sums`, every read inside row `r < rows` of `x`.
    unsafe {
        let tile_row = |s: usize, within: usize| {
            let (half, row) = (within / TILE_M, within % TILE_M);
            sums.add((s * A_STEP_BYTES + half * TILE_BYTES) / 2 + row * 32)
        };
        for within in 0..BLOCK_M {
            let r = blk * BLOCK_M + within;
            let x_row = x.as_ptr().add(r * k);
            let mut sixteen = [0f32; 16];
            for t in 0..steps.div_ceil(TILE_K) {
                let mut halves = [_mm512_setzero_ps(); 2];
                for (part, half_sums) in halves.iter_mut().enumerate() {
                    if r >= rows {
                        break;
                    }
                    for (i, sum) in sixteen.iter_mut().enumerate() {
                        let s = t * TILE_K + 16 * part + i;
                        *sum = if s < steps {
                            let at = x_row.add(s * TILE_K);
                            _mm512_reduce_add_ps(_mm512_add_ps(
                                _mm512_loadu_ps(at),
                                _mm512_loadu_ps(at.add(16)),
                            ))
                        } else {
                            0.0
                        };
                    }
                    *half_sums = _mm512_loadu_ps(sixteen.as_ptr());
                }
                split_into(tile_row(t, within), halves[0], halves[1]);
            }
        }
    }
}

/// Splits 32 values (`first` then `second`) of one tile row into bf16 hi at `at` and lo two
/// tiles (2 KiB) further on, where [`A_STEP_BYTES`] lays them.
///
/// # Safety
/// The CPU has AVX-512F, BW and BF16; `at` has 64 writable bytes, and 64 more 2 KiB further.
#[inline(always)]
unsafe fn split_into(at: *mut u16, first: __m512, second: __m512) {
    // SAFETY: the stores' bounds and the CPU features are the caller's promise.
    unsafe {
        for (part, v) in [first, second].into_iter().enumerate() {
            let h = _mm512_cvtneps_pbh(v);
            let l = _mm512_cvtneps_pbh(_mm512_sub_ps(v, _mm512_cvtpbh_ps(h)));
            _mm256_storeu_si256(
                at.add(16 * part) as *mut __m256i,
                std::mem::transmute::<__m256bh, __m256i>(h),
            );
            // The lo tile sits 2 KiB (1024 u16) after the hi tile of the same rows.
            _mm256_storeu_si256(
                at.add(16 * part + TILE_BYTES) as *mut __m256i,
                std::mem::transmute::<__m256bh, __m256i>(l),
            );
        }
    }
}

/// Bytes of a 32-row block's activation tiles per 32-k step: hi of rows 0-15, 16-31, then lo.
const A_STEP_BYTES: usize = 4 * TILE_BYTES;

/// Bytes of a group's weight tiles per 32-k step: hi of both column tiles, then lo of both.
const STEP_BYTES: usize = 4 * TILE_BYTES;

/// Dequantizes columns `g*32 .. g*32+32` (two panels) over the 32-k steps `step0 ..` into
/// `tiles` (as many steps as it holds): per step, the hi tile of panel 0, of panel 1, then the
/// lo tiles. A tile row holds one k pair: for each of 16 columns, `w[2p][col], w[2p+1][col]`
/// (AMX's pair-interleaved B layout).
///
/// # Safety
/// The CPU has AVX-512F, BW, BF16 and F16C; `k` is a multiple of 32 and of the format's
/// super-block, `source` holds the panels of a matrix of `k` input features (a panel past its
/// end reads as zero), and `tiles` is a whole number of steps long, within `k / 32` from
/// `step0` (checked).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,f16c")]
unsafe fn dequantize_group(source: Source<'_>, k: usize, g: usize, step0: usize, tiles: &mut [u8]) {
    // SAFETY: the CPU features are the caller's promise; every load is inside a panel that exists (`p <
    // num_panels` is checked), and every store inside `tiles` (its length is asserted).
    unsafe {
        let nsteps = tiles.len() / STEP_BYTES;
        let steps = k / TILE_K;
        assert!(tiles.len().is_multiple_of(STEP_BYTES) && step0 + nsteps <= steps);
        let base = tiles.as_mut_ptr();
        // A tile row holds columns 0-7 of the k pair (lane 2c: the even row's column c, lane
        // 2c+1 the odd row's) in its first 16 bf16 lanes and columns 8-15 in the rest, so the
        // values are built in that order, each with its own column's scale, and converted
        // with no shuffle of the output: `first` covers columns 0-7 of the pair, `second` 8-15.
        let emit = |step: usize, panel: usize, pair: usize, first: __m512, second: __m512| {
            emit_pair(base, step, panel, pair, first, second)
        };
        // One f32 panel (`[k][16]`), its even and odd rows interleaved.
        let emit_f32_panel = |panel: usize, w: *const f32| {
            for step in 0..nsteps {
                for pair in 0..TILE_K / 2 {
                    let rows = w.add(((step0 + step) * TILE_K + 2 * pair) * TILE_N);
                    let (first, second) =
                        interleave(_mm512_loadu_ps(rows), _mm512_loadu_ps(rows.add(16)));
                    emit(step, panel, pair, first, second);
                }
            }
        };
        // A panel past the matrix's last column.
        let emit_zeros = |panel: usize| {
            for step in 0..nsteps {
                for pair in 0..TILE_K / 2 {
                    emit(step, panel, pair, _mm512_setzero_ps(), _mm512_setzero_ps());
                }
            }
        };
        for panel in 0..2 {
            let p = 2 * g + panel;
            match source {
                Source::F32(panels) => {
                    if p < panels.len() / (k * TILE_N) {
                        emit_f32_panel(panel, panels.as_ptr().add(p * k * TILE_N));
                    } else {
                        emit_zeros(panel);
                    }
                }
                Source::Quant {
                    format,
                    bytes,
                    panel_bytes,
                } => {
                    let num_panels = bytes.len() / panel_bytes;
                    if p >= num_panels {
                        emit_zeros(panel);
                        continue;
                    }
                    if !format.is_legacy_layout() {
                        let w = bytes.as_ptr().add(p * panel_bytes);
                        let by_layout = match format {
                            QuantFormat::Q5_0 => dequantize_layout::<{ QuantFormat::Q5_0_ID }>,
                            QuantFormat::Q5_1 => dequantize_layout::<{ QuantFormat::Q5_1_ID }>,
                            QuantFormat::Q4K => dequantize_layout::<{ QuantFormat::Q4K_ID }>,
                            QuantFormat::Q5K => dequantize_layout::<{ QuantFormat::Q5K_ID }>,
                            _ => dequantize_layout::<{ QuantFormat::Q6K_ID }>,
                        };
                        by_layout(w, step0, nsteps, base, panel);
                        continue;
                    }
                    let block = panel_bytes / steps;
                    let low = _mm_set1_epi8(0x0F);
                    for step in 0..nsteps {
                        let blk = bytes.as_ptr().add(p * panel_bytes + (step0 + step) * block);
                        let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
                        let (d_first, d_second) = twice(d);
                        match format {
                            QuantFormat::Q8_0 => {
                                for pair in 0..TILE_K / 2 {
                                    let row = |r: usize| {
                                        _mm_loadu_si128(blk.add(32 + r * 16) as *const __m128i)
                                    };
                                    let (even, odd) = (row(2 * pair), row(2 * pair + 1));
                                    let value = |q: __m128i, d: __m512| {
                                        _mm512_mul_ps(
                                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)),
                                            d,
                                        )
                                    };
                                    emit(
                                        step,
                                        panel,
                                        pair,
                                        value(_mm_unpacklo_epi8(even, odd), d_first),
                                        value(_mm_unpackhi_epi8(even, odd), d_second),
                                    );
                                }
                            }
                            QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                                let (min, quants_at) = if format == QuantFormat::Q4_1 {
                                    let m = _mm512_cvtph_ps(_mm256_loadu_si256(
                                        blk.add(32) as *const __m256i
                                    ));
                                    (m, 64)
                                } else {
                                    (_mm512_mul_ps(d, _mm512_set1_ps(-8.0)), 32)
                                };
                                let (m_first, m_second) = twice(min);
                                for pair in 0..TILE_K / 2 {
                                    // Byte c: the even row's column c in its low nibble, the
                                    // odd row's in its high nibble.
                                    let q = _mm_loadu_si128(
                                        blk.add(quants_at + pair * 16) as *const __m128i
                                    );
                                    let even = _mm_and_si128(q, low);
                                    let odd = _mm_and_si128(_mm_srli_epi16(q, 4), low);
                                    let value = |q: __m128i, d: __m512, m: __m512| {
                                        let q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q));
                                        _mm512_fmadd_ps(q, d, m)
                                    };
                                    emit(
                                        step,
                                        panel,
                                        pair,
                                        value(_mm_unpacklo_epi8(even, odd), d_first, m_first),
                                        value(_mm_unpackhi_epi8(even, odd), d_second, m_second),
                                    );
                                }
                            }
                            _ => unreachable!("the other formats went through dequantize_layout"),
                        }
                    }
                }
            }
        }
    }
}

/// Two k-rows of 16 columns in the pair-interleaved order of a tile row: lane 2c of `first`
/// holds column c (0-7) of `even`, lane 2c+1 of `odd`; `second` the same for columns 8-15.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn interleave(even: __m512, odd: __m512) -> (__m512, __m512) {
    // SAFETY: register operations only, under the caller's AVX-512F.
    unsafe {
        let first_rows = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        let second_rows =
            _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
        (
            _mm512_permutex2var_ps(even, first_rows, odd),
            _mm512_permutex2var_ps(even, second_rows, odd),
        )
    }
}

/// Each column's value twice, for the pair-interleaved tile row: lanes 2c and 2c+1 of the
/// first register hold column c (0-7), of the second column 8 + c.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn twice(v: __m512) -> (__m512, __m512) {
    // SAFETY: register operations only, under the caller's AVX-512F.
    unsafe {
        let first_cols = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
        let second_cols =
            _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
        (
            _mm512_permutexvar_ps(first_cols, v),
            _mm512_permutexvar_ps(second_cols, v),
        )
    }
}

/// Splits one tile row of a k pair (`first`: columns 0-7, `second`: 8-15, each lane pair the
/// even then the odd k-row) into bf16 hi and lo and stores it as row `pair` of tile `panel` of
/// step `step` (hi) and of the lo tile two tiles later.
///
/// # Safety
/// The CPU has AVX-512F, BW and BF16; `base` holds at least `step + 1` steps of `STEP_BYTES`.
#[inline(always)]
unsafe fn emit_pair(
    base: *mut u8,
    step: usize,
    panel: usize,
    pair: usize,
    first: __m512,
    second: __m512,
) {
    // SAFETY: the CPU features and the bounds of both stores are the caller's promise.
    unsafe {
        let hi = _mm512_cvtne2ps_pbh(second, first);
        let halves: [__m256bh; 2] = std::mem::transmute(hi);
        let first_lo = _mm512_sub_ps(first, _mm512_cvtpbh_ps(halves[0]));
        let second_lo = _mm512_sub_ps(second, _mm512_cvtpbh_ps(halves[1]));
        let lo = _mm512_cvtne2ps_pbh(second_lo, first_lo);
        let at = base.add(step * STEP_BYTES + panel * TILE_BYTES + pair * 64);
        _mm512_storeu_si512(
            at as *mut __m512i,
            std::mem::transmute::<__m512bh, __m512i>(hi),
        );
        _mm512_storeu_si512(
            at.add(2 * TILE_BYTES) as *mut __m512i,
            std::mem::transmute::<__m512bh, __m512i>(lo),
        );
    }
}

/// Dequantizes one panel of a format read through its
/// [`PanelLayout`](crate::quant_format::PanelLayout) (the K-quants, Q5_0, Q5_1) straight into
/// tile `panel` of every 32-k step at `base`. Each weight is formed as the exact kernels form
/// it (`s * q`, or one fused `s * q +/- m` whose product is exact, with `s = d * sc` and `m =
/// dmin * mn`), so the tiles hold what splitting `gemm`'s f32 panel would give, without writing
/// and reading that panel. A 32-k step is one Q4_K/Q5_K sub-block, two of Q6_K.
///
/// Steps `step0 .. step0 + nsteps` of the panel go to steps `0 .. nsteps` of `base`.
///
/// # Safety
/// The CPU has AVX-512F, BW, BF16 and F16C; `w` holds one panel of `FMT` covering at least
/// `(step0 + nsteps) * 32` k-rows, and `base` `nsteps` steps of `STEP_BYTES`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,f16c")]
unsafe fn dequantize_layout<const FMT: u8>(
    w: *const u8,
    step0: usize,
    nsteps: usize,
    base: *mut u8,
    panel: usize,
) {
    // SAFETY: the CPU features are the caller's promise; every load is inside the panel-block
    // of its super-block by the layout's offsets, every store inside step `out_step < nsteps`.
    unsafe {
        let l = const { QuantFormat::from_id(FMT).panel_layout() };
        let block = l.block_bytes();
        let steps_per_block = l.super_rows / TILE_K;
        for out_step in 0..nsteps {
            let step = step0 + out_step;
            let blk = w.add(step / steps_per_block * block);
            // The step's first k-row within its super-block.
            let r0 = step % steps_per_block * TILE_K;
            let d = f16x16(blk);
            let m = if l.min == MinKind::None {
                _mm512_setzero_ps()
            } else {
                f16x16(blk.add(l.min_at()))
            };
            // Eight k pairs (16 rows) at a time: the shortest sub-block (Q6_K's).
            for half in 0..2 {
                let (s, o) = sub_scales(l, blk, (r0 + 16 * half) / l.sub_rows, d, m);
                let ((s_first, s_second), (o_first, o_second)) = (twice(s), twice(o));
                for pair in 8 * half..8 * half + 8 {
                    let (first, second) = pair_integers::<FMT>(blk, r0 + 2 * pair);
                    emit_pair(
                        base,
                        out_step,
                        panel,
                        pair,
                        weight(l.min, _mm512_cvtepi32_ps(first), s_first, o_first),
                        weight(l.min, _mm512_cvtepi32_ps(second), s_second, o_second),
                    );
                }
            }
        }
    }
}

/// The integers `q` of k-rows `row` and `row + 1` (even `row`) of the panel-block `blk` of a
/// format read through its [`PanelLayout`](crate::quant_format::PanelLayout), nibble offset
/// applied, in the pair-interleaved order of a tile row: lane 2c of the first vector holds
/// column c (0-7) of the even row, lane 2c+1 of the odd row; the second columns 8-15.
///
/// # Safety
/// The CPU has AVX-512F and BW; `blk` is a panel-block of `FMT` and `row + 1` one of its rows.
#[inline(always)]
unsafe fn pair_integers<const FMT: u8>(blk: *const u8, row: usize) -> (__m512i, __m512i) {
    // SAFETY: the loads are inside the panel-block's quants by its layout: the caller's
    // promise.
    unsafe {
        let l = const { QuantFormat::from_id(FMT).panel_layout() };
        // Byte c of each: column c of the even and of the odd k-row.
        if l.nibbles {
            let low = _mm_set1_epi8(0x0F);
            let offset = _mm512_set1_epi32(l.nibble_offset);
            let q = _mm_loadu_si128(blk.add(l.quants_at() + row / 2 * TILE_N) as *const __m128i);
            let even = _mm_and_si128(q, low);
            let odd = _mm_and_si128(_mm_srli_epi16(q, 4), low);
            let widen = |v: __m128i| _mm512_sub_epi32(_mm512_cvtepu8_epi32(v), offset);
            (
                widen(_mm_unpacklo_epi8(even, odd)),
                widen(_mm_unpackhi_epi8(even, odd)),
            )
        } else {
            let at =
                |r: usize| _mm_loadu_si128(blk.add(l.quants_at() + r * TILE_N) as *const __m128i);
            let (even, odd) = (at(row), at(row + 1));
            (
                _mm512_cvtepi8_epi32(_mm_unpacklo_epi8(even, odd)),
                _mm512_cvtepi8_epi32(_mm_unpackhi_epi8(even, odd)),
            )
        }
    }
}

/// One chunk of split activation rows and where its outputs go.
struct Chunk<'a> {
    /// `padded` rows split by [`split_rows`], and their block sums (for [`integer`] weights
    /// with minimums; empty otherwise).
    acts: &'a [CacheLine],
    block_sums: &'a [CacheLine],
    k: usize,
    /// Rows of the chunk that exist, and the same rounded up to 32-row blocks.
    rows: usize,
    padded: usize,
    /// Output columns of the matrix.
    n: usize,
    /// The row stride of `out`, and where the matrix's columns start in a row.
    ldo: usize,
    col0: usize,
    /// The chunk's first row in `out`.
    first_row: usize,
}

/// Multiplies the chunk's rows by column groups `first .. first + count` and writes the valid
/// part of each 32x32 output block. Passes of [`PASS_STEPS`] steps: per pass, the groups'
/// weight tiles over those steps (dequantized here, or from the tiles made at load), then for
/// each 32-row block its activations of the pass, loaded once and multiplied by every group,
/// each group's sums continued from the previous pass.
///
/// # Safety
/// The calling thread's tiles are configured ([`configure_tiles`]); `weights` holds a matrix of
/// `chunk.k` input features and `chunk.n` outputs, `chunk.acts` the split rows; `out` is at
/// least `[chunk.first_row + chunk.rows, chunk.ldo]` with `chunk.col0 + chunk.n <= chunk.ldo`,
/// and no other task writes these groups' columns of these rows meanwhile.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,f16c")]
unsafe fn multiply_task(
    weights: Weights<'_>,
    chunk: &Chunk<'_>,
    first: usize,
    count: usize,
    out: DisjointSlice<'_, f32>,
) {
    // SAFETY: the tile configuration, the operands' sizes and the exclusive columns are the
    // caller's promise; every tile load and store below stays inside `tiles`, `sums` (resized
    // to what they address) or the task's full 32x32 blocks of `out`; partial blocks are copied
    // row by row within `rows` and `cols`.
    unsafe {
        let steps = chunk.k / TILE_K;
        let blocks = chunk.padded / BLOCK_M;
        let group_bytes = steps * STEP_BYTES;
        let block_floats = BLOCK_M * GROUP_N;
        GROUP_TILES.with(|tiles| {
            SUMS.with(|sums| {
                let mut tiles = tiles.borrow_mut();
                let mut sums = sums.borrow_mut();
                // A step of few rows (a decode batch) has little to keep in L1: its passes
                // are as long as L2 holds their weight tiles, each pass storing and reloading
                // the sums.
                let pass_steps = if blocks <= 2 {
                    (PASS_TILE_BYTES / (count * STEP_BYTES)).max(PASS_STEPS)
                } else {
                    PASS_STEPS
                };
                let tiles = match weights {
                    Weights::Dequantize(_) => CacheLine::bytes_mut(scratch(
                        &mut tiles,
                        CacheLine::count(count * pass_steps.min(steps) * STEP_BYTES),
                    )),
                    Weights::Tiles(_) => &mut [],
                };
                let sums = scratch(
                    &mut sums,
                    CacheLine::count(blocks * count * block_floats * 4),
                )
                .as_mut_ptr() as *mut f32;
                let acts = chunk.acts.as_ptr() as *const u8;
                for s0 in (0..steps).step_by(pass_steps) {
                    let ns = pass_steps.min(steps - s0);
                    let last = s0 + ns == steps;
                    // Group `i`'s weight tiles of this pass, `STEP_BYTES` a step.
                    let pass_bytes = ns * STEP_BYTES;
                    if let Weights::Dequantize(source) = weights {
                        for i in 0..count {
                            let part = &mut tiles[i * pass_bytes..][..pass_bytes];
                            dequantize_group(source, chunk.k, first + i, s0, part);
                        }
                    }
                    let w = |i: usize| match weights {
                        Weights::Tiles(all) => CacheLine::bytes(all)
                            .as_ptr()
                            .add((first + i) * group_bytes + s0 * STEP_BYTES),
                        Weights::Dequantize(_) => tiles.as_ptr().add(i * pass_bytes),
                    };
                    for blk in 0..blocks {
                        let a = acts.add((blk * steps + s0) * A_STEP_BYTES);
                        let r = blk * BLOCK_M;
                        let valid_rows = BLOCK_M.min(chunk.rows - r);
                        for i in 0..count {
                            let c = sums.add((blk * count + i) * block_floats);
                            if s0 == 0 {
                                zero_sums();
                            } else {
                                load_sums(c, GROUP_N * 4);
                            }
                            accumulate_rows(w(i), a, ns, valid_rows);
                            if !last {
                                store(c, GROUP_N * 4);
                                continue;
                            }
                            let col = (first + i) * GROUP_N;
                            let cols = GROUP_N.min(chunk.n - col);
                            let dst = out
                                .as_mut_ptr()
                                .add((chunk.first_row + r) * chunk.ldo + chunk.col0 + col);
                            if valid_rows == BLOCK_M && cols == GROUP_N {
                                store(dst, chunk.ldo * 4);
                            } else {
                                store(c, GROUP_N * 4);
                                for row in 0..valid_rows {
                                    std::ptr::copy_nonoverlapping(
                                        c.add(row * GROUP_N),
                                        dst.add(row * chunk.ldo),
                                        cols,
                                    );
                                }
                            }
                        }
                    }
                }
            })
        })
    }
}

/// Zeroes the sums of a 32x32 block (tiles 0-3).
///
/// # Safety
/// The thread's tiles are configured.
#[inline(always)]
unsafe fn zero_sums() {
    // SAFETY: the configured tiles are the caller's promise; no memory is touched.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
    }
}

/// Loads the sums of a 32x32 block (tiles 0-3, as [`store`] lays them out) from `src`, rows
/// `ld` bytes apart.
///
/// # Safety
/// The thread's tiles are configured; `src` has 32 rows of 32 readable floats, `ld` bytes
/// apart.
#[inline(always)]
unsafe fn load_sums(src: *const f32, ld: usize) {
    // SAFETY: the caller's promise: the four 16x16 loads stay within 32 rows of 32 floats.
    unsafe {
        let s = src as *const u8;
        asm!(
            "tileloadd tmm0, [{s0} + {ld}*1]",
            "tileloadd tmm1, [{s1} + {ld}*1]",
            "tileloadd tmm2, [{s2} + {ld}*1]",
            "tileloadd tmm3, [{s3} + {ld}*1]",
            s0 = in(reg) s,
            s1 = in(reg) s.add(64),
            s2 = in(reg) s.add(16 * ld),
            s3 = in(reg) s.add(16 * ld + 64),
            ld = in(reg) ld,
            options(nostack, readonly)
        );
    }
}

/// Adds `steps` 32-k steps of one 32x32 block to the sums in tiles 0-3 (rows 0-15 x cols
/// 0-15, 0-15 x 16-31, 16-31 x 0-15, 16-31 x 16-31). Tiles 4-5 hold activations, 6-7 weights.
///
/// # Safety
/// The thread's tiles are configured; `w` holds `steps` weight steps of `STEP_BYTES` and `a`
/// `steps` activation steps of `A_STEP_BYTES`.
#[inline(always)]
unsafe fn accumulate(w: *const u8, a: *const u8, steps: usize) {
    // SAFETY: the configured tiles and the operands' sizes are the caller's promise; tile loads read 16
    // rows of 64 bytes inside each step.
    unsafe {
        for s in 0..steps {
            let b = w.add(s * STEP_BYTES);
            let a = a.add(s * A_STEP_BYTES);
            // lo x hi, hi x hi, hi x lo: each pass replaces one operand pair, 8 tile loads for 12
            // products.
            asm!(
                "tileloadd tmm4, [{al0} + {st}*1]",
                "tileloadd tmm5, [{al1} + {st}*1]",
                "tileloadd tmm6, [{bh0} + {st}*1]",
                "tileloadd tmm7, [{bh1} + {st}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "tileloadd tmm4, [{ah0} + {st}*1]",
                "tileloadd tmm5, [{ah1} + {st}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "tileloadd tmm6, [{bl0} + {st}*1]",
                "tileloadd tmm7, [{bl1} + {st}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                ah0 = in(reg) a,
                ah1 = in(reg) a.add(TILE_BYTES),
                al0 = in(reg) a.add(2 * TILE_BYTES),
                al1 = in(reg) a.add(3 * TILE_BYTES),
                bh0 = in(reg) b,
                bh1 = in(reg) b.add(TILE_BYTES),
                bl0 = in(reg) b.add(2 * TILE_BYTES),
                bl1 = in(reg) b.add(3 * TILE_BYTES),
                st = in(reg) 64usize,
                options(nostack, readonly)
            );
        }
    }
}

/// [`accumulate`] for a block of which `valid_rows` rows exist: rows 0-15 alone
/// ([`accumulate_upper`]) when rows 16-31 are padding (a step of 16 rows, a chunk's last
/// block), whose tiles are then stored but never copied out.
///
/// # Safety
/// As for [`accumulate`].
#[inline(always)]
unsafe fn accumulate_rows(w: *const u8, a: *const u8, steps: usize, valid_rows: usize) {
    // SAFETY: the caller's promise, as each variant needs it.
    unsafe {
        if valid_rows > TILE_M {
            accumulate(w, a, steps);
        } else {
            accumulate_upper(w, a, steps);
        }
    }
}

/// [`accumulate`] for rows 0-15 alone (tiles 0 and 1), in the same order of products, so a
/// row's sums are those the whole block would give: half the products for a block whose rows
/// 16-31 are padding.
///
/// # Safety
/// As for [`accumulate`].
#[inline(always)]
unsafe fn accumulate_upper(w: *const u8, a: *const u8, steps: usize) {
    // SAFETY: as in `accumulate`: tile loads read 16 rows of 64 bytes inside each step.
    unsafe {
        for s in 0..steps {
            let b = w.add(s * STEP_BYTES);
            let a = a.add(s * A_STEP_BYTES);
            asm!(
                "tileloadd tmm4, [{al0} + {st}*1]",
                "tileloadd tmm6, [{bh0} + {st}*1]",
                "tileloadd tmm7, [{bh1} + {st}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm4, [{ah0} + {st}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm6, [{bl0} + {st}*1]",
                "tileloadd tmm7, [{bl1} + {st}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                ah0 = in(reg) a,
                al0 = in(reg) a.add(2 * TILE_BYTES),
                bh0 = in(reg) b,
                bh1 = in(reg) b.add(TILE_BYTES),
                bl0 = in(reg) b.add(2 * TILE_BYTES),
                bl1 = in(reg) b.add(3 * TILE_BYTES),
                st = in(reg) 64usize,
                options(nostack, readonly)
            );
        }
    }
}

/// Stores tiles 0-3 as a 32x32 f32 block at `dst`, rows `ld` bytes apart.
///
/// # Safety
/// The thread's tiles hold a computed block; `dst` has 32 rows of 32 writable floats, `ld` bytes
/// apart.
#[inline(always)]
unsafe fn store(dst: *mut f32, ld: usize) {
    // SAFETY: the caller's promise: the four 16x16 stores stay within 32 rows of 32 floats.
    unsafe {
        let d = dst as *mut u8;
        asm!(
            "tilestored [{d0} + {ld}*1], tmm0",
            "tilestored [{d1} + {ld}*1], tmm1",
            "tilestored [{d2} + {ld}*1], tmm2",
            "tilestored [{d3} + {ld}*1], tmm3",
            d0 = in(reg) d,
            d1 = in(reg) d.add(64),
            d2 = in(reg) d.add(16 * ld),
            d3 = in(reg) d.add(16 * ld + 64),
            ld = in(reg) ld,
            options(nostack)
        );
    }
}
