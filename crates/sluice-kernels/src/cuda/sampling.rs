//! Sampling every row of a step's logits on the device (`sample_rows` in `sampling.cu`): only a
//! token id and its logprob per row come back to the host. The rule is
//! [`crate::sampling::sample_row`]'s; the engine sends here the rows that ask for nothing else
//! (no penalties, bias, bans, grammar or top logprobs), and samples the others on the host.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Result, Storage, Tensor};

use super::launch::{Module, View};
use crate::cuda_plan::SAMPLE_THREADS;
pub use crate::sampling::{RowSampling, SampledToken};

/// Samples row `i` of `logits` (`[rows, vocab]` f32 on the GPU, contiguous rows) by `rows[i]`.
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
    let top_k = Tensor::from_vec(rows.iter().map(|r| r.top_k).collect::<Vec<_>>(), n, device)?;
    let (logits_g, logits_l) = logits.storage_and_layout();
    let (params_g, params_l) = params.storage_and_layout();
    let (top_k_g, top_k_l) = top_k.storage_and_layout();
    let (Storage::Cuda(l), Storage::Cuda(p), Storage::Cuda(k)) =
        (&*logits_g, &*params_g, &*top_k_g)
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
    let top_k = k.as_cuda_slice::<u32>()?.slice(top_k_l.start_offset()..);
    let tokens = dev.alloc_zeros::<u32>(n)?;
    let logprobs = dev.alloc_zeros::<f32>(n)?;
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
    b.arg(&tokens);
    b.arg(&logprobs);
    let cfg = LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (SAMPLE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `sample_rows`'s arguments in order and of its types; one block per row reads
    // `vocab` logits of its row (storage checked above) and its parameters (n each), and
    // writes its own entry of `tokens` and `logprobs` (n each).
    unsafe { b.launch(cfg) }.w()?;
    let tokens = dev.clone_dtoh(&tokens)?;
    let logprobs = dev.clone_dtoh(&logprobs)?;
    Ok(tokens
        .into_iter()
        .zip(logprobs)
        .map(|(token, logprob)| SampledToken { token, logprob })
        .collect())
}
