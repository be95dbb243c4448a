//! The packed gemm's tests: products against plain loops, the quantized panels and the AVX2
//! kernels against the f32 panels and the AVX-512 kernels bit for bit, a row's result alone
//! and beside other rows, and the AMX paths (where the CPU has them) against f64 products.

use super::*;
use crate::testing::{quantized_matrix, random_values};

fn amx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::cpu::amx::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

// The AMX path of `PackedMatrix::matmul`.
/// `|got - want| <= 1e-4 * sum_k |x w|`: three split products leave about 3 * 2^-18 of
/// each product's magnitude.
fn assert_close(got: &[f32], x: &[f32], w: &[f32], m: usize, n: usize, k: usize, what: &str) {
    for r in 0..m {
        for c in 0..n {
            let xr = &x[r * k..][..k];
            let wc = &w[c * k..][..k];
            let want: f64 = xr.iter().zip(wc).map(|(&a, &b)| a as f64 * b as f64).sum();
            let scale: f64 = xr.iter().zip(wc).map(|(&a, &b)| (a * b).abs() as f64).sum();
            let err = (got[r * n + c] as f64 - want).abs();
            assert!(
                err <= 1e-4 * scale + 1e-30,
                "{what} m{m} n{n} k{k} [{r},{c}]: {} vs {want} (scale {scale})",
                got[r * n + c]
            );
        }
    }
}

#[test]
fn columns_read_back_until_amx_frees_the_panels() {
    let (n, k) = (40, 64);
    let w = random_values(n * k, 3);
    let mut m = PackedMatrix::pack(&w, n, k);
    assert!(m.holds_panels());
    let mut column = vec![f32::NAN; k];
    m.dequantize_column(37, &mut column);
    assert_eq!(column, w[37 * k..][..k]);
    // Where the CPU has AMX the f32 panels are freed and no column can be read back.
    let tiles_only = m.use_amx_only();
    assert_eq!(m.holds_panels(), !tiles_only);
}

#[test]
fn split_bf16_tiles_match_f64_products() {
    if !amx_available() {
        eprintln!("skipped: no AMX-BF16 on this CPU, the tile kernel is never used here");
        return;
    }
    // Edges: rows past a 32-row block and past a 16 MiB chunk (512 rows of 8192), columns
    // past a 32-column group and past the last panel.
    for &(m, n, k) in &[
        (1usize, 40usize, 64usize),
        (33, 70, 96),
        (64, 960, 576),
        (200, 33, 1536),
        (550, 20, 8192),
        // Tasks of several column groups (the last one short) over several passes of k.
        (33, 1000, 576),
        (31, 16, 32),
    ] {
        let w = random_values(n * k, 11);
        let x = random_values(m * k, 12);
        let mut packed = PackedMatrix::pack(&w, n, k);
        assert!(packed.use_amx_from(1));
        let mut out = vec![f32::NAN; m * n];
        packed.matmul(&x, m, &mut out);
        assert_close(&out, &x, &w, m, n, k, "f32 panels");
    }
}

#[test]
fn quantized_panels_on_tiles_match_their_dequantized_values() {
    if !amx_available() {
        eprintln!("skipped: no AMX-BF16 on this CPU, the tile kernel is never used here");
        return;
    }
    // The legacy layouts are dequantized in the tile kernel by code of their own, the
    // others (k a multiple of their 256-weight super-blocks) through their panel layout;
    // MXFP4 is declined.
    let (q, _) = quantized_matrix(16, 64, QuantFormat::Mxfp4, 5);
    let mut mxfp4 = PackedMatrix::pack_quantized(QuantFormat::Mxfp4, &q, 16, 64).unwrap();
    assert!(!mxfp4.use_amx_from(1) && !mxfp4.use_amx_dequantizing_from(1));
    for format in QuantFormat::ALL
        .into_iter()
        .filter(|&f| f != QuantFormat::Mxfp4)
    {
        let shapes: &[(usize, usize, usize)] = if format.is_legacy_layout() {
            &[(40, 72, 576), (64, 16, 64), (40, 520, 576)]
        } else {
            &[(40, 72, 768), (64, 16, 256), (40, 520, 512)]
        };
        for &(m, n, k) in shapes {
            let (q, dense) = quantized_matrix(n, k, format, 5);
            let x = random_values(m * k, 6);
            // Tiled at load (split), and dequantized at every call: split as at load, or
            // as their integers with each 32-k block's product scaled (steps of up to 64
            // rows of the formats `multiplies_integers` takes).
            let mut tiled = PackedMatrix::pack_quantized(format, &q, n, k).unwrap();
            assert!(tiled.use_amx_from(1));
            let mut per_call = PackedMatrix::pack_quantized(format, &q, n, k).unwrap();
            assert!(per_call.use_amx_dequantizing_from(1));
            let (mut a, mut b) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
            tiled.matmul(&x, m, &mut a);
            per_call.matmul(&x, m, &mut b);
            assert_close(&a, &x, &dense, m, n, k, &format!("{format:?} tiled"));
            assert_close(&b, &x, &dense, m, n, k, &format!("{format:?} per call"));
            if !crate::cpu::amx::multiplies_integers(format) {
                assert!(
                    a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "{format:?}: tiles made per call differ from tiles made at load"
                );
            }
            // The weights are formed exactly (as the reference dequantizer forms them), so
            // the tiles equal those of the dequantized f32 matrix and so do the products.
            let mut f32_tiles = PackedMatrix::pack(&dense, n, k);
            assert!(f32_tiles.use_amx_from(1));
            let mut c = vec![f32::NAN; m * n];
            f32_tiles.matmul(&x, m, &mut c);
            assert!(
                a.iter().zip(&c).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{format:?}: quantized tiles differ from the tiles of their f32 weights"
            );
        }
    }
}

