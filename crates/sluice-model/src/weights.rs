//! Linear layers and the weight representations a forward can run with.

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::Arc;

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
    /// Dequantized to bf16: half the memory of f32 with f32's range, bf16 gemm (cuBLAS on a
    /// GPU, where it is the dense alternative to candle's quantized matmul).
    Bf16,
    /// The file's quantized blocks, multiplied with candle's quantized matmul: least memory.
    Quantized,
    /// One arithmetic per format, at every step size (the rule of docs/design.md: a row's
    /// result never depends on the step's size, the other rows or which kernel ran):
    /// - the K-quants (Q4_K, Q5_K, Q6_K) and the legacy formats (Q4_0, Q4_1, Q5_0, Q5_1,
    ///   Q8_0): llama.cpp's integer arithmetic, as [`WeightsKind::Quantized`] (the file's
    ///   blocks regrouped into panels of 16 rows, activations rounded to int8 per 256 for the
    ///   K-quants and per 32 for the legacy formats; measured faster than the exact f32 panels
    ///   at every step size);
    /// - f32/f16/bf16 matrices: f32 panels (AMX's split-bf16 tiles, about 2^-16 from them,
    ///   only when [`LoadOptions::amx_min_rows`](crate::LoadOptions) asks);
    /// - other formats (Q2_K, Q3_K): candle's quantized matmul.
    ///
    /// On a GPU, [`WeightsKind::Bf16`] ([`crate::LoadOptions::effective_weights`]).
    Auto,
    /// `f32`'s results, bit for bit, at about the file's memory: every quantized format our
    /// kernels read regrouped at load into 16-column panels and dequantized in registers with
    /// the reference arithmetic (the f32 kernel's FMA chain); f32/f16 matrices as f32 panels;
    /// other formats (Q2_K, Q3_K) on candle's quantized matmul. Slower than `auto`'s int8. On
    /// a GPU, [`WeightsKind::F32`].
    Exact,
}

impl WeightsKind {
    pub const NAMES: &'static [&'static str] =
        &["f32", "f16", "bf16", "quantized", "auto", "exact"];
}

impl FromStr for WeightsKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "bf16" => Ok(Self::Bf16),
            "quantized" | "q" => Ok(Self::Quantized),
            "auto" => Ok(Self::Auto),
            "exact" => Ok(Self::Exact),
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
            Self::Bf16 => "bf16",
            Self::Quantized => "quantized",
            Self::Auto => "auto",
            Self::Exact => "exact",
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

impl LinearOptions {
    /// The element type of a CUDA forward's activations with these weights: a half-precision
    /// kind's own (its matmuls then cast nothing), else f32. On the CPU, f32.
    pub(crate) fn activation_dtype(&self) -> DType {
        match (self.device.is_cuda(), self.kind) {
            (true, WeightsKind::F16) => DType::F16,
            (true, WeightsKind::Bf16) => DType::BF16,
            _ => DType::F32,
        }
    }
}

/// The kernel format of a GGUF block type, where our kernels read it in place.
pub(crate) fn kernel_format(dtype: GgmlDType) -> Option<QuantFormat> {
    Some(match dtype {
        GgmlDType::Q4_0 => QuantFormat::Q4_0,
        GgmlDType::Q4_1 => QuantFormat::Q4_1,
        GgmlDType::Q5_0 => QuantFormat::Q5_0,
        GgmlDType::Q5_1 => QuantFormat::Q5_1,
        GgmlDType::Q8_0 => QuantFormat::Q8_0,
        GgmlDType::Q4K => QuantFormat::Q4K,
        GgmlDType::Q5K => QuantFormat::Q5K,
        GgmlDType::Q6K => QuantFormat::Q6K,
        _ => return None,
    })
}

/// One GGUF matrix as it lies in the file (or its map): `[rows, cols]` weights as rows of
/// `dtype` blocks, optionally read in another row order.
#[derive(Clone, Copy)]
pub(crate) struct GgufMatrix<'a> {
    pub name: &'a str,
    pub dtype: GgmlDType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    /// Which stored row each of the `rows` is.
    pub order: RowOrder,
}

