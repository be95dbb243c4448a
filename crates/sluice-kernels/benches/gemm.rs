//! The machine's memory read bandwidth (what bounds a single stream's decode), then GEMM
//! throughput on the forward's shapes: our packed AVX-512 kernel against candle's matmul
//! (the gemm crate), and the peak f32 rate of this machine (the largest shape), which bounds
//! batched decode at `peak / (2 x params)` tokens/s; and, where the CPU has AMX, the split-bf16
//! tile kernel from f32 panels and from Q4_1 panels (what `--weights auto` runs for large steps).
//! Then the quantized formats of Q4_K_M files on Qwen2.5-1.5B's shapes: the exact quantized
//! panels (`--weights auto`), our int8 kernels (`--weights quantized`) and candle's quantized
//! matmul, in GB/s of weights read and GFLOP/s. `SLUICE_BENCH_ONLY=quant` runs only that table.
//! Prints tables; asserts nothing.

// getrusage through libc, for the CPU-time mode below.
#![allow(unsafe_code)]

use std::time::Instant;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Module;
use candle_core::{Device, Tensor};
use sluice_kernels::cpu::{amx, gemm};
use sluice_kernels::testing::{ggml_dtype, random_blocks, random_values};
use sluice_kernels::{PackedMatrix, QuantFormat, QuantMatrix, QuantizedActivations};

/// CPU time this process has used (all threads).
fn cpu_time() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Seconds per call: wall time, or with `SLUICE_BENCH_CPU_TIME=1` the process's CPU time,
/// which other load on a busy host barely moves (run it with `RAYON_NUM_THREADS=1`, or idle
/// workers' spinning counts too).
fn seconds_per_call(mut f: impl FnMut()) -> f64 {
    let cpu = std::env::var("SLUICE_BENCH_CPU_TIME").as_deref() == Ok("1");
    f();
    let start = Instant::now();
    let cpu_start = cpu_time();
    let mut calls = 0;
    while calls < 5 || start.elapsed().as_secs_f64() < 0.5 {
        f();
        calls += 1;
    }
    if cpu {
        (cpu_time() - cpu_start) / calls as f64
    } else {
        start.elapsed().as_secs_f64() / calls as f64
    }
}