#[test]
fn integer_tiles_of_decode_steps_match_and_keep_rows_apart() {
    if !amx_available() {
        eprintln!("skipped: no AMX-BF16 on this CPU, the tile kernel is never used here");
        return;
    }
    // Steps of up to 64 rows multiply the integers of the formats scaled per 32 k and
    // scale each block's product. k = 2304 and 2560: the minimums' product takes three
    // steps of 32 blocks; 1540 columns: tasks of 8 groups, whose 80 steps take two
    // passes, and a last panel cut short.
    for format in QuantFormat::ALL
        .into_iter()
        .filter(|&f| crate::cpu::amx::multiplies_integers(f))
    {
        for (n, k) in [(40usize, 2304usize), (1540, 2560)] {
            let (q, dense) = quantized_matrix(n, k, format, 7);
            let mut packed = PackedMatrix::pack_quantized(format, &q, n, k).unwrap();
            assert!(packed.use_amx_dequantizing_from(1));
            let m = 64;
            let x = random_values(m * k, 8);
            let mut batch = vec![f32::NAN; m * n];
            packed.matmul(&x, m, &mut batch);
            let mut worst = 0f64;
            for r in 0..m {
                for c in 0..n {
                    let (xr, wc) = (&x[r * k..][..k], &dense[c * k..][..k]);
                    let want: f64 = xr.iter().zip(wc).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let scale: f64 = xr
                        .iter()
                        .zip(wc)
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum();
                    worst = worst.max((batch[r * n + c] as f64 - want).abs() / scale);
                }
            }
            eprintln!("{format:?} n{n} k{k}: worst error {worst:e} of sum |x w|");
            // x carried to about 2^-17 and q exact: below the split products' 2^-16
            // (1.5e-5); about 1e-6 measured.
            assert!(
                worst < 4e-6,
                "{format:?} n{n} k{k}: error {worst:e} of sum |x w|"
            );
            assert_rows_alone_equal(&packed, &x, &batch, &[0, 17, 63], &format!("{format:?}"));
        }
    }
}

