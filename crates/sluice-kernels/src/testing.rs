//! Deterministic inputs and oracles for kernel tests (this crate's and the model's); compiled
//! only for tests and with the `testing` feature.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use crate::QuantFormat;

/// `n` values in [-1, 1), the same for the same seed (SplitMix64).
pub fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// The candle dtype of a kernel format, for building oracles with candle's quantizer.
pub fn ggml_dtype(format: QuantFormat) -> GgmlDType {
    match format {
        QuantFormat::Q4_0 => GgmlDType::Q4_0,
        QuantFormat::Q4_1 => GgmlDType::Q4_1,
        QuantFormat::Q8_0 => GgmlDType::Q8_0,
    }
}

/// A random `[n, k]` matrix quantized to `format` by candle (its GGUF blocks, row by row), and
/// the f32 values it dequantizes to: the reference every quantized kernel's products are
/// checked against.
pub fn quantized_matrix(n: usize, k: usize, format: QuantFormat, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let w =
        Tensor::from_vec(random_values(n * k, seed), (n, k), &Device::Cpu).expect("sizes agree");
    let q = QTensor::quantize(&w, ggml_dtype(format)).expect("k is a multiple of the block size");
    let dense = q
        .dequantize(&Device::Cpu)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .expect("a CPU tensor dequantizes");
    let bytes = q.data().expect("a CPU tensor has bytes").into_owned();
    (bytes, dense)
}
