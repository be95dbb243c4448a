//! The sampling rows a model picks its tokens for itself ([`StepBatch::model_sampling`]), split
//! from those whose logits go back to the engine. On a GPU the picked rows are sampled by the
//! `sample_rows` kernel, so only their token ids and logprobs leave the device; on the CPU by
//! the same rule in plain Rust ([`sluice_kernels::sampling::sample_row`]), which is what lets
//! this path be tested on any machine.

use candle_core::{Device, Storage, Tensor};
use rayon::prelude::*;
use sluice_kernels::sampling::sample_row;

use crate::batch::{StepBatch, StepOutput};
use crate::error::{ModelError, Result};

/// What a model keeps from step to step to sample its rows: on a GPU, the device sampler's
/// buffers and the list of rows that go back to the engine.
#[derive(Default)]
pub(crate) struct RowSampler {
    #[cfg(feature = "cuda")]
    device: sluice_kernels::cuda::DeviceSampler,
    #[cfg(feature = "cuda")]
    kept: Vec<u32>,
}

/// Fills `out.logits` with the rows of `logits` (`[logits_indices.len(), vocab]`, f32) the
/// model does not sample, and `out.sampled` with the tokens of those it does.
pub(crate) fn split_rows(
    logits: &Tensor,
    batch: &StepBatch,
    out: &mut StepOutput,
    sampler: &mut RowSampler,
) -> Result<()> {
    out.logits.clear();
    out.sampled.clear();
    if !batch.model_sampling.iter().any(Option::is_some) {
        return copy_rows(logits, &mut out.logits);
    }
    if logits.device().is_cuda() {
        return split_on_device(logits, batch, out, sampler);
    }
    let (rows, vocab) = logits.dims2()?;
    let (storage, layout) = logits.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(ModelError::NotOnCpu("a step's logits"));
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        return Err(ModelError::InvalidStep(
            "the step's logits are not contiguous".into(),
        ));
    };
    let data = &cpu.as_slice::<f32>()?[start..end];
    debug_assert_eq!(data.len(), rows * vocab);
    let picked = |i: usize| batch.model_sampling.get(i).copied().flatten();
    for (i, row) in data.chunks_exact(vocab).enumerate() {
        if picked(i).is_none() {
            out.logits.extend_from_slice(row);
        }
    }
    out.sampled.par_extend(
        data.par_chunks_exact(vocab)
            .zip(&batch.model_sampling)
            .filter_map(|(row, rule)| Some(sample_row(row, rule.as_ref()?))),
    );
    Ok(())
}

/// The rows to sample go to the device sampler where they lie in `logits`; the others are
/// gathered and copied back.
#[cfg(feature = "cuda")]
fn split_on_device(
    logits: &Tensor,
    batch: &StepBatch,
    out: &mut StepOutput,
    sampler: &mut RowSampler,
) -> Result<()> {
    let rows = logits.dims2()?.0;
    let picked = |i: usize| batch.model_sampling.get(i).copied().flatten();
    sampler.kept.clear();
    sampler
        .kept
        .extend((0..rows).filter(|&i| picked(i).is_none()).map(|i| i as u32));
    if !sampler.kept.is_empty() {
        let index = Tensor::from_slice(&sampler.kept, sampler.kept.len(), logits.device())?;
        copy_rows(&logits.index_select(&index, 0)?, &mut out.logits)?;
    }
    // The kernel reads rows of unit stride along the vocabulary.
    let logits = if logits.stride()[1] == 1 {
        logits.clone()
    } else {
        logits.contiguous()?
    };
    sampler.device.sample(
        &logits,
        (0..rows).filter_map(|i| Some((i, picked(i)?))),
        &mut out.sampled,
    )?;
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn split_on_device(
    _: &Tensor,
    _: &StepBatch,
    _: &mut StepOutput,
    _: &mut RowSampler,
) -> Result<()> {
    Err(ModelError::InvalidStep(
        "logits on a GPU in a build without the `cuda` feature".into(),
    ))
}

/// Copies an f32 tensor into `out` (cleared first), straight from CPU storage when it can:
/// `to_vec` would allocate a fresh vector of rows x vocab floats every step.
pub(crate) fn copy_rows(t: &Tensor, out: &mut Vec<f32>) -> Result<()> {
    out.clear();
    if !t.device().is_cpu() {
        let cpu = t.to_device(&Device::Cpu)?;
        return copy_rows(&cpu, out);
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(ModelError::NotOnCpu("a step's output"));
    };
    let data = cpu.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => out.extend_from_slice(&data[start..end]),
        None => {
            drop(storage);
            out.extend(t.flatten_all()?.to_vec1::<f32>()?);
        }
    }
    Ok(())
}