/// The int8 tiles compute what they promise: each super-block's integer product of the
/// activations' int8 rounding by `sc * q` is exact and scaled by `xd * d`, the minimums
/// take the exact activations. Checked against that arithmetic in f64 (the activations
/// rounded as the kernel rounds them), over row counts that pad a tile (17), fill blocks
/// (64) and take more than two blocks (100, passes of one super-block), k of 9 super-blocks
/// (the minimums' product in three steps) and a last column group cut short.
#[test]
fn int8_tiles_compute_the_quantized_arithmetic_and_keep_rows_apart() {
    #[cfg(target_arch = "x86_64")]
    if !crate::cpu::amx::int8_supports(QuantFormat::Q4K) {
        eprintln!("skipped: no AMX-INT8 on this CPU, the int8 tile kernel is never used here");
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    return;
    for format in [QuantFormat::Q4K, QuantFormat::Q5K, QuantFormat::Q6K] {
        let (n, k) = (200, 2304);
        let (q, dense) = quantized_matrix(n, k, format, 11);
        // Each weight as `d * w'` plus its minimum's part, from the GGUF blocks.
        let (mut scaled, mut minimum) = (vec![0f64; n * k], vec![0f64; n * k]);
        let row_bytes = k / 256 * format.block_bytes();
        for c in 0..n {
            let blocks = q[c * row_bytes..][..row_bytes].chunks_exact(format.block_bytes());
            for (b, blk) in blocks.enumerate() {
                let dec = format.decode(blk);
                let d = half::f16::from_bits(dec.d).to_f64();
                let dmin = half::f16::from_bits(dec.m).to_f64();
                for i in 0..256 {
                    let at = c * k + b * 256 + i;
                    let qi = dec.q[i] as f64;
                    if format == QuantFormat::Q6K {
                        scaled[at] = d * dec.sc[i / 16] as f64 * qi;
                    } else {
                        scaled[at] = d * dec.sc[i / 32] as u8 as f64 * qi;
                        minimum[at] = -dmin * dec.mn[i / 32] as u8 as f64;
                    }
                    let w = scaled[at] + minimum[at];
                    assert!((w - dense[at] as f64).abs() <= 1e-6 * (1.0 + w.abs()));
                }
            }
        }
        let mut packed = PackedMatrix::pack_quantized(format, &q, n, k).unwrap();
        assert!(packed.use_amx_dequantizing_from(1) && packed.use_amx_int8(1));
        for m in [17, 64, 100] {
            let x = random_values(m * k, 12 + m as u64);
            let mut got = vec![f32::NAN; m * n];
            packed.matmul(&x, m, &mut got);
            let mut worst = 0f64;
            for r in 0..m {
                let xr = &x[r * k..][..k];
                // The kernel's rounding: f32 `d = max / 127`, `x * (1 / d)` to nearest even.
                let xq: Vec<(f64, f64)> = xr
                    .chunks_exact(256)
                    .flat_map(|sb| {
                        let d = sb.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                        sb.iter()
                            .map(move |v| (d as f64, (v * inv).round_ties_even() as f64))
                    })
                    .collect();
                for c in 0..n {
                    let (mut want, mut size) = (0f64, 0f64);
                    for i in 0..k {
                        let (e, o) = (scaled[c * k + i], minimum[c * k + i]);
                        let (xd, xq) = xq[i];
                        want += xd * xq * e + xr[i] as f64 * o;
                        size += (xr[i] as f64).abs() * (e.abs() + o.abs());
                    }
                    worst = worst.max((got[r * n + c] as f64 - want).abs() / size);
                }
            }
            eprintln!("{format:?} m{m}: worst error {worst:e} of sum |x| (|d w'| + |min|)");
            // Integer sums exact; f32 scaling and sums (2^-24 a step) and the minimums'
            // split product (2^-16) remain.
            assert!(worst < 4e-6, "{format:?} m{m}: error {worst:e}");
            assert_rows_alone_equal(&packed, &x, &got, &[0, 16, m - 1], &format!("{format:?}"));
        }
    }
}

/// Products started from jobs of the pool, as when two threads each run a step on it: a
/// worker waiting inside one product runs another job, and so another product, on the same
/// thread. Each gets its own buffers (before, the second borrowed the first's twice and
/// panicked) and its own result.
#[test]
fn products_nested_in_the_pool_keep_their_buffers_apart() {
    if !amx_available() {
        eprintln!("skipped: no AMX-BF16 on this CPU, the tile kernel is never used here");
        return;
    }
    let (n, k) = (200, 512);
    let (q, _) = quantized_matrix(n, k, QuantFormat::Q4K, 3);
    let mut split = PackedMatrix::pack_quantized(QuantFormat::Q4K, &q, n, k).unwrap();
    assert!(split.use_amx_dequantizing_from(1));
    let mut int8 = PackedMatrix::pack_quantized(QuantFormat::Q4K, &q, n, k).unwrap();
    assert!(int8.use_amx_dequantizing_from(1));
    let int8 = int8.use_amx_int8(1).then_some(int8);
    for packed in std::iter::once(&split).chain(&int8) {
        // Different row counts, so a mixed-up buffer shows.
        let xs: Vec<(usize, Vec<f32>)> = (0..4)
            .map(|i| {
                let m = 16 + 7 * i;
                (m, random_values(m * k, 40 + i as u64))
            })
            .collect();
        let want: Vec<Vec<f32>> = xs
            .iter()
            .map(|(m, x)| {
                let mut out = vec![f32::NAN; m * n];
                packed.matmul(x, *m, &mut out);
                out
            })
            .collect();
        // Each thread enters the pool as a step does (the product runs on a worker); a
        // worker waiting inside one product picks up another thread's entry. Whether it does
        // is up to the scheduling: many rounds.
        std::thread::scope(|threads| {
            for ((m, x), want) in xs.iter().zip(&want) {
                threads.spawn(move || {
                    for _ in 0..50 {
                        let mut out = vec![f32::NAN; m * n];
                        rayon::scope(|_| packed.matmul(x, *m, &mut out));
                        assert!(
                            out == *want,
                            "a nested product differs from the same product alone"
                        );
                    }
                });
            }
        });
    }
}

#[test]
fn a_rows_result_does_not_depend_on_the_other_rows() {
    if !amx_available() {
        eprintln!("skipped: no AMX-BF16 on this CPU, the tile kernel is never used here");
        return;
    }
    let (n, k) = (96, 576);
    let w = random_values(n * k, 21);
    let x = random_values(77 * k, 22);
    let mut packed = PackedMatrix::pack(&w, n, k);
    assert!(packed.use_amx_from(1));
    let mut batch = vec![0f32; 77 * n];
    packed.matmul(&x, 77, &mut batch);
    assert_rows_alone_equal(&packed, &x, &batch, &[0, 31, 32, 76], "f32 tiles");
}

/// Each of `rows` multiplied alone gives its row of `batch` (all of `x` multiplied at
/// once) bit for bit.
fn assert_rows_alone_equal(
    packed: &PackedMatrix,
    x: &[f32],
    batch: &[f32],
    rows: &[usize],
    what: &str,
) {
    let (n, k) = (packed.out_features(), packed.in_features());
    let m = x.len() / k;
    for &r in rows {
        let mut alone = vec![f32::NAN; n];
        packed.matmul(&x[r * k..][..k], 1, &mut alone);
        assert!(
            alone
                .iter()
                .zip(&batch[r * n..][..n])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: row {r} differs alone and in a batch of {m}"
        );
    }
}

/// Shapes at panel edges (n not a multiple of 16, one panel, several) and block edges (one
/// super-block, several), with every row count of the microkernels.
fn edge_shapes(format: QuantFormat) -> Vec<(usize, usize, usize)> {
    let sb = format.block_weights();
    vec![
        (1, 40, sb),
        (2, 16, 2 * sb),
        (3, 200, 3 * sb),
        (6, 16, sb),
        (7, 33, 2 * sb),
        (13, 70, sb),
        (40, 48, 2 * sb),
        // Enough panels for tasks of two and of four (on two threads): the AVX-512 path
        // dequantizes a task's panels together from 12 rows.
        (20, 256, 2 * sb),
        (13, 512, sb),
    ]
}

#[test]
fn quantized_panels_equal_dequantized_f32_panels_bit_for_bit() {
    if !available() {
        eprintln!("skipped: no AVX2/FMA/F16C on this CPU, the packed kernel is never used here");
        return;
    }
    for format in QuantFormat::ALL {
        for (m, n, k) in edge_shapes(format) {
            // Blocks from candle's quantizer, and random bytes in every field.
            for (seed, (q, dense)) in [
                quantized_matrix(n, k, format, 5),
                crate::testing::random_blocks(n, k, format, 7),
            ]
            .into_iter()
            .enumerate()
            {
                let f32_panels = PackedMatrix::pack(&dense, n, k);
                let q_panels = PackedMatrix::pack_quantized(format, &q, n, k).unwrap();
                let x = random_values(m * k, 6);
                let (mut a, mut b) = (vec![0f32; m * n], vec![0f32; m * n]);
                f32_panels.matmul(&x, m, &mut a);
                q_panels.matmul(&x, m, &mut b);
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{format:?} m{m} n{n} k{k} input {seed}: not bit-identical"
                );
                let mut column = vec![0f32; k];
                for c in [0, n / 2, n - 1] {
                    q_panels.dequantize_column(c, &mut column);
                    assert!(
                        column
                            .iter()
                            .zip(&dense[c * k..][..k])
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{format:?} n{n} k{k} input {seed}: column {c} differs from candle's"
                    );
                }
            }
        }
    }
}

