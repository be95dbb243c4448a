//! Linear layers and the weight representations a forward can run with.

use std::borrow::Cow;
use std::str::FromStr;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use sluice_kernels::cpu::gemm;
use sluice_kernels::{PackedMatrix, QuantFormat, QuantMatrix, QuantizedActivations};

use crate::error::{ModelError, Result};

/// How weights are held in memory and multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsKind {
    /// Dequantized to f32 at load: dense gemm amortises weight reads over a batch.
    F32,
    /// Dequantized to f16: half the memory of f32, f16 gemm.
    F16,
    /// The file's quantized blocks, multiplied with candle's quantized matmul: least memory.
    Quantized,
    /// The fastest exact-enough path for each step size. Small steps (bound by reading weights)
    /// read the file's Q4_0/Q4_1/Q8_0 blocks, dequantized in registers with the f32 kernel's
    /// arithmetic (identical results). Large steps (bound by arithmetic) run on AMX tiles where
    /// the CPU has them (split-bf16 products, relative error about 2^-16, see `sluice_kernels::cpu::amx`),
    /// else on the f32 panels. Formats without quantized panels use the tiles for every step,
    /// or the f32 panels without AMX.
    Auto,
}

impl WeightsKind {
    pub const NAMES: &'static [&'static str] = &["f32", "f16", "quantized", "auto"];
}

impl FromStr for WeightsKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "quantized" | "q" => Ok(Self::Quantized),
            "auto" => Ok(Self::Auto),
            _ => Err(format!(
                "unknown weights kind `{s}` (expected one of {})",
                Self::NAMES.join(", ")
            )),
        }
    }
}

impl std::fmt::Display for WeightsKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Quantized => "quantized",
            Self::Auto => "auto",
        })
    }
}

/// What building a linear layer needs: the [`LoadOptions`](crate::load::LoadOptions) that
/// concern weights.
#[derive(Debug, Clone)]
pub struct LinearOptions {
    pub kind: WeightsKind,
    pub device: Device,
    /// See [`LoadOptions::amx_min_rows`](crate::load::LoadOptions::amx_min_rows).
    pub amx_min_rows: Option<usize>,
}

/// The kernel format of a GGUF block type, where our kernels read it in place.
fn kernel_format(dtype: GgmlDType) -> Option<QuantFormat> {
    match dtype {
        GgmlDType::Q4_0 => Some(QuantFormat::Q4_0),
        GgmlDType::Q4_1 => Some(QuantFormat::Q4_1),
        GgmlDType::Q8_0 => Some(QuantFormat::Q8_0),
        _ => None,
    }
}

/// A 2-D GGUF matrix in a kernel format: its format, bytes, rows and columns.
fn kernel_blocks(w: &QTensor) -> Option<(QuantFormat, Cow<'_, [u8]>, usize, usize)> {
    let format = kernel_format(w.dtype())?;
    let (rows, cols) = w.shape().dims2().ok()?;
    let data = w.data().ok()?;
    Some((format, data, rows, cols))
}

/// `y = x W^T (+ b)` for `x: [T, in]`, `W: [out, in]`.
pub struct Linear {
    dense: Option<DenseWeights>,
    quantized: Option<QuantizedWeights>,
    bias: Option<Tensor>,
    /// With both representations present, steps of at most this many rows use the quantized one.
    quantized_max_rows: usize,
    out_features: usize,
}

enum DenseWeights {
    /// f32 packed for our AVX-512 kernel (CPU).
    Packed(PackedMatrix),
    /// A candle tensor: f16, or any device without the packed kernel.
    Tensor(Tensor),
}

enum QuantizedWeights {
    /// Quantized panels dequantized in registers into the f32 kernel's exact arithmetic
    /// ([`WeightsKind::Auto`]): f32 results, a fraction of the bytes.
    Exact(PackedMatrix),
    /// Our int8-dot kernels for the formats they cover.
    Ours(QuantMatrix),
    /// candle's quantized matmul for every other format.
    Candle(QMatMul),
}

