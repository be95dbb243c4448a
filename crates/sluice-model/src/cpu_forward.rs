//! The step on the CPU: the layers run on plain row buffers that live across steps
//! ([`StepScratch`]), with our kernels writing into them: one fused pass for each residual add
//! and the norm after it, one for splitting QKV and rotating Q and K, the matmuls straight
//! into their outputs. Each candle op was its own pass, allocation and parallel region; at one
//! row a step was hundreds of them.

use std::ops::Deref;

use candle_core::{DType, Storage, Tensor};
use sluice_kernels::cpu::delta_net::{self, DeltaNetScratch, DeltaNetSeq, DeltaNetWeights};
use sluice_kernels::cpu::rows::{self, QkNorm, QkvShape};
use sluice_kernels::AttentionShape;

use crate::arch::Rotary;
use crate::attention::{cpu as cpu_attention, paged_attention, AttentionBackend};
use crate::batch::{GroupTables, StepBatch};
use crate::error::{ModelError, Result};
use crate::kv_cache::{CacheKind, KvCache};
use crate::last_layer::last_layer_rows;
use crate::layer::{Mlp, ModelWeights};
use crate::lora::{Group, LoraScratch, StepLoras};
use crate::moe::MoeScratch;
use crate::ops::{self, sized};

/// The buffers of a CPU step, kept between steps so that a step allocates none once the
/// largest step has been seen (a 64-row decode step made about 120 MB of allocations).
#[derive(Default)]
pub struct StepScratch {
    /// The residual stream `[T, hidden]`.
    x: Vec<f32>,
    /// The current norm's output `[T, hidden]`.
    normed: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    /// The attention's or the MLP's output projection `[T, hidden]`, added to `x` next.
    proj: Vec<f32>,
    /// Gemma: `proj`'s post-norm, added to `x` in its place.
    post: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    /// Qwen3.5's gated attention: the projection with each query head's gate, and the gates.
    qkv_gated: Vec<f32>,
    gates: Vec<f32>,
    /// A DeltaNet layer's in-projection rows, its output before the out-projection, the
    /// kernel's buffers, and the step's sequences as the kernel takes them.
    mixed: Vec<f32>,
    delta_out: Vec<f32>,
    delta: DeltaNetScratch,
    delta_seqs: Vec<DeltaNetSeq>,
    /// A mixture of experts' buffers (Mixtral, qwen MoE), and what its last step read.
    pub(crate) moe: MoeScratch,
    /// The LoRA update's buffers.
    lora: LoraScratch,
}

impl StepScratch {
    /// The share of the experts' weights the last step read, for a mixture of experts: the
    /// experts at least one row chose over every layer's experts. `None` for a dense model.
    pub fn expert_share(&self) -> Option<f64> {
        self.moe.expert_share()
    }
}

/// A contiguous f32 CPU tensor (a norm's weights, a RoPE table) held for reading as a slice:
/// `G` is the tensor's storage guard.
struct HostValues<G> {
    storage: G,
    start: usize,
    len: usize,
}

impl HostValues<()> {
    #[allow(clippy::new_ret_no_self)]
    fn new<'a>(
        t: &'a Tensor,
        what: &'static str,
    ) -> Result<HostValues<impl Deref<Target = Storage> + 'a>> {
        if t.dtype() != DType::F32 || !t.is_contiguous() {
            return Err(ModelError::InvalidStep(format!(
                "{what} must be contiguous f32 for the CPU forward"
            )));
        }
        let (storage, layout) = t.storage_and_layout();
        if !matches!(&*storage, Storage::Cpu(_)) {
            return Err(ModelError::NotOnCpu(what));
        }
        Ok(HostValues {
            start: layout.start_offset(),
            len: t.elem_count(),
            storage,
        })
    }
}

impl<G: Deref<Target = Storage>> HostValues<G> {
    fn get(&self) -> Result<&[f32]> {
        let Storage::Cpu(cpu) = &*self.storage else {
            unreachable!("checked by HostValues::new")
        };
        Ok(&cpu.as_slice::<f32>()?[self.start..][..self.len])
    }
}

/// One step on the CPU: see [`crate::LlamaModel::forward_step`].
///
/// The step runs on a worker of the kernels' thread pool, entered once: called from another
/// thread, each kernel's parallel region would hand its work to the pool and put the caller to
/// sleep until it ends, a futex wake-up per region (about ten a layer).
pub(crate) fn forward(
    w: &ModelWeights<'_>,
    attention_backend: AttentionBackend,
    batch: &StepBatch,
    kv: &mut KvCache,
    s: &mut StepScratch,
) -> Result<(Tensor, Option<Tensor>)> {
    rayon::scope(|_| forward_on_pool(w, attention_backend, batch, kv, s))
}