/// On AVX-512 CPUs every format runs the wide kernels, so the AVX2 ones (what CPUs without
/// AVX-512 run) are checked against them here directly: same chain of FMAs, same bits.
#[test]
#[cfg(target_arch = "x86_64")]
fn avx2_kernels_equal_the_avx512_ones_bit_for_bit() {
    if !avx512() {
        eprintln!("skipped: no AVX-512 on this CPU, the AVX2 kernels are the only ones here");
        return;
    }
    for format in QuantFormat::ALL {
        for (m, n, k) in edge_shapes(format) {
            let (q, _) = crate::testing::random_blocks(n, k, format, 31);
            let packed = PackedMatrix::pack_quantized(format, &q, n, k).unwrap();
            let x = random_values(m * k, 32);
            let mut wide = vec![0f32; m * n];
            packed.matmul(&x, m, &mut wide);
            let mut narrow = vec![f32::NAN; m * n];
            // SAFETY: `available()` above (AVX-512 implies it here); all of `x`, every panel
            // and all of `narrow` (n columns a row) in one task.
            unsafe {
                packed.columns_avx2(
                    &x,
                    m,
                    0,
                    n.div_ceil(PANEL),
                    DisjointSlice::new(&mut narrow),
                    n,
                    0,
                )
            };
            assert!(
                wide.iter()
                    .zip(&narrow)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{format:?} m{m} n{n} k{k}: the AVX2 and AVX-512 kernels differ"
            );
        }
    }
}

