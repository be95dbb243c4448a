use candle_core::{Device, Tensor};
use std::time::Instant;
fn main() {
    let dev = Device::Cpu;
    for &(m, k, n) in &[
        (1usize, 576usize, 1536usize),
        (8, 576, 1536),
        (64, 576, 1536),
        (64, 576, 3072),
        (512, 576, 3072),
        (64, 576, 49152),
    ] {
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let wt = w.t().unwrap().contiguous().unwrap();
        let time = |f: &dyn Fn() -> Tensor| {
            f();
            let t = Instant::now();
            let r = 20;
            for _ in 0..r {
                f();
            }
            t.elapsed().as_secs_f64() / r as f64
        };
        let a = time(&|| x.matmul(&w.t().unwrap()).unwrap());
        let b = time(&|| x.matmul(&wt).unwrap());
        let flops = 2.0 * (m * k * n) as f64;
        println!("[{m},{k}]x[{k},{n}]: W^T view {:.3} ms ({:.0} GF/s), pre-transposed {:.3} ms ({:.0} GF/s)", a * 1e3, flops / a / 1e9, b * 1e3, flops / b / 1e9);
    }
}
