//! MXFP4 (gpt-oss's expert weights) against Q4_0 on the same shape: the int8 kernels
//! (`--weights auto`/`quantized`: activations quantized per 32, integer dots, one float step a
//! block) and the exact panels (`--weights exact`), in nanoseconds per weight and the ratio
//! MXFP4 / Q4_0. Shape 2880x2880 (gpt-oss's hidden size) at 1 and 16 rows by default;
//! `SLUICE_BENCH_ROWS=1,4,16,64` and `SLUICE_BENCH_SHAPE=KxN` change them. The two formats are
//! timed in turns, best of `SLUICE_BENCH_ROUNDS` (5) rounds of about 0.3 s each, so that other
//! load on the machine touches both alike. Prints a table; asserts nothing.

use std::time::Instant;

use sluice_kernels::testing::{quantized_matrix, random_values};
use sluice_kernels::{PackedMatrix, QuantFormat, QuantMatrix, QuantizedActivations};

/// Seconds per call of `f`, over about 0.3 s (at least 5 calls).
fn seconds_per_call(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut calls = 0;
    while calls < 5 || start.elapsed().as_secs_f64() < 0.3 {
        f();
        calls += 1;
    }
    start.elapsed().as_secs_f64() / calls as f64
}

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split([',', 'x'])
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}: numbers"))
        })
        .collect()
}

fn main() {
    let rows = env_list("SLUICE_BENCH_ROWS", "1,16");
    let shape = env_list("SLUICE_BENCH_SHAPE", "2880x2880");
    let (k, n) = (shape[0], shape[1]);
    let rounds = env_list("SLUICE_BENCH_ROUNDS", "5")[0];
    let formats = [QuantFormat::Q4_0, QuantFormat::Mxfp4];
    let matrices: Vec<_> = formats
        .iter()
        .map(|&f| {
            // Quantized weights (candle's Q4_0, llama.cpp's MXFP4 rounding), not random bytes:
            // `random_blocks` gives MXFP4 blocks subnormal scales, whose products take the
            // CPU's slow microcode path and would time that instead of the kernel.
            let (bytes, _) = quantized_matrix(n, k, f, 1);
            let int8 = QuantMatrix::new(f, bytes.clone(), n, k).expect("an int8 kernel");
            let exact = PackedMatrix::pack_quantized(f, &bytes, n, k).expect("panels");
            (int8, exact)
        })
        .collect();
    println!(
        "{} threads, [m,{k}]x[{k},{n}], best of {rounds} rounds; ns per weight (m * k * n)",
        rayon::current_num_threads()
    );
    println!("| rows | path | Q4_0 ns/weight | MXFP4 ns/weight | MXFP4 / Q4_0 |");
    println!("| ---: | --- | ---: | ---: | ---: |");
    for &m in &rows {
        let x = random_values(m * k, 2);
        let mut out = vec![0f32; m * n];
        let mut acts = QuantizedActivations::default();
        // [format][path]: int8 (quantizing the activations included), exact.
        let mut best = [[f64::INFINITY; 2]; 2];
        for _ in 0..rounds {
            for (f, (int8, exact)) in matrices.iter().enumerate() {
                let t = seconds_per_call(|| {
                    acts.quantize(&x, m, k, int8.activation_blocks());
                    int8.matmul(&acts, &mut out);
                });
                best[f][0] = best[f][0].min(t);
                let t = seconds_per_call(|| exact.matmul(&x, m, &mut out));
                best[f][1] = best[f][1].min(t);
            }
        }
        let weights = (m * k * n) as f64;
        for (p, path) in ["int8", "exact"].iter().enumerate() {
            let (q4, fp4) = (best[0][p] / weights * 1e9, best[1][p] / weights * 1e9);
            println!("| {m} | {path} | {q4:.4} | {fp4:.4} | {:.3} |", fp4 / q4);
        }
    }
}
