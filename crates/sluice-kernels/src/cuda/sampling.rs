//! Sampling every row of a step's logits on the device (`sample_rows` in `sampling.cu`): only a
//! token id and its logprob per row come back to the host. The rule is
//! [`crate::sampling::sample_row`]'s; the engine sends here the rows that ask for nothing else
//! (no penalties, bias, bans or grammar), and samples the others on the host.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Result, Storage, Tensor};

use super::launch::{Module, View};
use crate::cuda_plan::SAMPLE_THREADS;
pub use crate::sampling::{RowSampling, SampledToken};
use crate::sampling::{TopLogprobs, MAX_TOP_LOGPROBS};

/// Samples row `i` of `logits` (`[rows, vocab]` f32 on the GPU, contiguous rows) by `rows[i]`,
/// with its top logprobs when it asks.
pub fn sample_rows(logits: &Tensor, rows: &[RowSampling]) -> Result<Vec<SampledToken>> {
    let (n, vocab) = logits.dims2()?;
    if n != rows.len() || logits.dtype() != DType::F32 || logits.stride()[1] != 1 {
        candle_core::bail!(
            "sample_rows: logits {:?} {:?} for {} rows",
            logits.dims(),
            logits.dtype(),
            rows.len()
        );
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    let device = logits.device();
    let floats: Vec<f32> = rows
        .iter()
        .flat_map(|r| {
            [
                r.temperature,
                r.top_p,
                r.min_p,
                r.uniform.clamp(0.0, 1.0 - f32::EPSILON),
            ]
        })
        .collect();
    let params = Tensor::from_vec(floats, 4 * n, device)?
        .reshape((n, 4))?
        .t()?
        .contiguous()?;
    let counts: Vec<u32> = rows
        .iter()
        .flat_map(|r| [r.top_k, r.top_logprobs.min(MAX_TOP_LOGPROBS as u32)])
        .collect();
    let counts = Tensor::from_vec(counts, 2 * n, device)?
        .reshape((n, 2))?
        .t()?
        .contiguous()?;
    let (logits_g, logits_l) = logits.storage_and_layout();
    let (params_g, params_l) = params.storage_and_layout();
    let (counts_g, counts_l) = counts.storage_and_layout();
    let (Storage::Cuda(l), Storage::Cuda(p), Storage::Cuda(k)) =
        (&*logits_g, &*params_g, &*counts_g)
    else {
        candle_core::bail!("sample_rows: logits are not on the GPU");
    };
    let dev = l.device.clone();
    let logits_view = View::new(l, logits_l)?;
    if logits_view.len() < (n - 1) * logits.stride()[0] + vocab {
        candle_core::bail!("sample_rows: logits storage is shorter than its rows");
    }
    let p = p.as_cuda_slice::<f32>()?;
    let at = params_l.start_offset();
    let (temperature, top_p, min_p, uniform) = (
        p.slice(at..at + n),
        p.slice(at + n..at + 2 * n),
        p.slice(at + 2 * n..at + 3 * n),
        p.slice(at + 3 * n..at + 4 * n),
    );
    let k = k.as_cuda_slice::<u32>()?;
    let at = counts_l.start_offset();
    let (top_k, top_n) = (k.slice(at..at + n), k.slice(at + n..at + 2 * n));
    let tokens = dev.alloc_zeros::<u32>(n)?;
    let logprobs = dev.alloc_zeros::<f32>(n)?;
    let top_tokens = dev.alloc_zeros::<u32>(n * MAX_TOP_LOGPROBS)?;
    let top_logprobs = dev.alloc_zeros::<f32>(n * MAX_TOP_LOGPROBS)?;
    let func = Module::Sampling.function(&dev, "sample_rows")?;
    let scalars = (logits.stride()[0] as i64, vocab as i32);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    logits_view.push(&mut b);
    b.arg(&scalars.0);
    b.arg(&scalars.1);
    b.arg(&temperature);
    b.arg(&top_k);
    b.arg(&top_p);
    b.arg(&min_p);
    b.arg(&uniform);
    b.arg(&top_n);
    b.arg(&tokens);
    b.arg(&logprobs);
    b.arg(&top_tokens);
    b.arg(&top_logprobs);
    let cfg = LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (SAMPLE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `sample_rows`'s arguments in order and of its types; one block per row reads
    // `vocab` logits of its row (storage checked above) and its parameters (n each), and
    // writes its own entry of `tokens` and `logprobs` (n each) and at most
    // MAX_TOP_LOGPROBS entries of its own run of `top_tokens` and `top_logprobs`
    // (n * MAX_TOP_LOGPROBS each).
    unsafe { b.launch(cfg) }.w()?;
    let tokens = dev.clone_dtoh(&tokens)?;
    let logprobs = dev.clone_dtoh(&logprobs)?;
    let top_tokens = dev.clone_dtoh(&top_tokens)?;
    let top_logprobs = dev.clone_dtoh(&top_logprobs)?;
    Ok(rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let run = i * MAX_TOP_LOGPROBS..(i + 1) * MAX_TOP_LOGPROBS;
            let wanted = (r.top_logprobs as usize).min(MAX_TOP_LOGPROBS);
            // The kernel marks a list cut short (a vocabulary smaller than asked for).
            let top: Vec<(u32, f32)> = top_tokens[run.clone()]
                .iter()
                .zip(&top_logprobs[run])
                .take(wanted)
                .take_while(|&(&t, _)| t != u32::MAX)
                .map(|(&t, &lp)| (t, lp))
                .collect();
            SampledToken {
                token: tokens[i],
                logprob: logprobs[i],
                top: TopLogprobs::new(&top),
            }
        })
        .collect())
}