/// The machine's read bandwidth in GB/s: every thread of the pool sums its share of a 1 GiB
/// array, best of five. A decode step of one sequence reads every weight once, so this bounds
/// single-stream speed at `bandwidth / bytes of weights` tokens/s.
fn read_bandwidth() -> f64 {
    use rayon::prelude::*;
    let data = vec![1.0f32; 1 << 28];
    let chunk = data.len() / rayon::current_num_threads();
    (0..5)
        .map(|_| {
            let start = Instant::now();
            let total: f32 = data
                .par_chunks(chunk)
                .map(|part| {
                    // Eight independent sums, so the loop vectorizes and is bound by loads.
                    let mut acc = [0f32; 8];
                    for v in part.chunks_exact(8) {
                        for (a, x) in acc.iter_mut().zip(v) {
                            *a += x;
                        }
                    }
                    acc.iter().sum::<f32>()
                })
                .sum();
            std::hint::black_box(total);
            (data.len() * 4) as f64 / start.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

fn main() {
    assert!(
        gemm::available(),
        "the packed kernel needs AVX2, FMA and F16C"
    );
    if std::env::var("SLUICE_BENCH_ONLY").as_deref() == Ok("quant") {
        quantized_table();
        return;
    }
    println!(
        "read bandwidth ({} threads, 1 GiB, best of 5): {:.1} GB/s\n",
        rayon::current_num_threads(),
        read_bandwidth()
    );
    let dev = Device::Cpu;
    let amx = amx::available();
    println!(
        "| shape [m,k]x[k,n] | candle ms | candle GFLOP/s | packed ms | packed GFLOP/s | AMX f32-panels ms | GFLOP/s | AMX Q4_1 tiled at load ms | GFLOP/s | AMX Q4_1 dequantized per call ms | GFLOP/s |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let shapes = [
        (1usize, 576usize, 960usize),
        (8, 576, 3072),
        (64, 576, 960),
        (64, 576, 3072),
        (64, 1536, 576),
        (64, 576, 49152),
        (512, 576, 3072),
        (512, 1536, 576),
        (1024, 1024, 4096),
    ];
    for (m, k, n) in shapes {
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let packed = PackedMatrix::pack(&w.flatten_all().unwrap().to_vec1::<f32>().unwrap(), n, k);
        let xv = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut out = vec![0f32; m * n];
        let candle = seconds_per_call(|| {
            x.matmul(&w.t().unwrap()).unwrap();
        });
        let ours = seconds_per_call(|| packed.matmul(&xv, m, &mut out));
        let gflop = 2.0 * (m * k * n) as f64 / 1e9;
        let (tiles, q_tiles, q_dequant) = if amx {
            let mut f32_tiles =
                PackedMatrix::pack(&w.flatten_all().unwrap().to_vec1::<f32>().unwrap(), n, k);
            f32_tiles.use_amx_from(1);
            let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
            let q = q.data().unwrap();
            let mut q_tiles = PackedMatrix::pack_quantized(QuantFormat::Q4_1, &q, n, k).unwrap();
            q_tiles.use_amx_from(1);
            let mut q_dequant = PackedMatrix::pack_quantized(QuantFormat::Q4_1, &q, n, k).unwrap();
            q_dequant.use_amx_dequantizing_from(1);
            (
                seconds_per_call(|| f32_tiles.matmul(&xv, m, &mut out)),
                seconds_per_call(|| q_tiles.matmul(&xv, m, &mut out)),
                seconds_per_call(|| q_dequant.matmul(&xv, m, &mut out)),
            )
        } else {
            (f64::NAN, f64::NAN, f64::NAN)
        };
        println!(
            "| [{m},{k}]x[{k},{n}] | {:.3} | {:.0} | {:.3} | {:.0} | {:.3} | {:.0} | {:.3} | {:.0} | {:.3} | {:.0} |",
            candle * 1e3,
            gflop / candle,
            ours * 1e3,
            gflop / ours,
            tiles * 1e3,
            gflop / tiles,
            q_tiles * 1e3,
            gflop / q_tiles,
            q_dequant * 1e3,
            gflop / q_dequant
        );
    }
}

/// Quantized matrices as the project's models hold them: Qwen2.5-1.5B's fused gate/up and down
/// projection in Q4_K, a Q6_K down projection (and the same shape in Q5_K, as Q5_K_M files hold
/// it), the 0.5B's Q5_0 and Q8_0, SmolLM2's Q4_1; at 1,
/// 16 and 64 rows (or `SLUICE_BENCH_ROWS`).
fn quantized_table() {
    println!(
        "| format | shape [m,k]x[k,n] | exact panels ms | GB/s | GFLOP/s | int8 ms | GB/s | GFLOP/s | candle ms | GB/s | GFLOP/s |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let shapes = [
        (QuantFormat::Q4K, 1536usize, 17920usize),
        (QuantFormat::Q4K, 8960, 1536),
        (QuantFormat::Q6K, 8960, 1536),
        (QuantFormat::Q5K, 8960, 1536),
        // Qwen2.5-0.5B's Q5_0 and Q8_0 matrices (896 columns are no whole super-block), and
        // SmolLM2's Q4_1 gate/up.
        (QuantFormat::Q5_0, 896, 1152),
        (QuantFormat::Q8_0, 896, 4864),
        (QuantFormat::Q4_1, 576, 3072),
    ];
    // `SLUICE_BENCH_ROWS=1,2,3,4` for the few-row steps of speculative decoding.
    let rows: Vec<usize> = std::env::var("SLUICE_BENCH_ROWS")
        .unwrap_or_else(|_| "1,16,64".into())
        .split(',')
        .map(|m| m.trim().parse().expect("SLUICE_BENCH_ROWS: row counts"))
        .collect();
    for (format, k, n) in shapes {
        let (bytes, _) = random_blocks(n, k, format, 1);
        let panels = PackedMatrix::pack_quantized(format, &bytes, n, k).expect("a panel format");
        let int8 = QuantMatrix::new(format, bytes.clone(), n, k).expect("an int8 format");
        let storage = candle_core::quantized::QStorage::from_data(
            std::borrow::Cow::Borrowed(&bytes),
            &Device::Cpu,
            ggml_dtype(format),
        )
        .unwrap();
        let qmatmul =
            candle_core::quantized::QMatMul::from_qtensor(QTensor::new(storage, (n, k)).unwrap())
                .unwrap();
        for &m in &rows {
            let x = random_values(m * k, 2);
            let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
            let mut out = vec![0f32; m * n];
            let exact = seconds_per_call(|| panels.matmul(&x, m, &mut out));
            let mut acts = QuantizedActivations::default();
            let ours = seconds_per_call(|| {
                acts.quantize(&x, m, k, int8.activation_blocks());
                int8.matmul(&acts, &mut out);
            });
            let candle = seconds_per_call(|| {
                qmatmul.forward(&xt).unwrap();
            });
            let gb = bytes.len() as f64 / 1e9;
            let gflop = 2.0 * (m * k * n) as f64 / 1e9;
            let cols = |t: f64| format!("{:.3} | {:.1} | {:.0}", t * 1e3, gb / t, gflop / t);
            println!(
                "| {} | [{m},{k}]x[{k},{n}] | {} | {} | {} |",
                format.name(),
                cols(exact),
                cols(ours),
                cols(candle)
            );
        }
    }
}
