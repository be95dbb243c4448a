//! Decode steps on the GPU without per-launch host work: the step's inputs copied into static
//! device buffers in one upload, then one CUDA graph replayed per step, captured once per
//! batch-size bucket (`sluice_kernels::cuda_plan::decode_buckets`; a step is padded to the
//! smallest bucket that holds it). The graph runs the same layer loop as the eager forward
//! (`cuda_layers.rs`), with the same kernels, on buffers the model owns, with cuBLAS called on them directly: no device
//! memory is allocated, nothing synchronizes the host, and a replay computes exactly what the same
//! launches compute eagerly ([`CudaGraphs::Eager`], which a GPU test compares bit for bit).
//!
//! It serves decode-only steps (every sequence one new token, every row sampled, no pooled
//! rows) of models whose matrices are dense on the device (`--weights f32`, `f16` or `bf16`);
//! every other step, and GGUF blocks on the device, run on the eager forward.

use candle_core::{DType, Device, Tensor};
use sluice_kernels::cuda::direct::{self, tensor_view, Matmul, StepBuffer};
use sluice_kernels::cuda::graph::StepGraph;
use sluice_kernels::cuda::View;
use sluice_kernels::cuda_plan::{decode_buckets, AttentionPlan, DeviceLimits, PAD_SLOT};

use crate::batch::StepBatch;
use crate::cuda_forward::attention_shape;
use crate::cuda_layers::{run_layers, LayerOps};
pub(crate) use crate::cuda_profile::{Phase, StepTimer};
use crate::error::{ModelError, Result};
use crate::kv_cache::{KvCache, KvLayout};
use crate::layer::ModelWeights;
use crate::load::CudaGraphs;
use crate::weights::Linear;

/// The decode steps of one model on one device: its static buffers and captured graphs.
pub(crate) struct DecodeSteps {
    mode: CudaGraphs,
    buckets: Vec<usize>,
    graphs: Vec<Option<StepGraph>>,
    /// The most keys a sequence may have (the model's context): sizes the block tables and
    /// the split-K of small buckets.
    max_context: usize,
    limits: DeviceLimits,
    buffers: Buffers,
    /// The words of the step's upload, kept from step to step.
    staging: Vec<u32>,
    /// The last step's plan metadata, refilled by the next step's plan.
    plan_words: Vec<u32>,
    matmul: Matmul,
    /// Token embeddings `[vocab, hidden]` in the activations' dtype, gathered on the device.
    embed_table: Tensor,
    device: Device,
}

/// Where the upload's parts sit in [`Buffers::inputs`] (u32 words): ids, positions and slots
/// of `max_rows` rows each, then the attention metadata.
struct InputOffsets {
    positions: usize,
    slots: usize,
    metadata: usize,
}

struct Buffers {
    max_rows: usize,
    offsets: InputOffsets,
    inputs: StepBuffer,
    embedded: StepBuffer,
    /// Residual stream and normed rows `[2, rows, hidden]`: the first norm of a layer writes
    /// `norm_a`, the second `norm_b`, each reading the other's residual.
    norm_a: StepBuffer,
    norm_b: StepBuffer,
    qkv: StepBuffer,
    rotated: StepBuffer,
    attn: StepBuffer,
    /// The O projection's and the down projection's output, added by the next norm.
    delta: StepBuffer,
    gate_up: StepBuffer,
    act: StepBuffer,
    split_acc: StepBuffer,
    split_ml: StepBuffer,
    /// `[max_rows, vocab]` f32.
    logits: Tensor,
}

impl Buffers {
    fn bytes(&self) -> usize {
        [
            &self.inputs,
            &self.embedded,
            &self.norm_a,
            &self.norm_b,
            &self.qkv,
            &self.rotated,
            &self.attn,
            &self.delta,
            &self.gate_up,
            &self.act,
            &self.split_acc,
            &self.split_ml,
        ]
        .iter()
        .map(|b| b.bytes())
        .sum::<usize>()
            + self.logits.elem_count() * 4
    }
}

