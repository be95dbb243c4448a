//! Deterministic inputs and oracles for kernel tests (this crate's and the model's); compiled
//! only for tests and with the `testing` feature.

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
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
///
/// # Panics
/// For MXFP4, which candle (0.11) does not have: [`random_blocks`] and [`quantized_matrix`]
/// build its oracles with this crate's reference instead.
pub fn ggml_dtype(format: QuantFormat) -> GgmlDType {
    match format {
        QuantFormat::Q4_0 => GgmlDType::Q4_0,
        QuantFormat::Q4_1 => GgmlDType::Q4_1,
        QuantFormat::Q5_0 => GgmlDType::Q5_0,
        QuantFormat::Q5_1 => GgmlDType::Q5_1,
        QuantFormat::Q8_0 => GgmlDType::Q8_0,
        QuantFormat::Q4K => GgmlDType::Q4K,
        QuantFormat::Q5K => GgmlDType::Q5K,
        QuantFormat::Q6K => GgmlDType::Q6K,
        QuantFormat::Mxfp4 => panic!("candle has no MXFP4"),
    }
}

/// `values` (whole blocks of 32) quantized to MXFP4 as llama.cpp's `quantize_row_mxfp4_ref`
/// does: `e = floor(log2(amax)) - 2 + 127`, each weight the nearest of
/// [`E2M1_VALUES`](crate::quant_format::E2M1_VALUES) times `e8m0_half(e)`, the first on a tie.
pub fn quantize_mxfp4(values: &[f32]) -> Vec<u8> {
    use crate::quant_format::{e8m0_half, E2M1_VALUES};
    assert!(values.len().is_multiple_of(32), "whole blocks");
    let mut out = Vec::with_capacity(values.len() / 32 * 17);
    for block in values.chunks_exact(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        let best = |x: f32| {
            let err = |i: usize| (E2M1_VALUES[i] as f32 * d - x).abs();
            (1..16).fold(0, |b, i| if err(i) < err(b) { i } else { b }) as u8
        };
        out.push(e);
        for j in 0..16 {
            out.push(best(block[j]) | best(block[j + 16]) << 4);
        }
    }
    out
}

/// `bytes` of `format` blocks dequantized by this crate's reference
/// ([`QuantFormat::dequantize`]).
fn dequantized(bytes: &[u8], format: QuantFormat) -> Vec<f32> {
    let mut dense = vec![0f32; bytes.len() / format.block_bytes() * format.block_weights()];
    format.dequantize(bytes, &mut dense);
    dense
}

/// A `[n, k]` matrix of random GGUF blocks of `format` (every quant, scale and high bit random;
/// the f16 scales finite, of either sign), and the f32 values candle dequantizes them to (MXFP4's
/// by [`QuantFormat::dequantize`], checked against the `gguf` package's reference): the bit
/// patterns a quantizer may never write are covered too.
pub fn random_blocks(n: usize, k: usize, format: QuantFormat, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let gb = format.block_bytes();
    let blocks = n * k / format.block_weights();
    let noise = random_values(blocks * gb, seed);
    let mut bytes: Vec<u8> = noise.iter().map(|v| ((v + 1.0) * 128.0) as u8).collect();
    let scales = random_values(blocks * 2, seed ^ 0x5EED);
    if format == QuantFormat::Mxfp4 {
        // Scales 2^-12 .. 2^3 (weights up to 12 times that), and in every ninth block one of
        // E8M0's subnormal halves (e = 0, 1) or the first normal one (2).
        for (b, block) in bytes.chunks_exact_mut(gb).enumerate() {
            block[0] = if b % 9 == 4 {
                (b / 9 % 3) as u8
            } else {
                116 + block[0] % 16
            };
        }
        let dense = dequantized(&bytes, format);
        return (bytes, dense);
    }
    let f16_at: &[usize] = match format {
        QuantFormat::Q6K => &[208],
        QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => &[0],
        _ => &[0, 2],
    };
    for (b, block) in bytes.chunks_exact_mut(gb).enumerate() {
        for (i, &at) in f16_at.iter().enumerate() {
            let v = half::f16::from_f32(scales[2 * b + i] * 0.05);
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    let storage = QStorage::from_data(Cow::Borrowed(&bytes), &Device::Cpu, ggml_dtype(format))
        .expect("whole blocks");
    let dense = QTensor::new(storage, (n, k))
        .and_then(|q| q.dequantize(&Device::Cpu))
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .expect("a CPU tensor dequantizes");
    (bytes, dense)
}

/// A random `[n, k]` matrix quantized to `format` by candle (MXFP4, which candle lacks, by
/// [`quantize_mxfp4`]; its GGUF blocks, row by row), and the f32 values it dequantizes to: the reference every quantized kernel's products are
/// checked against.
pub fn quantized_matrix(n: usize, k: usize, format: QuantFormat, seed: u64) -> (Vec<u8>, Vec<f32>) {
    if format == QuantFormat::Mxfp4 {
        let bytes = quantize_mxfp4(&random_values(n * k, seed));
        let dense = dequantized(&bytes, format);
        return (bytes, dense);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `dequantize` is the reference for every format: candle's dequantizer (ggml's) on random
    /// blocks, bit for bit; for MXFP4, which candle lacks, `quant_format`'s fixture test.
    #[test]
    fn dequantize_equals_candles_for_its_formats() {
        for format in QuantFormat::ALL
            .into_iter()
            .filter(|&f| f != QuantFormat::Mxfp4)
        {
            let (n, k) = (3, 2 * format.block_weights());
            let (bytes, dense) = random_blocks(n, k, format, 17);
            let mut got = vec![f32::NAN; n * k];
            format.dequantize(&bytes, &mut got);
            assert!(
                got.iter()
                    .zip(&dense)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{format:?}"
            );
        }
    }
}