/// Rows at or below which [`WeightsKind::Auto`] reads the quantized panels. Measured on the
/// default model (2 cores, quiet machine): they win clearly up to 8 rows (28 vs 39 ms), tie at
/// 16, and lose from 24 (79 vs 75 ms) as dequantizing costs more than the bytes it saves.
pub const AUTO_QUANTIZED_MAX_ROWS: usize = 16;

/// Rows from which [`WeightsKind::Auto`] multiplies on AMX tiles where the CPU has them
/// (`sluice_kernels::cpu::amx`: split-bf16 products, relative error about 2^-16). Below it, steps read the
/// quantized panels with the f32 kernel's exact numbers: at 32 rows both cost about the same
/// (the panels' FMAs against reading the tiles' 4 bytes per weight).
pub const AUTO_AMX_MIN_ROWS: usize = 32;

thread_local! {
    static ACTIVATIONS: std::cell::RefCell<QuantizedActivations> = std::cell::RefCell::new(QuantizedActivations::default());
}

impl Linear {
    pub fn from_qtensor(w: QTensor, bias: Option<Tensor>, options: &LinearOptions) -> Result<Self> {
        let (kind, device) = (options.kind, &options.device);
        let out_features = w.shape().dims()[0];
        let quantized = |w: QTensor| -> Result<QuantizedWeights> {
            let ours = kernel_blocks(&w).filter(|_| device.is_cpu()).and_then(
                |(format, data, rows, cols)| {
                    QuantMatrix::new(format, data.into_owned(), rows, cols)
                },
            );
            Ok(match ours {
                Some(m) => QuantizedWeights::Ours(m),
                None => QuantizedWeights::Candle(QMatMul::from_qtensor(w)?),
            })
        };
        let dense_f32 = |w: &QTensor| -> Result<DenseWeights> {
            if device.is_cpu() && gemm::available() {
                let (n, k) = w.shape().dims2()?;
                let data = w
                    .dequantize(&Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                Ok(DenseWeights::Packed(PackedMatrix::pack(&data, n, k)))
            } else {
                Ok(DenseWeights::Tensor(w.dequantize(device)?))
            }
        };
        let (dense, quantized) = match kind {
            WeightsKind::F32 => (Some(dense_f32(&w)?), None),
            WeightsKind::F16 => (Some(DenseWeights::Tensor(w.dequantize_f16(device)?)), None),
            WeightsKind::Quantized => (None, Some(quantized(w)?)),
            WeightsKind::Auto => {
                // Small steps read the quantized panels; both paths give the same numbers, so
                // a sequence's output never depends on what else is in the batch.
                let mut exact = kernel_blocks(&w)
                    .filter(|_| device.is_cpu() && gemm::available())
                    .and_then(|(format, data, n, k)| {
                        PackedMatrix::pack_quantized(format, &data, n, k)
                    });
                // With AMX, large steps dequantize the same panels into tiles at each call, and
                // the f32 panels are not needed at all. Holding the tiles instead (4 bytes per
                // weight) made 64-row steps no faster, as they then read 7x the bytes.
                let amx = match (exact.as_mut(), options.amx_min_rows) {
                    (Some(q), Some(min_rows)) => q.use_amx_dequantizing_from(min_rows),
                    _ => false,
                };
                match exact {
                    Some(q) if amx => (None, Some(QuantizedWeights::Exact(q))),
                    exact => {
                        let mut dense = dense_f32(&w)?;
                        if let (DenseWeights::Packed(d), Some(_), None) =
                            (&mut dense, options.amx_min_rows, &exact)
                        {
                            // No quantized panels for small steps (K-quants, f16/f32 tensors):
                            // every step on the tiles rather than the tiles and f32 panels both.
                            d.use_amx_only();
                        }
                        (Some(dense), exact.map(QuantizedWeights::Exact))
                    }
                }
            }
        };
        Ok(Self {
            dense,
            quantized,
            bias,
            quantized_max_rows: AUTO_QUANTIZED_MAX_ROWS,
            out_features,
        })
    }

    /// A layer from a dense `[out, in]` tensor (f32, f16 or bf16, as Hugging Face checkpoints
    /// hold them), by the same policy as [`from_qtensor`](Self::from_qtensor): `f32` packs f32
    /// panels, `auto` too, or where the CPU has AMX tiles for every step (there are no
    /// quantized blocks to read for small ones), `f16` keeps an f16 tensor, and `quantized` quantizes to Q8_0 at load
    /// (the file has no blocks of its own) and multiplies as for a GGUF file.
    pub fn from_tensor(w: Tensor, bias: Option<Tensor>, options: &LinearOptions) -> Result<Self> {
        let (kind, device) = (options.kind, &options.device);
        let (n, k) = w.dims2()?;
        let dense = match kind {
            WeightsKind::F32 | WeightsKind::Auto if device.is_cpu() && gemm::available() => {
                let data = w
                    .to_device(&Device::Cpu)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                let mut packed = PackedMatrix::pack(&data, n, k);
                if let (WeightsKind::Auto, Some(_)) = (kind, options.amx_min_rows) {
                    // As for GGUF formats without quantized panels: tiles only.
                    packed.use_amx_only();
                }
                DenseWeights::Packed(packed)
            }
            WeightsKind::F32 | WeightsKind::Auto => {
                DenseWeights::Tensor(w.to_dtype(DType::F32)?.to_device(device)?)
            }
            WeightsKind::F16 => DenseWeights::Tensor(w.to_dtype(DType::F16)?.to_device(device)?),
            WeightsKind::Quantized => {
                let dtype = if k.is_multiple_of(GgmlDType::Q8_0.block_size()) {
                    GgmlDType::Q8_0
                } else {
                    GgmlDType::F32
                };
                let w = w.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
                return Self::from_qtensor(QTensor::quantize(&w, dtype)?, bias, options);
            }
        };
        Ok(Self {
            dense: Some(dense),
            quantized: None,
            bias,
            quantized_max_rows: AUTO_QUANTIZED_MAX_ROWS,
            out_features: n,
        })
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.dim(0)?;
        let y = match (&self.dense, &self.quantized) {
            (Some(_), Some(q)) if rows <= self.quantized_max_rows => q.forward(x)?,
            (Some(d), _) => d.forward(x)?,
            (None, Some(q)) => q.forward(x)?,
            (None, None) => unreachable!("a Linear always holds at least one representation"),
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// `[t, cols]` f32 rows of a CPU tensor, borrowed.
fn with_cpu_rows<R>(x: &Tensor, f: impl FnOnce(&[f32], usize, usize) -> R) -> Result<R> {
    let (t, cols) = x.dims2()?;
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    let (storage, layout) = x.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return Err(ModelError::NotOnCpu("a linear layer's input"));
    };
    let data = &cpu.as_slice::<f32>()?[layout.start_offset()..][..t * cols];
    Ok(f(data, t, cols))
}

fn packed_forward(m: &PackedMatrix, x: &Tensor) -> Result<Tensor> {
    let t = x.dim(0)?;
    let mut out = vec![0f32; t * m.out_features()];
    with_cpu_rows(x, |data, t, _| m.matmul(data, t, &mut out))?;
    Ok(Tensor::from_vec(out, (t, m.out_features()), x.device())?)
}

impl DenseWeights {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Packed(m) => packed_forward(m, x),
            Self::Tensor(w) if w.dtype() == DType::F16 => Ok(x
                .to_dtype(DType::F16)?
                .matmul(&w.t()?)?
                .to_dtype(x.dtype())?),
            Self::Tensor(w) => Ok(x.matmul(&w.t()?)?),
        }
    }
}

impl QuantizedWeights {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Candle(q) => Ok(q.forward(x)?),
            Self::Exact(m) => packed_forward(m, x),
            Self::Ours(m) => {
                let t = x.dim(0)?;
                let mut out = vec![0f32; t * m.rows()];
                with_cpu_rows(x, |data, t, cols| {
                    ACTIVATIONS.with(|acts| {
                        let mut acts = acts.borrow_mut();
                        acts.quantize(data, t, cols);
                        m.matmul(&acts, &mut out);
                    })
                })?;
                Ok(Tensor::from_vec(out, (t, m.rows()), x.device())?)
            }
        }
    }
}

