//! Compares candle's matmul with the packed kernel on the forward's shapes.
use candle_core::{Device, Tensor};
use sluice_model::dense::PackedMatrix;
use std::time::Instant;
fn main() {
    let dev = Device::Cpu;
    for &(m, k, n) in &[
        (1usize, 576usize, 960usize),
        (8, 576, 3072),
        (64, 576, 960),
        (64, 576, 3072),
        (64, 1536, 576),
        (64, 576, 49152),
        (512, 576, 3072),
        (512, 1536, 576),
    ] {
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let packed = PackedMatrix::pack(&w.flatten_all().unwrap().to_vec1::<f32>().unwrap(), n, k);
        let xv = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut out = vec![0f32; m * n];
        let time = |f: &mut dyn FnMut()| {
            f();
            let t = Instant::now();
            let r = 20;
            for _ in 0..r {
                f();
            }
            t.elapsed().as_secs_f64() / r as f64
        };
        let a = time(&mut || {
            x.matmul(&w.t().unwrap()).unwrap();
        });
        let b = time(&mut || packed.matmul(&xv, m, &mut out));
        let flops = 2.0 * (m * k * n) as f64;
        println!(
            "[{m},{k}]x[{k},{n}]: candle {:.3} ms ({:.0} GF/s), packed {:.3} ms ({:.0} GF/s)",
            a * 1e3,
            flops / a / 1e9,
            b * 1e3,
            flops / b / 1e9
        );
    }
}