#[test]
fn columns_written_into_a_wider_output_equal_a_matrix_of_their_own() {
    if !available() {
        eprintln!("skipped: no AVX2/FMA/F16C on this CPU, the packed kernel is never used here");
        return;
    }
    // Below AMX's rows, and on AMX tiles (a 32-row block and a partial one; v's columns
    // start mid-group and end past its last full group).
    let runs: &[(usize, bool)] = if amx_available() {
        &[(5, false), (45, true)]
    } else {
        &[(5, false)]
    };
    let k = 512;
    let (q, _) = quantized_matrix(40, k, QuantFormat::Q4K, 3);
    let (v, _) = quantized_matrix(72, k, QuantFormat::Q6K, 4);
    for &(m, amx) in runs {
        let mut q = PackedMatrix::pack_quantized(QuantFormat::Q4K, &q, 40, k).unwrap();
        let mut v = PackedMatrix::pack_quantized(QuantFormat::Q6K, &v, 72, k).unwrap();
        if amx {
            assert!(q.use_amx_dequantizing_from(1) && v.use_amx_dequantizing_from(1));
        }
        let x = random_values(m * k, 9);
        let mut fused = vec![f32::NAN; m * 112];
        q.matmul_into(&x, m, &mut fused, 112, 0);
        v.matmul_into(&x, m, &mut fused, 112, 40);
        let (mut a, mut b) = (vec![0f32; m * 40], vec![0f32; m * 72]);
        q.matmul(&x, m, &mut a);
        v.matmul(&x, m, &mut b);
        for r in 0..m {
            assert_eq!(&fused[r * 112..][..40], &a[r * 40..][..40], "amx {amx}");
            assert_eq!(
                &fused[r * 112 + 40..][..72],
                &b[r * 72..][..72],
                "amx {amx}"
            );
        }
    }
}

/// A decode step's row and the same row inside a prefill or a large batch must come out
/// identical, or a sequence's tokens would depend on what it is batched with.
#[test]
fn a_rows_result_does_not_depend_on_the_row_count() {
    if !available() {
        eprintln!("skipped: no AVX2/FMA/F16C on this CPU, the packed kernel is never used here");
        return;
    }
    let (n, k) = (200, 512);
    let x = random_values(77 * k, 22);
    let (q, dense) = quantized_matrix(n, k, QuantFormat::Q4K, 23);
    let matrices = [
        PackedMatrix::pack(&dense, n, k),
        PackedMatrix::pack_quantized(QuantFormat::Q4K, &q, n, k).unwrap(),
    ];
    for m in &matrices {
        let mut batch = vec![0f32; 77 * n];
        m.matmul(&x, 77, &mut batch);
        for rows in [1, 2, 3, 5, 6, 7, 13] {
            let mut some = vec![0f32; rows * n];
            m.matmul(&x[..rows * k], rows, &mut some);
            assert!(
                some.iter()
                    .zip(&batch)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{:?}: the first {rows} rows differ alone and in a batch of 77",
                m.format()
            );
        }
    }
}

#[test]
fn packed_product_equals_naive() {
    if !available() {
        eprintln!("skipped: no AVX2/FMA/F16C on this CPU, the packed kernel is never used here");
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
        let w = random_values(n * k, 1);
        let x = random_values(m * k, 2);
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
