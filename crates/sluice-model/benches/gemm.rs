//! GEMM throughput on the forward's shapes: our packed AVX-512 kernel against candle's matmul
//! (the gemm crate), and the peak f32 rate of this machine (the largest shape), which bounds
//! batched decode at `peak / (2 x params)` tokens/s. Prints a table; asserts nothing.

use std::time::Instant;

use candle_core::{Device, Tensor};
use sluice_model::dense::{self, PackedMatrix};

fn seconds_per_call(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut calls = 0;
    while calls < 5 || start.elapsed().as_secs_f64() < 0.5 {
        f();
        calls += 1;
    }
    start.elapsed().as_secs_f64() / calls as f64
}

fn main() {
    assert!(dense::available(), "the packed kernel needs AVX-512");
    let dev = Device::Cpu;
    println!("| shape [m,k]x[k,n] | candle ms | candle GFLOP/s | packed ms | packed GFLOP/s |");
    println!("| --- | ---: | ---: | ---: | ---: |");
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
        println!(
            "| [{m},{k}]x[{k},{n}] | {:.3} | {:.0} | {:.3} | {:.0} |",
            candle * 1e3,
            gflop / candle,
            ours * 1e3,
            gflop / ours
        );
    }
}