impl DecodeSteps {
    /// Buffers for steps of up to `max_seqs` sequences of `w`, or `None` (said in the log)
    /// when the model's matrices are not dense on the device.
    pub(crate) fn new(
        w: &ModelWeights<'_>,
        mode: CudaGraphs,
        max_seqs: usize,
        block_size: usize,
    ) -> Result<Option<Self>> {
        let cfg = w.config;
        let device = w.norm.device().clone();
        if mode == CudaGraphs::Off || !device.is_cuda() {
            return Ok(None);
        }
        let mut matrices = Vec::with_capacity(4 * w.layers.len() + 1);
        for l in w.layers {
            let (gate_up, down) = l.dense_mlp()?;
            matrices.extend([&l.qkv, &l.o, gate_up, down]);
        }
        matrices.push(w.lm_head);
        let dense = matrices.iter().all(|l| l.dense_weight().is_some());
        if !dense {
            tracing::info!(
                "CUDA graphs: off for this model (its matrices are GGUF blocks on the device, \
                 which the eager forward multiplies)"
            );
            return Ok(None);
        }
        let act = w.norm.dtype();
        let dev = device.as_cuda_device()?;
        let limits = sluice_kernels::cuda::device_limits(&device)?;
        let max_rows = max_seqs.max(1);
        let max_context = cfg.max_position_embeddings;
        let buckets = decode_buckets(max_rows);
        let (h, kvh, d, hidden, inter, vocab) = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.vocab_size,
        );
        // The metadata of the largest bucket with every block table full, and the split-K
        // workspace of the largest plan any bucket makes.
        let max_blocks = max_context.div_ceil(block_size);
        let metadata_words = 9 * max_rows + max_rows * max_blocks + 1;
        let offsets = InputOffsets {
            positions: max_rows,
            slots: 2 * max_rows,
            metadata: 3 * max_rows,
        };
        let (mut acc_n, mut ml_n) = (0, 0);
        let shape = attention_shape(cfg);
        for &bucket in &buckets {
            let plan = AttentionPlan::for_decode_bucket(
                &[],
                &[],
                bucket,
                max_context,
                &shape,
                block_size,
                limits,
            )
            .map_err(|e| ModelError::InvalidStep(e.to_string()))?;
            let (a, m) = plan.workspace_floats();
            acc_n = acc_n.max(a);
            ml_n = ml_n.max(m);
        }
        let buf = |dtype: DType, n: usize| StepBuffer::zeros(dev, dtype, n);
        let buffers = Buffers {
            max_rows,
            inputs: buf(DType::U32, offsets.metadata + metadata_words)?,
            offsets,
            embedded: buf(act, max_rows * hidden)?,
            norm_a: buf(act, 2 * max_rows * hidden)?,
            norm_b: buf(act, 2 * max_rows * hidden)?,
            qkv: buf(act, max_rows * (h + 2 * kvh) * d)?,
            rotated: buf(act, max_rows * (h + kvh) * d)?,
            attn: buf(act, max_rows * h * d)?,
            delta: buf(act, max_rows * hidden)?,
            gate_up: buf(act, max_rows * 2 * inter)?,
            act: buf(act, max_rows * inter)?,
            split_acc: buf(DType::F32, acc_n)?,
            split_ml: buf(DType::F32, ml_n)?,
            logits: Tensor::zeros((max_rows, vocab), DType::F32, &device)?,
        };
        let embed_table = match (cfg.tie_word_embeddings, w.lm_head.dense_weight()) {
            // Tied: the lm_head's matrix holds the embedding's values, already on the device.
            (true, Some(table)) => table.clone(),
            _ => {
                let ids: Vec<u32> = (0..vocab as u32).collect();
                w.embed.lookup(&ids, &device)?.to_dtype(act)?
            }
        };
        tracing::info!(
            mode = %mode,
            buckets = buckets.len(),
            largest = max_rows,
            static_buffer_mib = buffers.bytes() >> 20,
            "CUDA graphs: decode steps on static buffers, one graph per batch-size bucket"
        );
        Ok(Some(Self {
            mode,
            graphs: buckets.iter().map(|_| None).collect(),
            buckets,
            max_context,
            limits,
            buffers,
            staging: Vec::new(),
            plan_words: Vec::new(),
            matmul: Matmul::new(dev)?,
            embed_table,
            device,
        }))
    }

    /// Captures every bucket's graph now (`On`), so that no step pays a capture and the
    /// graphs exist before the first request. A bucket whose capture fails is logged and
    /// leaves every decode step to enqueue its launches eagerly.
    pub(crate) fn capture_all(&mut self, w: &ModelWeights<'_>, kv: &KvCache) -> Result<()> {
        if self.mode != CudaGraphs::On {
            return Ok(());
        }
        let started = std::time::Instant::now();
        for index in 0..self.buckets.len() {
            let plan = AttentionPlan::for_decode_bucket(
                &[],
                &[],
                self.buckets[index],
                self.max_context,
                &attention_shape(w.config),
                kv.block_size(),
                self.limits,
            )
            .map_err(|e| ModelError::InvalidStep(e.to_string()))?;
            self.capture(index, w, &plan, kv)?;
            if self.mode != CudaGraphs::On {
                break;
            }
        }
        tracing::info!(
            graphs = self.graphs.iter().flatten().count(),
            capture_ms = (started.elapsed().as_secs_f64() * 1e3).round(),
            "CUDA graphs: decode steps captured"
        );
        Ok(())
    }

    /// Captures bucket `index`'s step; on failure, says why and turns graphs off.
    fn capture(
        &mut self,
        index: usize,
        w: &ModelWeights<'_>,
        plan: &AttentionPlan,
        kv: &KvCache,
    ) -> Result<()> {
        let dev = self.device.as_cuda_device()?.clone();
        // Run the launches once first, on padding rows only (no K/V is written): every module
        // and cuBLAS kernel they use is then loaded, and nothing loads while capturing.
        self.upload_rows(&[], &[], &[], plan)?;
        self.record(w, plan, kv)?;
        match StepGraph::capture(&dev, || {
            self.record(w, plan, kv).map_err(candle_core::Error::wrap)
        }) {
            Ok(graph) => self.graphs[index] = Some(graph),
            Err(e) => {
                // The same launches still run, enqueued one by one: slower, never wrong.
                tracing::warn!(
                    bucket = self.buckets[index],
                    error = %e,
                    "CUDA graphs: capture failed; decode steps enqueue their launches eagerly \
                     from now on (as --cuda-graphs eager)"
                );
                self.mode = CudaGraphs::Eager;
                self.graphs.iter_mut().for_each(|g| *g = None);
            }
        }
        Ok(())
    }

    /// Whether `batch` is a decode step these buffers run: every sequence one new token whose
    /// row samples, none pooled, no more sequences than the largest bucket.
    pub(crate) fn takes(&self, batch: &StepBatch) -> bool {
        let n = batch.sequences.len();
        n > 0
            && n <= self.buffers.max_rows
            && batch.num_tokens() == n
            && batch.hidden_indices.is_empty()
            && batch.logits_indices.len() == n
            && batch
                .logits_indices
                .iter()
                .enumerate()
                .all(|(i, &r)| r as usize == i)
            && batch
                .sequences
                .iter()
                .all(|s| s.query_len == 1 && s.context_len <= self.max_context)
    }

    /// Bytes of the static buffers.
    pub(crate) fn bytes(&self) -> usize {
        self.buffers.bytes()
    }

    /// One decode step (already validated, and [`Self::takes`] it): writes each token's K/V and
    /// returns the logits `[sequences, vocab]` (f32; a view of the static buffer, valid until
    /// the next step).
    pub(crate) fn forward(
        &mut self,
        w: &ModelWeights<'_>,
        batch: &StepBatch,
        kv: &mut KvCache,
        timer: &mut StepTimer,
    ) -> Result<Tensor> {
        let n = batch.sequences.len();
        let index =
            self.buckets.iter().position(|&b| b >= n).ok_or_else(|| {
                ModelError::InvalidStep(format!("{n} sequences past every bucket"))
            })?;
        let bucket = self.buckets[index];
        let plan = AttentionPlan::for_decode_bucket_in(
            std::mem::take(&mut self.plan_words),
            &batch.sequences,
            &batch.block_tables,
            bucket,
            self.max_context,
            &attention_shape(w.config),
            batch.block_size,
            self.limits,
        )
        .map_err(|e| ModelError::InvalidStep(e.to_string()))?;
        self.upload(batch, &plan)?;
        timer.mark(Phase::Plan);
        if self.mode == CudaGraphs::On && self.graphs[index].is_none() {
            self.capture(index, w, &plan, kv)?;
        }
        match &self.graphs[index] {
            Some(graph) => graph.replay()?,
            None => self.record(w, &plan, kv)?,
        }
        timer.mark(Phase::Graph);
        timer.drain(&self.device);
        self.plan_words = plan.metadata;
        Ok(self.buffers.logits.narrow(0, 0, n)?)
    }

    /// The step's ids, positions, slots (padding rows: id 0, position 0, no slot) and the
    /// plan's metadata, in one copy.
    fn upload(&mut self, batch: &StepBatch, plan: &AttentionPlan) -> Result<()> {
        self.upload_rows(
            &batch.input_ids,
            &batch.positions,
            &batch.slot_mapping,
            plan,
        )
    }

    fn upload_rows(
        &mut self,
        ids: &[u32],
        positions: &[u32],
        slots: &[u32],
        plan: &AttentionPlan,
    ) -> Result<()> {
        let b = &self.buffers;
        let (rows, n) = (plan.num_tokens, ids.len());
        let words = b.offsets.metadata + plan.metadata.len();
        if words > b.inputs.len() {
            return Err(ModelError::InvalidStep(format!(
                "a decode step's metadata of {words} words past its buffer of {}",
                b.inputs.len()
            )));
        }
        let s = &mut self.staging;
        s.clear();
        s.resize(b.offsets.metadata, 0);
        s[..n].copy_from_slice(ids);
        s[b.offsets.positions..][..n].copy_from_slice(positions);
        s[b.offsets.slots..][..n].copy_from_slice(slots);
        s[b.offsets.slots + n..][..rows - n].fill(PAD_SLOT);
        s.extend_from_slice(&plan.metadata);
        self.buffers.inputs.upload_u32(&self.staging)?;
        Ok(())
    }

    /// Enqueues the step of `plan.num_tokens` rows on the static buffers: what a graph
    /// captures, or what runs eagerly. The layers are `cuda_layers.rs`'s loop.
    fn record(&self, w: &ModelWeights<'_>, plan: &AttentionPlan, kv: &KvCache) -> Result<()> {
        let cfg = w.config;
        let dev = self.device.as_cuda_device()?;
        let b = &self.buffers;
        let rows = plan.num_tokens;
        let hidden = cfg.hidden_size;
        let eps = cfg.rms_norm_eps as f32;
        let ids = b.inputs.at(0)?;
        let embedded = b.embedded.at(0)?;
        let (norm_a, norm_b, delta) = (b.norm_a.at(0)?, b.norm_b.at(0)?, b.delta.at(0)?);
        // The normed half of a norm buffer, for this step's rows.
        let normed_a = b.norm_a.at(rows * hidden)?;
        let (cos, sin) = w.rope.tables();

        tensor_view(&self.embed_table, |table| {
            direct::gather_rows_into(dev, &table, &ids, &embedded, rows, hidden)
        })?;
        tensor_view(cos, |cos| {
            tensor_view(sin, |sin| {
                let mut ops = StaticStep::new(self, w, plan, kv, (&cos, &sin))
                    .map_err(candle_core::Error::wrap)?;
                run_layers(&mut ops, w, kv).map_err(candle_core::Error::wrap)
            })
        })?;
        // The last MLP's output into the stream, the final norm, the logits in f32.
        let (x, pending) = if w.layers.is_empty() {
            (&embedded, None)
        } else {
            (&norm_b, Some(&delta))
        };
        tensor_view(w.norm, |nw| {
            direct::add_rms_norm_into(dev, x, pending, &nw, &norm_a, rows, hidden, eps)
        })?;
        tensor_view(&b.logits, |logits| {
            self.linear_into(&normed_a, w.lm_head, &logits, rows)
                .map_err(candle_core::Error::wrap)
        })?;
        Ok(())
    }

    /// `out = x linear^T (+ bias)` on `rows` rows, cuBLAS on the static buffers.
    fn linear_into(
        &self,
        x: &View<'_>,
        linear: &crate::weights::Linear,
        out: &View<'_>,
        rows: usize,
    ) -> Result<()> {
        let weight = linear
            .dense_weight()
            .ok_or_else(|| ModelError::InvalidStep("a captured step needs dense weights".into()))?;
        let (n, k) = weight.dims2()?;
        tensor_view(weight, |wv| {
            self.matmul.rows_times_transposed(x, &wv, out, (rows, n, k))
        })?;
        if let Some(bias) = linear.bias() {
            let dev = self.device.as_cuda_device()?;
            tensor_view(bias, |bv| direct::add_bias_into(dev, out, &bv, rows, n))?;
        }
        Ok(())
    }
}