/// Where a matrix's rows lie in the tensor a file stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowOrder {
    /// Row `r` is stored row `r`.
    Stored,
    /// llama Q/K rows, read un-permuted (see [`unpermuted_row`]).
    UnpermuteQk { head_dim: usize },
    /// `len` rows out of every `stride` stored rows, from `offset` in each: one of several
    /// matrices interleaved in one tensor (qwen3next's `ssm_ba`, a key head's beta rows then
    /// its alpha rows).
    Strided {
        len: usize,
        stride: usize,
        offset: usize,
    },
}

impl RowOrder {
    /// The stored row of row `r`.
    pub(crate) fn stored_row(self, r: usize) -> usize {
        match self {
            Self::Stored => r,
            Self::UnpermuteQk { head_dim } => unpermuted_row(r, head_dim),
            Self::Strided {
                len,
                stride,
                offset,
            } => r / len * stride + offset + r % len,
        }
    }

    /// The stored rows that hold `rows` rows.
    pub(crate) fn stored_rows(self, rows: usize) -> usize {
        match self {
            Self::Strided { len, stride, .. } => rows / len * stride,
            _ => rows,
        }
    }

    /// The rows that `stored` stored rows hold (for the test writer).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn rows_in(self, stored: usize) -> usize {
        match self {
            Self::Strided { len, stride, .. } => stored / stride * len,
            _ => stored,
        }
    }
}

impl<'a> GgufMatrix<'a> {
    /// `[rows, cols]` weights of `dtype` in `data`, read in their own row order.
    pub fn new(name: &'a str, dtype: GgmlDType, rows: usize, cols: usize, data: &'a [u8]) -> Self {
        Self {
            name,
            dtype,
            rows,
            cols,
            data,
            order: RowOrder::Stored,
        }
    }

    fn row_bytes(&self) -> usize {
        self.data.len() / self.order.stored_rows(self.rows)
    }

    /// The bytes of the matrix's own rows (another matrix may share its tensor).
    fn bytes(&self) -> usize {
        self.rows * self.row_bytes()
    }

    /// The bytes of output feature `r`, in the order the model uses.
    fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[self.order.stored_row(r) * rb..][..rb]
    }

    /// A candle tensor of the rows in model order (a copy), for candle's kernels and for
    /// dequantizing with candle's reference.
    fn qtensor(&self) -> Result<QTensor> {
        let mut bytes = Vec::with_capacity(self.bytes());
        for r in 0..self.rows {
            bytes.extend_from_slice(self.row(r));
        }
        let storage = QStorage::from_data(Cow::Owned(bytes), &Device::Cpu, self.dtype)?;
        Ok(QTensor::new(storage, (self.rows, self.cols))?)
    }
}

/// Row `r` of a run of matrices stacked along their rows, in model order, where it lies.
fn run_row<'a>(group: &[GgufMatrix<'a>], mut r: usize) -> &'a [u8] {
    for part in group {
        if r < part.rows {
            return part.row(r);
        }
        r -= part.rows;
    }
    panic!("row past the run's {} matrices", group.len())
}

