//! The forward of a step on our CUDA kernels (`sluice_kernels::cuda`, the `cuda` feature): the
//! same computation as [`crate::model`]'s, launched so that their number per step does not
//! depend on how many sequences the step holds (`sluice_kernels::cuda_plan::StepLaunches`):
//! per layer the fused add + RMSNorm, the QKV matmul (cuBLAS through candle), QK-norm and RoPE
//! by positions in one kernel, the K/V write through `slot_mapping`, one varlen paged-attention
//! launch for the whole mixed step (two with split-K), the O matmul, add + RMSNorm, gate/up,
//! SwiGLU and down. The attention metadata is uploaded once per step.
//!
//! Prefill and mixed steps run here op by op; decode steps of dense weights replay a CUDA
//! graph of the same kernels (`cuda_graph.rs`). Both run the one layer loop of
//! `cuda_layers.rs`; this file is its eager executor. `tests/gpu.rs` compares this forward with the
//! CPU's on a GPU (H200: within 2.8e-5 to 8.5e-5 of the largest logit).

use candle_core::Tensor;
use sluice_kernels::cuda::{self, QkNorm, StepMetadata};
use sluice_kernels::cuda_plan::AttentionPlan;
use sluice_kernels::AttentionShape;

use crate::batch::StepBatch;
use crate::config::ModelConfig;
use crate::cuda_layers::{run_layers, LayerOps};
use crate::cuda_profile::{Phase, StepTimer};
use crate::error::{ModelError, Result};
use crate::kv_cache::{KvCache, KvLayout};
use crate::layer::ModelWeights as Weights;
use crate::weights::Linear;

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
    let layout = *kv.layout();
    timer.mark(Phase::Plan);

    // Activations in the norms' element type: the weights' own for half-precision weights
    // (`LinearOptions::activation_dtype`), so that no matmul casts.
    let x = w
        .embed
        .lookup(&batch.input_ids, dev)?
        .to_dtype(w.norm.dtype())?;
    timer.mark(Phase::Embedding);
    let mut ops = EagerStep {
        rope: w.rope.tables(),
        positions: &positions,
        slot_mapping: &slot_mapping,
        step: &step,
        layout: &layout,
        heads: (h, kvh, d),
        intermediate: cfg.intermediate_size,
        eps,
        timer,
        x,
        pending: None,
        normed: None,
        qkv: None,
        rotated: None,
        attn: None,
    };
    run_layers(&mut ops, w, kv)?;
    let EagerStep {
        mut x,
        pending,
        timer,
        ..
    } = ops;
    if let Some(delta) = pending {
        x = (x + delta)?;
    }
    let out = crate::last_layer::last_layer_rows(&x, w.norm, eps, w.lm_head, batch, cfg)?;
    timer.mark(Phase::Head);
    timer.drain(dev);
    Ok(out)
}

/// The layer loop's stages as candle ops on tensors allocated as they go.
struct EagerStep<'a> {
    rope: (&'a Tensor, &'a Tensor),
    positions: &'a Tensor,
    slot_mapping: &'a Tensor,
    step: &'a StepMetadata,
    layout: &'a KvLayout,
    /// Query heads, KV heads, head size.
    heads: (usize, usize, usize),
    intermediate: usize,
    eps: f32,
    timer: &'a mut StepTimer,
    /// The residual stream.
    x: Tensor,
    /// The last projection's output, added to the stream by the next norm.
    pending: Option<Tensor>,
    normed: Option<Tensor>,
    qkv: Option<Tensor>,
    rotated: Option<Tensor>,
    attn: Option<Tensor>,
}

/// A stage's input, set by the stage before it in [`run_layers`]'s order.
fn input(t: &Option<Tensor>, what: &str) -> Result<Tensor> {
    t.clone().ok_or_else(|| {
        ModelError::InvalidStep(format!("the layer loop read {what} before it was computed"))
    })
}

impl LayerOps for EagerStep<'_> {
    fn attention_norm(&mut self, _layer: usize, weight: &Tensor) -> Result<()> {
        self.mlp_norm(weight)
    }

    fn qkv(&mut self, linear: &Linear) -> Result<()> {
        let normed = input(&self.normed, "the normed rows")?;
        self.qkv = Some(linear.forward(&normed)?.contiguous()?);
        self.timer.mark(Phase::Qkv);
        Ok(())
    }

    fn rope(&mut self, qk_norm: Option<&(Tensor, Tensor)>) -> Result<()> {
        let (h, kvh, d) = self.heads;
        let qkv = input(&self.qkv, "Q, K and V")?;
        let eps = self.eps;
        self.rotated = Some(cuda::rope_qk(
            &qkv,
            self.rope,
            self.positions,
            qk_norm.map(|(q, k)| QkNorm { q, k, eps }),
            h,
            kvh,
            d,
        )?);
        self.timer.mark(Phase::Rope);
        Ok(())
    }

    fn attention(&mut self, layer_kv: &Tensor) -> Result<()> {
        let (h, kvh, d) = self.heads;
        let (qkv, rotated) = (
            input(&self.qkv, "Q, K and V")?,
            input(&self.rotated, "rotated Q and K")?,
        );
        let q = rotated.narrow(1, 0, h * d)?;
        let k = rotated.narrow(1, h * d, kvh * d)?;
        let v = qkv.narrow(1, (h + kvh) * d, kvh * d)?;
        cuda::write_kv(layer_kv, &k, &v, self.slot_mapping, self.layout)?;
        self.timer.mark(Phase::KvWrite);
        self.attn = Some(cuda::paged_attention(&q, layer_kv, self.layout, self.step)?);
        self.timer.mark(Phase::Attention);
        Ok(())
    }

    fn output(&mut self, linear: &Linear) -> Result<()> {
        let attn = input(&self.attn, "the attention's output")?;
        self.pending = Some(linear.forward(&attn)?);
        self.timer.mark(Phase::O);
        Ok(())
    }

    fn mlp_norm(&mut self, weight: &Tensor) -> Result<()> {
        let (resid, normed) =
            cuda::add_rms_norm(&self.x, self.pending.take().as_ref(), weight, self.eps)?;
        self.x = resid;
        self.normed = Some(normed);
        self.timer.mark(Phase::Norm);
        Ok(())
    }

    fn mlp(&mut self, gate_up_w: &Linear, down_w: &Linear) -> Result<()> {
        let normed = input(&self.normed, "the normed rows")?;
        let gate_up = gate_up_w.forward(&normed)?;
        self.timer.mark(Phase::GateUp);
        let act = cuda::swiglu(&gate_up, self.intermediate)?;
        self.timer.mark(Phase::Swiglu);
        self.pending = Some(down_w.forward(&act)?);
        self.timer.mark(Phase::Down);
        Ok(())
    }
}