/// The layer loop's stages as launches on the static buffers: the first norm of a layer
/// writes `norm_a` (reading the embeddings for layer 0, else `norm_b`'s residual plus the
/// pending `delta`), the second writes `norm_b` from `norm_a`'s.
struct StaticStep<'s, 'v> {
    steps: &'s DecodeSteps,
    dev: &'s candle_core::CudaDevice,
    plan: &'s AttentionPlan,
    rope: (&'v View<'v>, &'v View<'v>),
    max_positions: usize,
    layout: KvLayout,
    rows: usize,
    /// Query heads, KV heads, head size.
    heads: (usize, usize, usize),
    hidden: usize,
    intermediate: usize,
    eps: f32,
    v: StepViews<'s>,
}

/// The static buffers as this step's launches read and write them.
struct StepViews<'s> {
    positions: View<'s>,
    slots: View<'s>,
    metadata: View<'s>,
    embedded: View<'s>,
    norm_a: View<'s>,
    norm_b: View<'s>,
    normed_a: View<'s>,
    normed_b: View<'s>,
    qkv: View<'s>,
    rotated: View<'s>,
    /// K's rows in `rotated`, V's in `qkv`.
    k: View<'s>,
    v: View<'s>,
    attn: View<'s>,
    delta: View<'s>,
    gate_up: View<'s>,
    act: View<'s>,
    split: (View<'s>, View<'s>),
}