/// Rewrites a quantized (or plain) matrix through its raw rows. Rows are the output features;
/// each is a whole number of quantization blocks, so moving rows never re-quantizes.
fn map_rows(
    tensors: &[&QTensor],
    rows_out: usize,
    f: impl Fn(usize) -> (usize, usize),
) -> Result<QTensor> {
    let dtype = tensors[0].dtype();
    let cols = tensors[0].shape().dims()[1];
    let datas: Vec<Cow<'_, [u8]>> = tensors
        .iter()
        .map(|t| t.data())
        .collect::<candle_core::Result<_>>()?;
    let row_bytes = datas[0].len() / tensors[0].shape().dims()[0];
    let mut out = Vec::with_capacity(rows_out * row_bytes);
    for r in 0..rows_out {
        let (src, src_row) = f(r);
        out.extend_from_slice(&datas[src][src_row * row_bytes..(src_row + 1) * row_bytes]);
    }
    let storage = QStorage::from_data(Cow::Owned(out), &tensors[0].device(), dtype)?;
    Ok(QTensor::new(storage, (rows_out, cols))?)
}

/// Undoes the row permutation that llama.cpp's converter applies to llama Q/K weights, so
/// that the half-split ("NeoX") rotary convention applies to every architecture alike. GGUF row
/// `h*D + 2j + s` holds original row `h*D + s*D/2 + j`.
pub fn unpermute_qk(w: &QTensor, num_heads: usize, head_dim: usize) -> Result<QTensor> {
    let rows = w.shape().dims()[0];
    if rows != num_heads * head_dim {
        return Err(ModelError::WeightLayout(format!(
            "Q/K weight has {rows} rows, expected {num_heads} heads x {head_dim}"
        )));
    }
    let half = head_dim / 2;
    map_rows(&[w], rows, |r| {
        let (h, within) = (r / head_dim, r % head_dim);
        let (s, j) = (within / half, within % half);
        (0, h * head_dim + 2 * j + s)
    })
}

