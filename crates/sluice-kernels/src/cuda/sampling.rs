//! Sampling a step's rows on the device (`sample_rows` in `sampling.cu`): only a token id, its
//! logprob and any top logprobs per row come back to the host. The rule is
//! [`crate::sampling::sample_row`]'s; the engine sends here the rows that ask for nothing else
//! (no penalties, bias, bans or grammar), and samples the others on the host.
//!
//! A [`DeviceSampler`] keeps its device buffers and host staging from step to step, so that a
//! step's sampling is one upload of every row's parameters, one launch that reads each row's
//! logits where they lie, and one download of the results: no device allocation, no rows
//! gathered first, one synchronization.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{DType, Result, Storage, Tensor};

use super::direct::StepBuffer;
use super::launch::{Module, View};
use crate::cuda_plan::{SAMPLE_OUT_WORDS, SAMPLE_PARAM_WORDS, SAMPLE_THREADS};
pub use crate::sampling::{RowSampling, SampledToken};
use crate::sampling::{TopLogprobs, MAX_TOP_LOGPROBS};

/// Device sampling with its buffers kept between steps; they grow to the largest step seen.
#[derive(Default)]
pub struct DeviceSampler {
    /// `SAMPLE_PARAM_WORDS` u32 words a row, and `SAMPLE_OUT_WORDS` a row, for `capacity` rows.
    buffers: Option<(StepBuffer, StepBuffer)>,
    capacity: usize,
    /// The step's packed parameters, then its downloaded results.
    staging: Vec<u32>,
    results: Vec<u32>,
}

impl DeviceSampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Samples each `(logits row, rule)` of `rows` from `logits` (`[rows, vocab]` f32 on the
    /// GPU, unit stride along the vocabulary) and appends the tokens to `out` in `rows`' order.
    pub fn sample(
        &mut self,
        logits: &Tensor,
        rows: impl IntoIterator<Item = (usize, RowSampling)>,
        out: &mut Vec<SampledToken>,
    ) -> Result<()> {
        let (logits_rows, vocab) = logits.dims2()?;
        if logits.dtype() != DType::F32 || logits.stride()[1] != 1 || vocab == 0 {
            candle_core::bail!(
                "sample_rows: logits {:?} {:?} strides {:?}",
                logits.dims(),
                logits.dtype(),
                logits.stride()
            );
        }
        self.staging.clear();
        let mut top_wanted = 0;
        for (row, r) in rows {
            if row >= logits_rows {
                candle_core::bail!("sample_rows: row {row} of {logits_rows} logits rows");
            }
            let top_n = r.top_logprobs.min(MAX_TOP_LOGPROBS as u32);
            top_wanted = top_wanted.max(top_n);
            self.staging.extend_from_slice(&[
                row as u32,
                r.top_k,
                top_n,
                r.temperature.to_bits(),
                r.top_p.to_bits(),
                r.min_p.to_bits(),
                r.uniform.clamp(0.0, 1.0 - f32::EPSILON).to_bits(),
                0,
            ]);
        }
        let n = self.staging.len() / SAMPLE_PARAM_WORDS;
        if n == 0 {
            return Ok(());
        }
        let (storage, layout) = logits.storage_and_layout();
        let Storage::Cuda(l) = &*storage else {
            candle_core::bail!("sample_rows: logits are not on the GPU");
        };
        let dev = l.device.clone();
        let logits_view = View::new(l, layout)?;
        let row_stride = logits.stride()[0];
        if logits_view.len() < (logits_rows - 1) * row_stride + vocab {
            candle_core::bail!("sample_rows: logits storage is shorter than its rows");
        }
        self.reserve(&dev, n)?;
        let Some((params, results)) = self.buffers.as_mut() else {
            candle_core::bail!("sample_rows: no buffers after reserving them");
        };
        params.upload_u32(&self.staging)?;
        let func = Module::Sampling.function(&dev, "sample_rows")?;
        let scalars = (row_stride as i64, vocab as i32);
        let (params_view, results_view) = (params.at(0)?, results.at(0)?);
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        logits_view.push(&mut b);
        b.arg(&scalars.0);
        b.arg(&scalars.1);
        params_view.push(&mut b);
        results_view.push(&mut b);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `sample_rows`'s arguments in order and of its types. Block i reads record i
        // of `params` (n records uploaded above, `reserve` made room for them), then `vocab`
        // logits of the row that record names, below `logits_rows` (checked while packing)
        // in storage checked above to hold every row; it writes only its own
        // SAMPLE_OUT_WORDS words of `results`, which holds `capacity >= n` rows of them.
        unsafe { b.launch(cfg) }.w()?;
        drop(b);
        // Greedy rows without top logprobs need only their first two words; otherwise every
        // row's whole record comes back (one copy either way, and this one waits for the launch).
        let words = if top_wanted == 0 {
            // Rows are SAMPLE_OUT_WORDS apart: copy up to the last row's logprob.
            (n - 1) * SAMPLE_OUT_WORDS + 2
        } else {
            n * SAMPLE_OUT_WORDS
        };
        results.download_u32(words, &mut self.results)?;
        out.reserve(n);
        for (i, params) in self.staging.chunks_exact(SAMPLE_PARAM_WORDS).enumerate() {
            let record = &self.results[i * SAMPLE_OUT_WORDS..];
            let wanted = params[2] as usize;
            let mut top = TopLogprobs::default();
            if wanted > 0 {
                let tokens = &record[2..2 + MAX_TOP_LOGPROBS];
                let logprobs = &record[2 + MAX_TOP_LOGPROBS..2 + 2 * MAX_TOP_LOGPROBS];
                let mut entries = [(0u32, 0f32); MAX_TOP_LOGPROBS];
                // The kernel marks a list cut short (a vocabulary smaller than asked for).
                let len = tokens[..wanted]
                    .iter()
                    .take_while(|&&t| t != u32::MAX)
                    .count();
                for (e, (&t, &lp)) in entries.iter_mut().zip(tokens.iter().zip(logprobs)) {
                    *e = (t, f32::from_bits(lp));
                }
                top = TopLogprobs::new(&entries[..len]);
            }
            out.push(SampledToken {
                token: record[0],
                logprob: f32::from_bits(record[1]),
                top,
            });
        }
        Ok(())
    }

    /// Room for `n` rows: the buffers are replaced by larger ones when a step outgrows them.
    fn reserve(&mut self, dev: &CudaDevice, n: usize) -> Result<()> {
        if self.buffers.is_some() && n <= self.capacity {
            return Ok(());
        }
        let capacity = n.next_power_of_two().max(64);
        self.buffers = Some((
            StepBuffer::zeros(dev, DType::U32, capacity * SAMPLE_PARAM_WORDS)?,
            StepBuffer::zeros(dev, DType::U32, capacity * SAMPLE_OUT_WORDS)?,
        ));
        self.capacity = capacity;
        Ok(())
    }
}

/// Samples row `i` of `logits` (`[rows, vocab]` f32 on the GPU, contiguous rows) by `rows[i]`,
/// with its top logprobs when it asks: [`DeviceSampler::sample`] once, for a caller without
/// a step loop to keep one in.
pub fn sample_rows(logits: &Tensor, rows: &[RowSampling]) -> Result<Vec<SampledToken>> {
    if logits.dims2()?.0 != rows.len() {
        candle_core::bail!(
            "sample_rows: logits {:?} for {} rows",
            logits.dims(),
            rows.len()
        );
    }
    let mut out = Vec::with_capacity(rows.len());
    DeviceSampler::new().sample(logits, rows.iter().copied().enumerate(), &mut out)?;
    Ok(out)
}