impl<'s, 'v> StaticStep<'s, 'v> {
    fn new(
        steps: &'s DecodeSteps,
        w: &ModelWeights<'_>,
        plan: &'s AttentionPlan,
        kv: &KvCache,
        rope: (&'v View<'v>, &'v View<'v>),
    ) -> Result<Self> {
        let cfg = w.config;
        let b = &steps.buffers;
        let rows = plan.num_tokens;
        let (h, kvh, d, hidden) = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.hidden_size,
        );
        let v = StepViews {
            positions: b.inputs.at(b.offsets.positions)?,
            slots: b.inputs.at(b.offsets.slots)?,
            metadata: b.inputs.at(b.offsets.metadata)?,
            embedded: b.embedded.at(0)?,
            norm_a: b.norm_a.at(0)?,
            norm_b: b.norm_b.at(0)?,
            normed_a: b.norm_a.at(rows * hidden)?,
            normed_b: b.norm_b.at(rows * hidden)?,
            qkv: b.qkv.at(0)?,
            rotated: b.rotated.at(0)?,
            k: b.rotated.at(h * d)?,
            v: b.qkv.at((h + kvh) * d)?,
            attn: b.attn.at(0)?,
            delta: b.delta.at(0)?,
            gate_up: b.gate_up.at(0)?,
            act: b.act.at(0)?,
            split: (b.split_acc.at(0)?, b.split_ml.at(0)?),
        };
        Ok(Self {
            steps,
            dev: steps.device.as_cuda_device()?,
            plan,
            rope,
            max_positions: w.rope.max_positions(),
            layout: *kv.layout(),
            rows,
            heads: (h, kvh, d),
            hidden,
            intermediate: cfg.intermediate_size,
            eps: cfg.rms_norm_eps as f32,
            v,
        })
    }

    fn norm(
        &self,
        x: &View<'_>,
        pending: Option<&View<'_>>,
        weight: &Tensor,
        out: &View<'_>,
    ) -> Result<()> {
        let (dev, rows, hidden, eps) = (self.dev, self.rows, self.hidden, self.eps);
        tensor_view(weight, |nw| {
            direct::add_rms_norm_into(dev, x, pending, &nw, out, rows, hidden, eps)
        })?;
        Ok(())
    }
}