/// Stacks matrices with the same input size and format along the output dimension, so one
/// matmul computes several projections (Q, K, V; gate and up).
///
/// Files that mix formats across the fused matrices (Q4_K_M stores V as Q6_K) are re-quantized
/// to Q8_0, which is at least as precise as any 4-6 bit format, or kept as f32.
pub fn concat_rows(ws: &[&QTensor]) -> Result<QTensor> {
    let cols = ws[0].shape().dims()[1];
    if let Some(w) = ws.iter().find(|w| w.shape().dims()[1] != cols) {
        return Err(ModelError::WeightLayout(format!(
            "cannot fuse {:?} with {:?}: input sizes differ",
            w.shape(),
            ws[0].shape()
        )));
    }
    if ws.iter().any(|w| w.dtype() != ws[0].dtype()) {
        let device = ws[0].device();
        let dense: Vec<Tensor> = ws
            .iter()
            .map(|w| w.dequantize(&device))
            .collect::<candle_core::Result<_>>()?;
        let dense = Tensor::cat(&dense, 0)?;
        let dtype = if cols.is_multiple_of(GgmlDType::Q8_0.block_size()) {
            GgmlDType::Q8_0
        } else {
            GgmlDType::F32
        };
        return Ok(QTensor::quantize(&dense, dtype)?);
    }
    let offsets: Vec<usize> = ws
        .iter()
        .scan(0, |acc, w| {
            let start = *acc;
            *acc += w.shape().dims()[0];
            Some(start)
        })
        .collect();
    let total: usize = ws.iter().map(|w| w.shape().dims()[0]).sum();
    map_rows(ws, total, |r| {
        let i = offsets.iter().rposition(|&o| o <= r).unwrap_or(0);
        (i, r - offsets[i])
    })
}