/// Consecutive matrices of one format stacked along their rows, their blocks copied as they
/// are (rows in model order) onto `device`.
fn stacked_blocks_on(group: &[GgufMatrix<'_>], device: &Device) -> Result<QTensor> {
    let mut bytes = Vec::with_capacity(group.iter().map(GgufMatrix::bytes).sum());
    for part in group {
        for r in 0..part.rows {
            bytes.extend_from_slice(part.row(r));
        }
    }
    let rows: usize = group.iter().map(|p| p.rows).sum();
    let storage = QStorage::from_data(Cow::Owned(bytes), device, group[0].dtype)?;
    Ok(QTensor::new(storage, (rows, group[0].cols))?)
}

/// `parts` stacked into one candle tensor for candle's quantized matmul (mixed formats are
/// re-quantized to Q8_0 by [`concat_rows`]: candle's kernels take one format per matrix).
fn stacked_qtensor(parts: &[GgufMatrix<'_>]) -> Result<QTensor> {
    let qs = parts
        .iter()
        .map(GgufMatrix::qtensor)
        .collect::<Result<Vec<_>>>()?;
    Ok(match qs.len() {
        1 => qs.into_iter().next().expect("one part"),
        _ => concat_rows(&qs.iter().collect::<Vec<_>>())?,
    })
}

/// `y = x W^T (+ b)` for `x: [T, in]`, `W: [out, in]`.
pub struct Linear {
    weights: Weights,
    bias: Option<Tensor>,
    /// The bias's values on the host, for [`Linear::forward_into`].
    bias_values: Option<Vec<f32>>,
    out_features: usize,
}

/// A bias in the activations' element type, which it is added to.
fn activation_bias(bias: Option<Tensor>, options: &LinearOptions) -> Result<Option<Tensor>> {
    Ok(bias
        .map(|b| b.to_dtype(options.activation_dtype()))
        .transpose()?)
}

/// A bias's values as f32 on the host.
fn host_values(bias: &Option<Tensor>) -> Result<Option<Vec<f32>>> {
    bias.as_ref()
        .map(|b| Ok(b.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?))
        .transpose()
}

enum Weights {
    /// On the CPU, each run of one format of a fused projection (Q4_K_M stores V as Q6_K
    /// beside a Q4_K Q and K) one matrix writing its columns of the output, in the arithmetic
    /// [`WeightsKind`] gives its format.
    Parts(Vec<(usize, Part)>),
    /// A candle tensor: f16 or bf16, or f32 where the packed kernel does not run.
    Tensor(Tensor),
    /// candle's quantized matmul: every other quantized format; and the bytes of its blocks.
    Candle(QMatMul, usize),
    /// The file's blocks on a GPU ([`WeightsKind::Quantized`] there), one matrix per run of one
    /// format of a fused projection, multiplied by candle's CUDA kernels (llama.cpp's MMVQ for
    /// steps of up to 8 rows, its MMQ tiles above); and the bytes of the blocks.
    DeviceBlocks(Vec<QMatMul>, usize),
}

/// One matrix of a [`Weights::Parts`] layer.
enum Part {
    /// Packed panels: f32 ([`WeightsKind::F32`], or files' f32/f16 matrices), or a file's
    /// quantized blocks regrouped and dequantized in registers with the f32 kernel's exact
    /// arithmetic ([`WeightsKind::Exact`]).
    Panels(Arc<PackedMatrix>),
    /// Our int8-dot kernels on the file's blocks' integers: every format of [`QuantFormat`]
    /// under [`WeightsKind::Auto`] and [`WeightsKind::Quantized`].
    Int8(QuantMatrix),
    /// candle's quantized matmul: the formats we have no kernel for (Q2_K, Q3_K, ...); and the
    /// bytes of its blocks.
    Candle(QMatMul, usize),
}

impl Part {
    fn ours(&self) -> bool {
        !matches!(self, Part::Candle(..))
    }

    fn bytes(&self) -> usize {
        match self {
            Part::Panels(m) => m.bytes(),
            Part::Int8(m) => m.bytes(),
            Part::Candle(_, bytes) => *bytes,
        }
    }
}

/// Rows from which, when asked ([`LoadOptions::amx_min_rows`](crate::LoadOptions)), `auto`'s
/// f32 panels multiply on AMX tiles (`sluice_kernels::cpu::amx`: split-bf16 products,
/// relative error about 2^-16). Not by default: a step's size would then choose the
/// arithmetic of its rows. Measured on an AMX Xeon (forward bench, paired) when SmolLM2's
/// Q4_1 still ran on exact panels under `auto`: from 16 rows the tiles were faster (24 rows
/// 45.3 -> 40.5 ms), at 8 and 12 rows slower.
pub const AUTO_AMX_MIN_ROWS: usize = 16;

thread_local! {
    static ACTIVATIONS: std::cell::RefCell<QuantizedActivations> = std::cell::RefCell::new(QuantizedActivations::default());
}

impl Linear {
    /// A layer of GGUF matrices stacked along their rows (Q, K and V; gate and up), by the
    /// policy [`WeightsKind`] describes. No quantized block is ever re-quantized: matrices of
    /// different formats keep their own panels under `auto`, and are dequantized exactly under
    /// `f32`.
    pub(crate) fn from_gguf(
        parts: &[GgufMatrix<'_>],
        bias: Option<Tensor>,
        options: &LinearOptions,
    ) -> Result<Self> {
        let (kind, device) = (options.kind, &options.device);
        let bias = activation_bias(bias, options)?;
        let n: usize = parts.iter().map(|p| p.rows).sum();
        let k = parts[0].cols;
        let packed = device.is_cpu() && gemm::available();
        let weights = match kind {
            WeightsKind::Auto | WeightsKind::Exact if packed => {
                match Self::auto_parts(parts, n, k, options)? {
                    Some(parts) => Weights::Parts(parts),
                    None => Self::candle_quantized(parts)?,
                }
            }
            WeightsKind::F32 | WeightsKind::Auto | WeightsKind::Exact => {
                let dense = parts
                    .iter()
                    .map(|p| p.qtensor()?.dequantize(&Device::Cpu).map_err(Into::into))
                    .collect::<Result<Vec<_>>>()?;
                panels_or_tensor(Tensor::cat(&dense, 0)?.to_device(device)?, packed)?
            }
            WeightsKind::F16 => {
                let dense = parts
                    .iter()
                    .map(|p| p.qtensor()?.dequantize_f16(device).map_err(Into::into))
                    .collect::<Result<Vec<_>>>()?;
                panels_or_tensor(Tensor::cat(&dense, 0)?, packed)?
            }
            WeightsKind::Bf16 => {
                // One matrix at a time through f32 (no bf16 dequantizer): the f32 copy is
                // transient.
                let dense = parts
                    .iter()
                    .map(|p| Ok(p.qtensor()?.dequantize(device)?.to_dtype(DType::BF16)?))
                    .collect::<Result<Vec<_>>>()?;
                panels_or_tensor(Tensor::cat(&dense, 0)?, packed)?
            }
            WeightsKind::Quantized if device.is_cpu() => {
                Weights::Parts(Self::int8_parts(parts, packed)?)
            }
            WeightsKind::Quantized => Self::device_blocks(parts, device)?,
        };
        Ok(Self {
            weights,
            bias_values: host_values(&bias)?,
            bias,
            out_features: n,
        })
    }

    /// `parts` in runs of one format for [`WeightsKind::Quantized`] on the CPU: the formats of
    /// [`QuantFormat`] on our int8 kernels, the rest (Q2_K, Q3_K, ...) on candle's.
    /// Matrices the file holds unquantized (f32, f16, bf16) take f32 panels where the packed
    /// kernel runs (`packed`): there are no blocks to read, and candle's gemm would sum a row
    /// in an order that depends on the step's size.
    fn int8_parts(parts: &[GgufMatrix<'_>], packed: bool) -> Result<Vec<(usize, Part)>> {
        format_groups(parts)
            .map(|(col0, group)| {
                let dense = matches!(
                    group[0].dtype,
                    GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16
                );
                let part = match Self::int8_matrix(group) {
                    Some(m) => Part::Int8(m),
                    None if dense && packed => {
                        let rows: usize = group.iter().map(|p| p.rows).sum();
                        Part::Panels(Arc::new(PackedMatrix::pack(
                            &dequantized_rows(group)?,
                            rows,
                            group[0].cols,
                        )))
                    }
                    None => {
                        let bytes = group.iter().map(GgufMatrix::bytes).sum();
                        Part::Candle(QMatMul::from_qtensor(stacked_qtensor(group)?)?, bytes)
                    }
                };
                Ok((col0, part))
            })
            .collect()
    }

    /// A run of matrices of one format as one matrix of our int8 kernels, where they read it.
    fn int8_matrix(group: &[GgufMatrix<'_>]) -> Option<QuantMatrix> {
        let format = kernel_format(group[0].dtype)?;
        let rows: usize = group.iter().map(|p| p.rows).sum();
        // Read in the file's map: no copy of the run is held while the kernel's layout is made.
        QuantMatrix::from_rows(format, rows, group[0].cols, |r| run_row(group, r))
    }

    /// `parts` as [`WeightsKind::Auto`] or [`WeightsKind::Exact`] holds them (consecutive
    /// matrices of one format are one matrix): every quantized format our kernels read on our
    /// int8 kernels under `auto`, on exact quantized panels under `exact` (and under `auto`
    /// where this CPU has no int8 kernel for it); unquantized matrices as f32 panels; or `None`
    /// when a part's format has no kernel: then candle's quantized matmul runs the whole layer,
    /// said in the log, never a silent f32 copy.
    fn auto_parts(
        parts: &[GgufMatrix<'_>],
        n: usize,
        k: usize,
        options: &LinearOptions,
    ) -> Result<Option<Vec<(usize, Part)>>> {
        let mut out = Vec::new();
        for (col0, group) in format_groups(parts) {
            let dtype = group[0].dtype;
            if options.kind == WeightsKind::Auto && kernel_format(dtype).is_some() {
                if let Some(m) = Self::int8_matrix(group) {
                    out.push((col0, Part::Int8(m)));
                    continue;
                }
            }
            let rows: usize = group.iter().map(|p| p.rows).sum();
            let m = match dtype {
                // Unquantized in the file: f32 panels are no bigger than f32 data.
                GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                    Some(PackedMatrix::pack(&dequantized_rows(group)?, rows, k))
                }
                _ => kernel_format(dtype).and_then(|format| {
                    PackedMatrix::pack_quantized_rows(format, rows, k, |r| run_row(group, r))
                }),
            };
            let Some(mut m) = m else {
                tracing::warn!(
                    tensor = group[0].name,
                    format = ?dtype,
                    "no quantized panels for this format (or its row length): the layer runs on candle's quantized matmul"
                );
                return Ok(None);
            };
            if let (WeightsKind::Auto, Some(min_rows)) = (options.kind, options.amx_min_rows) {
                // Asked for (benches, tests of the tiles): large steps on AMX tiles.
                if m.format().is_some() {
                    m.use_amx_dequantizing_from(min_rows);
                } else {
                    m.use_amx_only();
                }
            }
            out.push((col0, Part::Panels(Arc::new(m))));
        }
        debug_assert_eq!(parts.iter().map(|p| p.rows).sum::<usize>(), n);
        Ok(Some(out))
    }

    /// `parts` on a GPU as the file holds them: each run of one format one matrix of its
    /// blocks (Q4_K_M's Q6_K V beside Q4_K Q and K stays Q6_K), never re-quantized.
    fn device_blocks(parts: &[GgufMatrix<'_>], device: &Device) -> Result<Weights> {
        let matrices = format_groups(parts)
            .map(|(_, group)| Ok(QMatMul::from_qtensor(stacked_blocks_on(group, device)?)?))
            .collect::<Result<Vec<_>>>()?;
        let bytes = parts.iter().map(GgufMatrix::bytes).sum();
        Ok(Weights::DeviceBlocks(matrices, bytes))
    }

    fn candle_quantized(parts: &[GgufMatrix<'_>]) -> Result<Weights> {
        let w = stacked_qtensor(parts)?;
        let bytes = parts.iter().map(GgufMatrix::bytes).sum();
        Ok(Weights::Candle(QMatMul::from_qtensor(w)?, bytes))
    }

    fn int8_or_candle(w: QTensor, device: &Device) -> Result<Weights> {
        let ours = kernel_format(w.dtype())
            .filter(|_| device.is_cpu())
            .and_then(|format| {
                let (rows, cols) = w.shape().dims2().ok()?;
                let data = w.data().ok()?.into_owned();
                QuantMatrix::new(format, data, rows, cols)
            });
        let bytes = w.storage_size_in_bytes();
        Ok(match ours {
            Some(m) => Weights::Parts(vec![(0, Part::Int8(m))]),
            None if !device.is_cpu() => {
                let storage = QStorage::from_data(w.data()?, device, w.dtype())?;
                let on_device = QTensor::new(storage, w.shape())?;
                Weights::DeviceBlocks(vec![QMatMul::from_qtensor(on_device)?], bytes)
            }
            None => Weights::Candle(QMatMul::from_qtensor(w)?, bytes),
        })
    }

    /// A layer from a dense `[out, in]` tensor (f32, f16 or bf16, as Hugging Face checkpoints
    /// hold them), by the same policy as [`from_gguf`](Self::from_gguf): `f32` packs f32
    /// panels, `auto` too, or where the CPU has AMX tiles for every step (there are no
    /// quantized blocks to read for small ones), `f16` keeps an f16 tensor, and `quantized` quantizes to Q8_0 at load
    /// (the file has no blocks of its own) and multiplies as for a GGUF file.
    pub fn from_tensor(w: Tensor, bias: Option<Tensor>, options: &LinearOptions) -> Result<Self> {
        let (kind, device) = (options.kind, &options.device);
        let bias = activation_bias(bias, options)?;
        let (n, k) = w.dims2()?;
        let weights = match kind {
            WeightsKind::F32 | WeightsKind::Auto | WeightsKind::Exact
                if device.is_cpu() && gemm::available() =>
            {
                let data = w
                    .to_device(&Device::Cpu)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                let mut packed = PackedMatrix::pack(&data, n, k);
                if let (WeightsKind::Auto, Some(_)) = (kind, options.amx_min_rows) {
                    // As for GGUF f32 matrices: tiles only, when asked for.
                    packed.use_amx_only();
                }
                Weights::Parts(vec![(0, Part::Panels(Arc::new(packed)))])
            }
            WeightsKind::F32 | WeightsKind::Auto | WeightsKind::Exact => {
                Weights::Tensor(w.to_dtype(DType::F32)?.to_device(device)?)
            }
            WeightsKind::F16 | WeightsKind::Bf16 => {
                let dtype = if kind == WeightsKind::F16 {
                    DType::F16
                } else {
                    DType::BF16
                };
                let rounded = w.to_dtype(dtype)?.to_device(device)?;
                panels_or_tensor(rounded, device.is_cpu() && gemm::available())?
            }
            WeightsKind::Quantized => {
                let dtype = if k.is_multiple_of(GgmlDType::Q8_0.block_size()) {
                    GgmlDType::Q8_0
                } else {
                    GgmlDType::F32
                };
                let w = w.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
                Self::int8_or_candle(QTensor::quantize(&w, dtype)?, device)?
            }
        };
        Ok(Self {
            weights,
            bias_values: host_values(&bias)?,
            bias,
            out_features: n,
        })
    }

    /// A layer of `rows` rows of `format`'s blocks that candle cannot read (MXFP4, gpt-oss's
    /// experts), given row by row where they lie: our int8 kernels under `auto` and
    /// `quantized` (exact panels where this CPU has no int8 kernel for the format), exact
    /// panels under `exact`, and the blocks dequantized to f32 panels under `f32` (rounded on
    /// to f16 or bf16 under those). On the CPU only.
    pub(crate) fn from_block_rows<'a>(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        row: impl Fn(usize) -> &'a [u8] + Sync,
        options: &LinearOptions,
    ) -> Result<Self> {
        let refuse = |why: &str| {
            Err(ModelError::WeightLayout(format!(
                "a {format:?} matrix of {rows} x {cols}: {why}"
            )))
        };
        if !options.device.is_cpu() || !gemm::available() {
            return refuse("its blocks run on the CPU's packed kernels only");
        }
        let exact = |row: &(dyn Fn(usize) -> &'a [u8] + Sync)| {
            PackedMatrix::pack_quantized_rows(format, rows, cols, row)
        };
        let part = match options.kind {
            WeightsKind::Auto | WeightsKind::Quantized => {
                match QuantMatrix::from_rows(format, rows, cols, &row) {
                    Some(m) => Part::Int8(m),
                    None => match exact(&row) {
                        Some(m) => Part::Panels(Arc::new(m)),
                        None => return refuse("no kernel reads rows of this length"),
                    },
                }
            }
            WeightsKind::Exact => match exact(&row) {
                Some(m) => Part::Panels(Arc::new(m)),
                None => return refuse("no exact panels for rows of this length"),
            },
            WeightsKind::F32 | WeightsKind::F16 | WeightsKind::Bf16 => {
                let mut dense = vec![0f32; rows * cols];
                for (r, out) in dense.chunks_exact_mut(cols).enumerate() {
                    format.dequantize(row(r), out);
                }
                let w = Tensor::from_vec(dense, (rows, cols), &Device::Cpu)?;
                let w = match options.kind {
                    WeightsKind::F16 => w.to_dtype(DType::F16)?,
                    WeightsKind::Bf16 => w.to_dtype(DType::BF16)?,
                    _ => w,
                };
                let Weights::Parts(mut parts) = panels_or_tensor(w, true)? else {
                    unreachable!("packed panels on the CPU")
                };
                parts.remove(0).1
            }
        };
        Ok(Self {
            weights: Weights::Parts(vec![(0, part)]),
            bias: None,
            bias_values: None,
            out_features: rows,
        })
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// The `[out, in]` matrix, where the layer holds one tensor of f32, f16 or bf16 (a GPU's
    /// dense weights): what a captured CUDA step multiplies by directly.
    #[cfg(feature = "cuda")]
    pub(crate) fn dense_weight(&self) -> Option<&Tensor> {
        match &self.weights {
            Weights::Tensor(w) => Some(w),
            _ => None,
        }
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The single matrix of panels this layer multiplies by, if that is what it holds: a tied
    /// embedding reads its rows from the lm_head's panels rather than keep a copy.
    pub(crate) fn panels(&self) -> Option<Arc<PackedMatrix>> {
        match &self.weights {
            Weights::Parts(p) => match p.as_slice() {
                [(_, Part::Panels(m))] => Some(m.clone()),
                _ => None,
            },
            _ => None,
        }
    }

    /// Bytes the weights take in memory.
    pub fn weight_bytes(&self) -> usize {
        match &self.weights {
            Weights::Parts(parts) => parts.iter().map(|(_, p)| p.bytes()).sum(),
            Weights::Tensor(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Weights::Candle(_, bytes) | Weights::DeviceBlocks(_, bytes) => *bytes,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.forward_weights(x)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// `x W^T`, the bias left out.
    fn forward_weights(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match &self.weights {
            Weights::Parts(parts) => parts_forward(parts, self.out_features, x)?,
            // Half-precision weights: activations cast per matmul, accumulated as the gemm does.
            Weights::Tensor(w) if matches!(w.dtype(), DType::F16 | DType::BF16) => x
                .to_dtype(w.dtype())?
                .matmul(&w.t()?)?
                .to_dtype(x.dtype())?,
            Weights::Tensor(w) => x.matmul(&w.t()?)?,
            Weights::Candle(q, _) => q.forward(x)?,
            Weights::DeviceBlocks(matrices, _) => match matrices.as_slice() {
                [one] => one.forward(x)?,
                several => {
                    let outs = several
                        .iter()
                        .map(|m| m.forward(x))
                        .collect::<candle_core::Result<Vec<_>>>()?;
                    Tensor::cat(&outs, 1)?
                }
            },
        })
    }
}

impl Linear {
    /// [`Self::forward`] on plain rows, for the CPU forward: `x: [t, in]` into
    /// `out: [t, out_features]`. Panels and our int8 kernels write `out` directly; the other
    /// weight kinds (candle's) go through a tensor and are copied.
    pub(crate) fn forward_into(&self, x: &[f32], t: usize, out: &mut [f32]) -> Result<()> {
        let n = self.out_features;
        if t == 0 || !x.len().is_multiple_of(t) || out.len() != t * n {
            return Err(ModelError::InvalidStep(format!(
                "a linear layer of {n} outputs got {} inputs and {} outputs for {t} rows",
                x.len(),
                out.len()
            )));
        }
        match &self.weights {
            Weights::Parts(parts) if parts.iter().all(|(_, p)| p.ours()) => {
                ours_into(parts, x, t, out, n);
            }
            _ => {
                let xt = Tensor::from_slice(x, (t, x.len() / t), &Device::Cpu)?;
                let y = self.forward_weights(&xt)?;
                let y = y.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                out.copy_from_slice(&y);
            }
        }
        if let Some(b) = &self.bias_values {
            for row in out.chunks_exact_mut(n) {
                for (o, b) in row.iter_mut().zip(b) {
                    *o += b;
                }
            }
        }
        Ok(())
    }
}

/// Our matrices among `parts` (a layer of `n` outputs) times `x: [t, _]`, into their columns
/// of `out: [t, n]`; the activations are quantized once in each form our int8 kernels among
/// them read.
fn ours_into(parts: &[(usize, Part)], x: &[f32], t: usize, out: &mut [f32], n: usize) {
    // Taken out of the slot for the call, not borrowed: while this thread waits for the pool
    // inside `matmul_into` it may run another job, even another step's layer (steps entering
    // the pool from two threads), which then finds the slot empty and quantizes into a buffer
    // of its own.
    let mut acts = ACTIVATIONS.take();
    let mut done = [false; 2];
    for (_, part) in parts {
        if let Part::Int8(m) = part {
            let blocks = m.activation_blocks();
            if !std::mem::replace(&mut done[blocks as usize], true) {
                acts.quantize(x, t, x.len() / t, blocks);
            }
        }
    }
    for (col0, part) in parts {
        match part {
            Part::Panels(m) => m.matmul_into(x, t, out, n, *col0),
            Part::Int8(m) => m.matmul_into(&acts, out, n, *col0),
            Part::Candle(..) => {}
        }
    }
    ACTIVATIONS.set(acts);
}

/// `x` times the parts of a [`Weights::Parts`] layer of `n` outputs: ours through
/// [`ours_into`], candle's through their own.
fn parts_forward(parts: &[(usize, Part)], n: usize, x: &Tensor) -> Result<Tensor> {
    if let [(_, Part::Candle(q, _))] = parts {
        return Ok(q.forward(x)?);
    }
    let t = x.dim(0)?;
    let mut out = vec![0f32; t * n];
    with_cpu_rows(x, |data, t, _| ours_into(parts, data, t, &mut out, n))?;
    for (col0, part) in parts {
        if let Part::Candle(q, _) = part {
            let y = q.forward(x)?.to_dtype(DType::F32)?;
            let cols = y.dim(1)?;
            for (row, values) in y.to_vec2::<f32>()?.iter().enumerate() {
                out[row * n + col0..][..cols].copy_from_slice(values);
            }
        }
    }
    Ok(Tensor::from_vec(out, (t, n), x.device())?)
}

/// `group`'s rows dequantized to f32, one after the other.
fn dequantized_rows(group: &[GgufMatrix<'_>]) -> Result<Vec<f32>> {
    let dense = group
        .iter()
        .map(|p| p.qtensor()?.dequantize(&Device::Cpu).map_err(Into::into))
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&dense, 0)?.flatten_all()?.to_vec1::<f32>()?)
}

/// Dense weights `w: [out, in]` (f32, or f16/bf16 rounded at load): on a CPU with the packed
/// kernel (`packed`), their values (exact in f32) in f32 panels, multiplied with the f32
/// kernel's one arithmetic (for f16/bf16 at twice the memory); candle's gemm would sum a row in
/// an order that depends on the step's size. Elsewhere (a GPU) the tensor as it is.
fn panels_or_tensor(w: Tensor, packed: bool) -> Result<Weights> {
    if !packed || !w.device().is_cpu() {
        return Ok(Weights::Tensor(w));
    }
    let (n, k) = w.dims2()?;
    let data = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(Weights::Parts(vec![(
        0,
        Part::Panels(Arc::new(PackedMatrix::pack(&data, n, k))),
    )]))
}

/// `parts` in runs of one format, each with the output column its first row writes: the
/// matrices of a fused layer that one kernel reads together.
fn format_groups<'p, 'a>(
    parts: &'p [GgufMatrix<'a>],
) -> impl Iterator<Item = (usize, &'p [GgufMatrix<'a>])> {
    let mut first = 0;
    let mut col0 = 0;
    std::iter::from_fn(move || {
        let dtype = parts.get(first)?.dtype;
        let end = parts[first..]
            .iter()
            .position(|p| p.dtype != dtype)
            .map_or(parts.len(), |i| first + i);
        let group = (col0, &parts[first..end]);
        col0 += group.1.iter().map(|p| p.rows).sum::<usize>();
        first = end;
        Some(group)
    })
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

/// The GGUF row that holds row `r` of a llama Q/K matrix before llama.cpp's converter permuted
/// it: GGUF row `h*D + 2j + s` holds original row `h*D + s*D/2 + j`.
pub(crate) fn unpermuted_row(r: usize, head_dim: usize) -> usize {
    let half = head_dim / 2;
    let (h, within) = (r / head_dim, r % head_dim);
    let (s, j) = (within / half, within % half);
    h * head_dim + 2 * j + s
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
    map_rows(&[w], rows, |r| (0, unpermuted_row(r, head_dim)))
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
