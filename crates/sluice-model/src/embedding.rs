//! The token embedding: rows looked up by id. A GGUF file's embedding stays in its own blocks
//! (or, tied to the output projection, in the lm_head's panels) and only the rows a step needs
//! are dequantized, with the reference arithmetic: the same values as a dequantized f32 table,
//! at a fraction of the memory (a 128k-token vocabulary at 4096 is 2 GB in f32).

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use sluice_kernels::PackedMatrix;

use crate::error::{ModelError, Result};

pub(crate) enum Embedding {
    /// f32 rows (Hugging Face checkpoints, `--weights f32`).
    Dense(Tensor),
    /// The file's rows of `dtype` blocks, `row_bytes` each.
    Rows {
        dtype: GgmlDType,
        bytes: Vec<u8>,
        row_bytes: usize,
        hidden: usize,
    },
    /// A tied lm_head's panels: row `id` is the panels' output feature `id`.
    Panels(Arc<PackedMatrix>),
}

impl Embedding {
    /// The rows of `ids` as a `[ids.len(), hidden]` f32 tensor on `device`.
    pub(crate) fn lookup(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        let t = ids.len();
        match self {
            Self::Dense(table) => {
                let ids = Tensor::from_slice(ids, t, table.device())?;
                Ok(table.index_select(&ids, 0)?.to_device(device)?)
            }
            Self::Rows {
                dtype,
                bytes,
                row_bytes,
                hidden,
            } => {
                let mut rows = Vec::with_capacity(t * row_bytes);
                for &id in ids {
                    let at = id as usize * row_bytes;
                    let row = bytes.get(at..at + row_bytes).ok_or_else(|| {
                        ModelError::InvalidStep(format!("token id {id} is past the embedding"))
                    })?;
                    rows.extend_from_slice(row);
                }
                let storage = QStorage::from_data(Cow::Owned(rows), &Device::Cpu, *dtype)?;
                Ok(QTensor::new(storage, (t, *hidden))?.dequantize(device)?)
            }
            Self::Panels(m) => {
                let mut out = vec![0f32; t * m.in_features()];
                Self::panel_rows(m, ids, &mut out)?;
                Ok(Tensor::from_vec(out, (t, m.in_features()), device)?)
            }
        }
    }

    /// [`Self::lookup`] into host rows `out: [ids.len(), hidden]` (the CPU forward's buffer):
    /// a tied lm_head's panels write them directly, the other tables through a tensor.
    pub(crate) fn lookup_into(&self, ids: &[u32], out: &mut [f32]) -> Result<()> {
        match self {
            Self::Panels(m) => Self::panel_rows(m, ids, out),
            _ => {
                let rows = self
                    .lookup(ids, &Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                if rows.len() != out.len() {
                    return Err(ModelError::InvalidStep(format!(
                        "{} embedding values for a buffer of {}",
                        rows.len(),
                        out.len()
                    )));
                }
                out.copy_from_slice(&rows);
                Ok(())
            }
        }
    }

    /// Rows `ids` of a tied lm_head's panels, dequantized into `out`.
    fn panel_rows(m: &PackedMatrix, ids: &[u32], out: &mut [f32]) -> Result<()> {
        let hidden = m.in_features();
        if out.len() != ids.len() * hidden {
            return Err(ModelError::InvalidStep(format!(
                "{} token ids for a buffer of {} values of width {hidden}",
                ids.len(),
                out.len()
            )));
        }
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(hidden)) {
            if id as usize >= m.out_features() {
                return Err(ModelError::InvalidStep(format!(
                    "token id {id} is past the embedding"
                )));
            }
            m.dequantize_column(id as usize, row);
        }
        Ok(())
    }

    /// Bytes the table takes (0 when it is the lm_head's panels, counted there).
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Self::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Self::Rows { bytes, .. } => bytes.len(),
            Self::Panels(_) => 0,
        }
    }
}
