//! The forward of a step on our CUDA kernels (`sluice_kernels::cuda`, the `cuda` feature): the
//! same computation as [`crate::model`]'s, launched so that their number per step does not
//! depend on how many sequences the step holds (`sluice_kernels::cuda_plan::StepLaunches`):
//! per layer the fused add + RMSNorm, the QKV matmul (cuBLAS through candle), QK-norm and RoPE
//! by positions in one kernel, the K/V write through `slot_mapping`, one varlen paged-attention
//! launch for the whole mixed step (two with split-K), the O matmul, add + RMSNorm, gate/up,
//! SwiGLU and down. The attention metadata is uploaded once per step.
//!
//! Prefill and mixed steps run here op by op; decode steps of dense weights replay a CUDA
//! graph of the same kernels (`cuda_graph.rs`). `tests/gpu.rs` compares this forward with the
//! CPU's on a GPU (H200: within 2.8e-5 to 8.5e-5 of the largest logit).

use candle_core::Tensor;
use sluice_kernels::cuda::{self, QkNorm, StepMetadata};
use sluice_kernels::cuda_plan::AttentionPlan;
use sluice_kernels::AttentionShape;

use crate::batch::StepBatch;
use crate::config::ModelConfig;
use crate::cuda_profile::{Phase, StepTimer};
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::layer::ModelWeights as Weights;

/// Whether the CUDA kernels run a model of this shape: the head dims and GQA groups the
/// attention kernel is instantiated for.
pub(crate) fn supports(config: &ModelConfig) -> bool {
    let shape = attention_shape(config);
    AttentionPlan::new(
        &[],
        &[],
        0,
        &shape,
        16,
        sluice_kernels::cuda_plan::DeviceLimits::HOPPER,
    )
    .is_ok()
}

pub(crate) fn attention_shape(config: &ModelConfig) -> AttentionShape {
    AttentionShape {
        num_heads: config.num_heads,
        num_kv_heads: config.num_kv_heads,
        head_dim: config.head_dim,
        scale: 1.0 / (config.head_dim as f32).sqrt(),
        window: None,
    }
}

/// One step (already validated against the model and the cache): writes every token's K/V and
/// returns the f32 logits of the sampling rows and, when an embedding pools rows of this step,
/// their final norm's output (as `LlamaModel::forward_step`). Its phases go to `timer`, which
/// the caller finishes.
pub(crate) fn forward(
    w: &Weights<'_>,
    batch: &StepBatch,
    kv: &mut KvCache,
    timer: &mut StepTimer,
) -> Result<(Tensor, Option<Tensor>)> {
    let cfg = w.config;
    let dev = w.norm.device();
    let (t, h, kvh, d) = (
        batch.num_tokens(),
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
    );
    let eps = cfg.rms_norm_eps as f32;
    let plan = AttentionPlan::new(
        &batch.sequences,
        &batch.block_tables,
        t,
        &attention_shape(cfg),
        batch.block_size,
        cuda::device_limits(dev)?,
    )
    .map_err(|e| ModelError::InvalidStep(e.to_string()))?;
    let step = StepMetadata::upload(plan, dev)?;
    let positions = Tensor::from_slice(&batch.positions, t, dev)?;
    let slot_mapping = Tensor::from_slice(&batch.slot_mapping, t, dev)?;
    let (cos, sin) = w.rope.tables();
    let layout = *kv.layout();
    timer.mark(Phase::Plan);

    // Activations in the norms' element type: the weights' own for half-precision weights
    // (`LinearOptions::activation_dtype`), so that no matmul casts.
    let mut x = w
        .embed
        .lookup(&batch.input_ids, dev)?
        .to_dtype(w.norm.dtype())?;
    timer.mark(Phase::Embedding);
    // The MLP's output of the previous layer, added to the residual stream by the next norm.
    let mut pending: Option<Tensor> = None;
    for (i, layer) in w.layers.iter().enumerate() {
        let (resid, normed) = cuda::add_rms_norm(&x, pending.as_ref(), &layer.attn_norm, eps)?;
        timer.mark(Phase::Norm);
        let qkv = layer.qkv.forward(&normed)?.contiguous()?;
        timer.mark(Phase::Qkv);
        let rotated = cuda::rope_qk(
            &qkv,
            (cos, sin),
            &positions,
            layer.qk_norm.as_ref().map(|(q, k)| QkNorm { q, k, eps }),
            h,
            kvh,
            d,
        )?;
        timer.mark(Phase::Rope);
        let q = rotated.narrow(1, 0, h * d)?;
        let k = rotated.narrow(1, h * d, kvh * d)?;
        let v = qkv.narrow(1, (h + kvh) * d, kvh * d)?;
        let layer_kv = kv.layer_kv(i)?;
        cuda::write_kv(layer_kv, &k, &v, &slot_mapping, &layout)?;
        timer.mark(Phase::KvWrite);
        let attn = cuda::paged_attention(&q, layer_kv, &layout, &step)?;
        timer.mark(Phase::Attention);
        let o = layer.o.forward(&attn)?;
        timer.mark(Phase::O);
        let (resid, normed) = cuda::add_rms_norm(&resid, Some(&o), &layer.ffn_norm, eps)?;
        x = resid;
        timer.mark(Phase::Norm);
        let (gate_up_w, down_w) = layer.dense_mlp()?;
        let gate_up = gate_up_w.forward(&normed)?;
        timer.mark(Phase::GateUp);
        let act = cuda::swiglu(&gate_up, cfg.intermediate_size)?;
        timer.mark(Phase::Swiglu);
        pending = Some(down_w.forward(&act)?);
        timer.mark(Phase::Down);
    }
    if let Some(delta) = pending {
        x = (x + delta)?;
    }
    let out = crate::last_layer::last_layer_rows(&x, w.norm, eps, w.lm_head, batch, cfg)?;
    timer.mark(Phase::Head);
    timer.drain(dev);
    Ok(out)
}