impl LayerOps for StaticStep<'_, '_> {
    fn attention_norm(&mut self, layer: usize, weight: &Tensor) -> Result<()> {
        let v = &self.v;
        // The residual stream: the embeddings, then the second norm's output of the layer
        // before, plus its MLP's output.
        let (x, pending) = if layer == 0 {
            (&v.embedded, None)
        } else {
            (&v.norm_b, Some(&v.delta))
        };
        self.norm(x, pending, weight, &v.norm_a)
    }

    fn qkv(&mut self, linear: &Linear) -> Result<()> {
        self.steps
            .linear_into(&self.v.normed_a, linear, &self.v.qkv, self.rows)
    }

    fn rope(&mut self, qk_norm: Option<&(Tensor, Tensor)>) -> Result<()> {
        let (h, kvh, d) = self.heads;
        let v = &self.v;
        let rope = |norm: Option<(&View<'_>, &View<'_>, f32)>| {
            direct::rope_qk_into(
                self.dev,
                &v.qkv,
                (h + 2 * kvh) * d,
                self.rope,
                self.max_positions,
                &v.positions,
                norm,
                &v.rotated,
                self.rows,
                (h, kvh, d),
            )
        };
        match qk_norm {
            Some((qn, kn)) => tensor_view(qn, |qn| {
                tensor_view(kn, |kn| rope(Some((&qn, &kn, self.eps))))
            })?,
            None => rope(None)?,
        }
        Ok(())
    }