fn forward_on_pool(
    w: &ModelWeights<'_>,
    attention_backend: AttentionBackend,
    batch: &StepBatch,
    kv: &mut KvCache,
    s: &mut StepScratch,
) -> Result<(Tensor, Option<Tensor>)> {
    let cfg = w.config;
    let (t, h, kvh, d) = (
        batch.num_tokens(),
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
    );
    let (hidden, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let eps = cfg.rms_norm_eps as f32;
    let dev = candle_core::Device::Cpu;
    let traits = cfg.architecture.traits();
    let global_shape = AttentionShape {
        num_heads: h,
        num_kv_heads: kvh,
        head_dim: d,
        scale: cfg.query_scale(),
        window: None,
    };
    let qkv_shape = QkvShape {
        heads: h,
        kv_heads: kvh,
        head_dim: d,
        rotary_dim: cfg.rotary_dims(),
    };
    let x = sized(&mut s.x, t * hidden);
    input_rows(w, batch, traits.scales_embeddings, x)?;
    let normed = sized(&mut s.normed, t * hidden);
    let qkv = sized(&mut s.qkv, t * (h + 2 * kvh) * d);
    let gated = w.layers.iter().any(|l| l.output_gate);
    let (qkv_gated, gates) = if gated {
        (
            sized(&mut s.qkv_gated, t * (2 * h + 2 * kvh) * d),
            sized(&mut s.gates, t * h * d),
        )
    } else {
        (&mut s.qkv_gated[..0], &mut s.gates[..0])
    };
    let delta_shape = cfg.delta_net.as_ref().map(|dn| dn.shape());
    let (mixed, delta_out) = match delta_shape {
        Some(sh) => {
            delta_sequences(batch, kv, &mut s.delta_seqs)?;
            (
                sized(&mut s.mixed, t * sh.in_cols()),
                sized(&mut s.delta_out, t * sh.value_dim()),
            )
        }
        None => (&mut s.mixed[..0], &mut s.delta_out[..0]),
    };
    let (delta_scratch, delta_seqs) = (&mut s.delta, &s.delta_seqs);
    let q = sized(&mut s.q, t * h * d);
    let k = sized(&mut s.k, t * kvh * d);
    let v = sized(&mut s.v, t * kvh * d);
    let attn = sized(&mut s.attn, t * h * d);
    let proj = sized(&mut s.proj, t * hidden);
    let post = if w.layers.iter().any(|l| l.post_norms.is_some()) {
        sized(&mut s.post, t * hidden)
    } else {
        &mut s.post[..0]
    };
    let moe = &mut s.moe;
    let lora = &mut s.lora;
    moe.start_step();
    // A dense MLP's buffers; a model whose every layer is a mixture needs none.
    let dense_rows = if w.layers.iter().any(|l| matches!(l.mlp, Mlp::Dense { .. })) {
        t
    } else {
        0
    };
    let gate_up = sized(&mut s.gate_up, dense_rows * 2 * inter);
    let act = sized(&mut s.act, dense_rows * inter);
    let loras = StepLoras::new(&batch.lora_slots, w.adapters, lora);
    let (q_cols, kv_cols) = (h * d, kvh * d);
    let (cos, sin) = w.rope.tables();
    let (cos, sin) = (
        HostValues::new(cos, "rope cos")?,
        HostValues::new(sin, "rope sin")?,
    );
    let (cos, sin) = (cos.get()?, sin.get()?);
    let local = match w.local_rope.map(|r| r.tables()) {
        Some((c, s)) => Some((
            HostValues::new(c, "local rope cos")?,
            HostValues::new(s, "local rope sin")?,
        )),
        None => None,
    };
    let local = match &local {
        Some((c, s)) => Some((c.get()?, s.get()?)),
        None => None,
    };

    for (i, layer) in w.layers.iter().enumerate() {
        let attn_norm = HostValues::new(&layer.attn_norm, "attn_norm")?;
        if i == 0 {
            rows::rms_norm(x, attn_norm.get()?, eps, normed);
        } else {
            // The previous layer's MLP output joins the stream here (Gemma: its post-norm).
            let delta: &[f32] = if w.layers[i - 1].post_norms.is_some() {
                post
            } else {
                proj
            };
            rows::add_rms_norm(x, delta, attn_norm.get()?, eps, normed);
        }
        if let (Some(dn), Some(shape)) = (&layer.delta_net, delta_shape) {
            // A Gated DeltaNet layer: its in-projections, the recurrence over each sequence's
            // state, its out-projection into `proj` (where attention's output would be).
            layer.qkv.forward_into(normed, t, mixed)?;
            let states = kv.delta_net_states(dn.index).ok_or_else(|| {
                ModelError::InvalidStep("the cache has no recurrent states".into())
            })?;
            let weights = DeltaNetWeights {
                conv: &dn.conv,
                dt_bias: &dn.dt_bias,
                a: &dn.a,
                norm: &dn.norm,
                eps,
            };
            delta_net::forward(
                shape,
                weights,
                delta_seqs,
                mixed,
                states,
                delta_scratch,
                delta_out,
            );
            layer.o.forward_into(delta_out, t, proj)?;
            let ffn_norm = HostValues::new(&layer.ffn_norm, "ffn_norm")?;
            rows::add_rms_norm(x, proj, ffn_norm.get()?, eps, normed);
            run_mlp(
                layer, i, normed, t, inter, hidden, gate_up, act, moe, &loras, lora, proj,
            )?;
            continue;
        }
        if layer.output_gate {
            // Qwen3.5: each query head's rows are followed by its gate's; the gates aside, the
            // rows are an ordinary Q, K and V.
            layer.qkv.forward_into(normed, t, qkv_gated)?;
            split_gates(qkv_gated, h, kvh, d, qkv, gates);
        } else {
            layer.qkv.forward_into(normed, t, qkv)?;
        }
        loras.add(i, Group::Qkv, normed, qkv, q_cols + 2 * kv_cols, lora);
        let qk_norm = match &layer.qk_norm {
            Some((qn, kn)) => Some((
                HostValues::new(qn, "q_norm")?,
                HostValues::new(kn, "k_norm")?,
            )),
            None => None,
        };
        let qk_norm = match &qk_norm {
            Some((qn, kn)) => Some(QkNorm {
                q: qn.get()?,
                k: kn.get()?,
                eps,
            }),
            None => None,
        };
        // A local layer rotates with its own base where it has one (Gemma 3's local layers).
        let rope = match (layer.rotary, local) {
            (Rotary::None, _) => None,
            (Rotary::Local, Some(tables)) => Some(tables),
            (Rotary::Local | Rotary::Global, _) => Some((cos, sin)),
        };
        rows::split_rope(qkv, &batch.positions, rope, qkv_shape, qk_norm, q, k, v);
        let shape = AttentionShape {
            window: layer.window,
            ..global_shape
        };
        // A layer of a group with a pool of its own is addressed through that group's tables.
        let (slots, tables) = batch.tables(kv.group_of_layer(i));
        kv.write_rows(i, k, v, slots)?;
        let cache = kv
            .host_layer(i)
            .ok_or(ModelError::NotOnCpu("the KV cache"))?;
        let layout = kv.layer_layout(i);
        match attention_backend {
            AttentionBackend::Cpu => {
                let sinks = layer.sinks.as_deref();
                cpu_attention::attend(q, &cache, layout, batch, tables, &shape, sinks, attn)?
            }
            // The reference backend (a test oracle) reads copies of the layer as tensors.
            backend => {
                let (k_cache, v_cache) = cache.tensors(&dev)?;
                let qt = Tensor::from_slice(q, (t, h, d), &dev)?;
                let out = paged_attention(
                    backend,
                    &qt,
                    &k_cache,
                    &v_cache,
                    layout,
                    batch,
                    tables,
                    &shape,
                    layer.sinks.as_deref(),
                )?;
                attn.copy_from_slice(&out.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        if layer.output_gate {
            for (a, g) in attn.iter_mut().zip(gates.iter()) {
                *a *= 1.0 / (1.0 + (-g).exp());
            }
        }
        layer.o.forward_into(attn, t, proj)?;
        loras.add(i, Group::O, attn, proj, hidden, lora);
        let ffn_norm = HostValues::new(&layer.ffn_norm, "ffn_norm")?;
        match &layer.post_norms {
            Some(norms) => {
                let attn_post = HostValues::new(&norms.attn, "post_attention_norm")?;
                rows::rms_norm(proj, attn_post.get()?, eps, post);
                rows::add_rms_norm(x, post, ffn_norm.get()?, eps, normed);
            }
            None => rows::add_rms_norm(x, proj, ffn_norm.get()?, eps, normed),
        }
        run_mlp(
            layer, i, normed, t, inter, hidden, gate_up, act, moe, &loras, lora, proj,
        )?;
        if let Some(norms) = &layer.post_norms {
            let ffn_post = HostValues::new(&norms.ffn, "post_ffw_norm")?;
            rows::rms_norm(proj, ffn_post.get()?, eps, post);
        }
    }
    let last_has_post = w.layers.last().is_some_and(|l| l.post_norms.is_some());
    rows::add(x, if last_has_post { post } else { proj });
    let x = Tensor::from_slice(x, (t, hidden), &dev)?;
    last_layer_rows(&x, w.norm, eps, w.lm_head, batch, cfg)
}

/// Layer `i`'s MLP (dense or experts) on `normed`, into `proj`.
/// The step's input rows into `x` (`[T, hidden]`): each token's embedding (times
/// sqrt(hidden) where the family scales them: Gemma, in f32 as llama.cpp and transformers round
/// it), and for an image's tokens the vision tower's rows as they are (llama.cpp scales only
/// token rows; their `input_ids` are cache keys, not tokens, and are not read).
fn input_rows(w: &ModelWeights<'_>, batch: &StepBatch, scale: bool, x: &mut [f32]) -> Result<()> {
    let hidden = w.config.hidden_size;
    let scale = scale.then(|| (hidden as f32).sqrt());
    let text = |rows: std::ops::Range<usize>, x: &mut [f32]| -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let out = &mut x[rows.start * hidden..rows.end * hidden];
        w.embed.lookup_into(&batch.input_ids[rows], out)?;
        if let Some(scale) = scale {
            out.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(())
    };
    let mut next = 0;
    for run in &batch.image_rows {
        let (row, len) = (run.row as usize, run.len as usize);
        text(next..row, x)?;
        let image = batch
            .images
            .get(run.image as usize)
            .ok_or_else(|| ModelError::InvalidStep(format!("image {} of a step", run.image)))?;
        let first = run.first as usize * hidden;
        let src = image.get(first..first + len * hidden).ok_or_else(|| {
            ModelError::InvalidStep(format!(
                "tokens {}..{} of an image of {} rows of {hidden}",
                run.first,
                run.first as usize + len,
                image.len() / hidden
            ))
        })?;
        x[row * hidden..(row + len) * hidden].copy_from_slice(src);
        next = row + len;
    }
    text(next..batch.num_tokens(), x)
}

#[allow(clippy::too_many_arguments)]
fn run_mlp(
    layer: &crate::layer::Layer,
    i: usize,
    normed: &[f32],
    t: usize,
    inter: usize,
    hidden: usize,
    gate_up: &mut [f32],
    act: &mut [f32],
    moe: &mut MoeScratch,
    loras: &StepLoras<'_>,
    lora: &mut LoraScratch,
    proj: &mut [f32],
) -> Result<()> {
    match &layer.mlp {
        Mlp::Dense {
            gate_up: w_gate_up,
            down,
            activation,
        } => {
            w_gate_up.forward_into(normed, t, gate_up)?;
            loras.add(i, Group::GateUp, normed, gate_up, 2 * inter, lora);
            ops::glu_rows_into(*activation, gate_up, inter, act)?;
            down.forward_into(act, t, proj)?;
            loras.add(i, Group::Down, act, proj, hidden, lora);
        }
        Mlp::Experts(experts) => experts.forward_into(normed, t, moe, proj)?,
    }
    Ok(())
}

/// Qwen3.5's gated Q rows apart: each token's row of `gated` holds, per query head, its `d`
/// query values then its `d` gate values, then K and V; `qkv` gets the queries, K and V (an
/// ordinary projection's row) and `gates` the gates.
fn split_gates(gated: &[f32], h: usize, kvh: usize, d: usize, qkv: &mut [f32], gates: &mut [f32]) {
    let (wide, plain, kv) = ((2 * h + 2 * kvh) * d, (h + 2 * kvh) * d, 2 * kvh * d);
    for ((src, dst), g) in gated
        .chunks_exact(wide)
        .zip(qkv.chunks_exact_mut(plain))
        .zip(gates.chunks_exact_mut(h * d))
    {
        for head in 0..h {
            dst[head * d..][..d].copy_from_slice(&src[2 * head * d..][..d]);
            g[head * d..][..d].copy_from_slice(&src[(2 * head + 1) * d..][..d]);
        }
        dst[h * d..][..kv].copy_from_slice(&src[2 * h * d..][..kv]);
    }
}

/// The step's sequences as the DeltaNet kernel takes them: each one's rows, its state in the
/// cache's recurrent group, and whether it starts at position 0 (a fresh state).
fn delta_sequences(batch: &StepBatch, kv: &KvCache, out: &mut Vec<DeltaNetSeq>) -> Result<()> {
    let group = kv
        .groups()
        .iter()
        .position(|(kind, _)| *kind == CacheKind::Recurrent)
        .ok_or_else(|| ModelError::InvalidStep("the cache has no recurrent group".into()))?;
    let Some(GroupTables::Recurrent {
        states,
        restore,
        save,
    }) = batch.groups.get(group)
    else {
        return Err(ModelError::InvalidStep(format!(
            "layer group {group} is recurrent: the step gave it no states"
        )));
    };
    out.clear();
    out.extend(
        batch
            .sequences
            .iter()
            .zip(states)
            .zip(restore.iter().zip(save))
            .map(|((q, &state), (from, to))| DeltaNetSeq {
                start: q.query_start,
                len: q.query_len,
                state: state as usize,
                fresh: q.context_len == q.query_len,
                restore: from.map(|c| c as usize),
                save: to.map(|(c, n)| (c as usize, n as usize)),
            }),
    );
    Ok(())
}
