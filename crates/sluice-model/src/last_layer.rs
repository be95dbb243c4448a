//! What a step hands back from the last layer: the logits of the rows that sample and the
//! final norm's output of the rows an embedding pools. Shared by the CPU forward (`model.rs`)
//! and the CUDA one (`cuda_forward.rs`).

use candle_core::{DType, Tensor};
use candle_nn::ops::rms_norm;

use crate::batch::StepBatch;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::weights::Linear;

/// A step's outputs from the last layer's residual stream `x`: the f32 logits of the sampling
/// rows and, when an embedding pools rows of the step, their final norm's output. The norm is
/// per row, so normalising only the rows wanted gives each the value it has in a full pass.
/// Where the model soft-caps its logits (`config.final_logit_softcap`), they come capped.
pub(crate) fn last_layer_rows(
    x: &Tensor,
    norm: &Tensor,
    eps: f32,
    lm_head: &Linear,
    batch: &StepBatch,
    config: &ModelConfig,
) -> Result<(Tensor, Option<Tensor>)> {
    let vocab_size = config.vocab_size;
    let dev = x.device();
    let final_norm = |indices: &[u32]| -> Result<Tensor> {
        let rows = Tensor::from_slice(indices, indices.len(), dev)?;
        Ok(rms_norm(&x.index_select(&rows, 0)?, norm, eps)?)
    };
    let hidden = if batch.hidden_indices.is_empty() {
        None
    } else {
        Some(final_norm(&batch.hidden_indices)?.to_dtype(DType::F32)?)
    };
    if batch.logits_indices.is_empty() {
        return Ok((Tensor::zeros((0, vocab_size), DType::F32, dev)?, hidden));
    }
    let x = final_norm(&batch.logits_indices)?;
    let logits = lm_head.forward(&x)?.to_dtype(DType::F32)?;
    let logits = match config.final_logit_softcap {
        Some(cap) => ((logits / f64::from(cap))?.tanh()? * f64::from(cap))?,
        None => logits,
    };
    Ok((logits, hidden))
}