    fn attention(&mut self, layer_kv: &Tensor) -> Result<()> {
        let (h, kvh, d) = self.heads;
        let v = &self.v;
        let workspace = self.plan.split.map(|_| (&v.split.0, &v.split.1));
        tensor_view(layer_kv, |cache| {
            direct::write_kv_into(
                self.dev,
                &cache,
                (&v.k, (h + kvh) * d),
                (&v.v, (h + 2 * kvh) * d),
                &v.slots,
                self.rows,
                &self.layout,
            )?;
            direct::paged_attention_into(
                self.dev,
                self.plan,
                &v.metadata,
                (&v.rotated, (h + kvh) * d),
                &cache,
                &self.layout,
                &v.attn,
                workspace,
            )
        })?;
        Ok(())
    }

    fn output(&mut self, linear: &Linear) -> Result<()> {
        self.steps
            .linear_into(&self.v.attn, linear, &self.v.delta, self.rows)
    }

    fn mlp_norm(&mut self, weight: &Tensor) -> Result<()> {
        let v = &self.v;
        self.norm(&v.norm_a, Some(&v.delta), weight, &v.norm_b)
    }

    fn mlp(&mut self, gate_up: &Linear, down: &Linear) -> Result<()> {
        let v = &self.v;
        self.steps
            .linear_into(&v.normed_b, gate_up, &v.gate_up, self.rows)?;
        direct::swiglu_into(self.dev, &v.gate_up, &v.act, self.rows, self.intermediate)?;
        self.steps.linear_into(&v.act, down, &v.delta, self.rows)
    }
}
