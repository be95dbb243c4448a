//! The llama-family transformer with a paged, batched forward: one call computes every token of
//! an engine step, whatever sequence it belongs to and wherever that sequence stands.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::arch::{self, Backend, Mixer, MlpKind, Traits};
use crate::attention::{cpu as cpu_attention, AttentionBackend};
use crate::batch::{GroupTables, StepBatch};
use crate::config::ModelConfig;
use crate::cpu_forward::{self, StepScratch};
#[cfg(feature = "cuda")]
use crate::cuda_forward;
use crate::embedding::Embedding;
use crate::error::{ModelError, Result};
use crate::kv_cache::{CacheKind, KvCache, KvDtype, KvLayout, KvPools, WindowDemand};
use crate::layer::{DeltaNetLayer, Layer, Mlp, ModelWeights, PostNorms};
use crate::load::{ExpertMatrices, LoadOptions, Weight, WeightSource};
use crate::lora::LoraAdapter;
use crate::moe::{routing::RoutingRule, MoeLayer, SharedExpert};
use crate::rope::RotaryTables;
use crate::weights::{Linear, WeightsKind};

pub struct LlamaModel {
    config: ModelConfig,
    device: Device,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    rope: RotaryTables,
    /// Gemma 3's local layers' tables.
    local_rope: Option<RotaryTables>,
    attention: AttentionBackend,
    weights: WeightsKind,
    kv_dtype: KvDtype,
    /// LoRA adapters by slot (slot `i + 1` is `adapters[i]`), which a step's rows name.
    adapters: Vec<Option<Arc<LoraAdapter>>>,
}

impl LlamaModel {
    /// The layers `config` describes, from whichever format holds them.
    pub(crate) fn build(
        config: ModelConfig,
        src: &mut dyn WeightSource,
        options: &LoadOptions,
    ) -> Result<Self> {
        let device = options.device.clone();
        let backend = if device.is_cpu() {
            Backend::Cpu
        } else {
            Backend::Cuda
        };
        // Before any weight moves: a layer kind the backend lacks is refused, not computed
        // wrong or slowly.
        arch::supports(&config, backend).map_err(|what| ModelError::Unsupported {
            path: src.path().to_path_buf(),
            what,
        })?;
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = &device {
            sluice_kernels::cuda::graph::single_stream(dev);
        }
        let kind = options.effective_weights();
        let linear = &options.linear();
        // Norm weights in the element type the forward's activations take (f32 on the CPU; a
        // GPU's half-precision weights make theirs half too), converted once here.
        let act = linear.activation_dtype();
        let (hidden, heads, kv_heads, d, vocab) = (
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.vocab_size,
        );
        let mut embed = src.embedding([vocab, hidden], linear)?;

        let mut layers = Vec::with_capacity(config.num_layers);
        let mut recurrent_index = 0;
        for i in 0..config.num_layers {
            let plan = config.layer_plan(i);
            if plan.mixer == Mixer::GatedDeltaNet {
                let dn = config
                    .delta_net
                    .as_ref()
                    .expect("a DeltaNet layer has a DeltaNetConfig");
                let (mixer, o, delta_net) =
                    Self::build_delta_net(src, dn, i, recurrent_index, hidden, linear)?;
                recurrent_index += 1;
                let mlp = Self::build_mlp(src, &config, &plan, i, linear)?;
                layers.push(Layer {
                    attn_norm: src
                        .dense(Weight::AttnNorm(i), &[hidden], &device)?
                        .to_dtype(act)?,
                    qkv: mixer,
                    output_gate: false,
                    delta_net: Some(Box::new(delta_net)),
                    qk_norm: None,
                    o,
                    post_norms: None,
                    ffn_norm: src
                        .dense(Weight::FfnNorm(i), &[hidden], &device)?
                        .to_dtype(act)?,
                    mlp,
                    window: None,
                    rotary: plan.rotary,
                    sinks: None,
                });
                src.layer_done()?;
                continue;
            }
            // With an output gate, each query head's rows are followed by its gate's.
            let q_rows = heads * d * if plan.output_gate { 2 } else { 1 };
            let biases = if plan.qkv_bias || src.has(Weight::QBias(i)) {
                Some(Tensor::cat(
                    &[
                        src.dense(Weight::QBias(i), &[heads * d], &device)?,
                        src.dense(Weight::KBias(i), &[kv_heads * d], &device)?,
                        src.dense(Weight::VBias(i), &[kv_heads * d], &device)?,
                    ],
                    0,
                )?)
            } else {
                None
            };
            let qkv = src.linear(
                &[
                    (Weight::Q(i), q_rows),
                    (Weight::K(i), kv_heads * d),
                    (Weight::V(i), kv_heads * d),
                ],
                hidden,
                biases,
                linear,
            )?;
            let o_bias = if plan.output_bias {
                Some(src.dense(Weight::OBias(i), &[hidden], &device)?)
            } else {
                None
            };
            let o = src.linear(&[(Weight::O(i), hidden)], heads * d, o_bias, linear)?;
            let sinks = if plan.sinks {
                Some(
                    src.dense(Weight::Sinks(i), &[heads], &Device::Cpu)?
                        .to_vec1::<f32>()?,
                )
            } else {
                None
            };
            let mlp = Self::build_mlp(src, &config, &plan, i, linear)?;
            let post_norms = if plan.post_norms {
                Some(PostNorms {
                    attn: src
                        .dense(Weight::AttnPostNorm(i), &[hidden], &device)?
                        .to_dtype(act)?,
                    ffn: src
                        .dense(Weight::FfnPostNorm(i), &[hidden], &device)?
                        .to_dtype(act)?,
                })
            } else {
                None
            };
            let qk_norm = if plan.qk_norm {
                Some((
                    src.dense(Weight::QNorm(i), &[d], &device)?.to_dtype(act)?,
                    src.dense(Weight::KNorm(i), &[d], &device)?.to_dtype(act)?,
                ))
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: src
                    .dense(Weight::AttnNorm(i), &[hidden], &device)?
                    .to_dtype(act)?,
                qkv,
                output_gate: plan.output_gate,
                delta_net: None,
                qk_norm,
                o,
                post_norms,
                ffn_norm: src
                    .dense(Weight::FfnNorm(i), &[hidden], &device)?
                    .to_dtype(act)?,
                mlp,
                window: plan.attention.window(),
                rotary: plan.rotary,
                sinks,
            });
            src.layer_done()?;
        }
        let norm = src
            .dense(Weight::OutputNorm, &[hidden], &device)?
            .to_dtype(act)?;
        let lm_head = src.lm_head(config.tie_word_embeddings, [vocab, hidden], linear)?;
        if let (true, Embedding::Rows { .. }, Some(panels)) = (
            config.tie_word_embeddings,
            &embed,
            lm_head.panels().filter(|p| p.holds_panels()),
        ) {
            // Tied: look rows up in the lm_head's panels (the same values) instead of keeping
            // a second copy of the table. An f32 lm_head held only as AMX tiles has no panels
            // to read: the table stays in the file's rows.
            embed = Embedding::Panels(panels);
        }
        let weight_bytes = embed.bytes()
            + lm_head.weight_bytes()
            + layers
                .iter()
                .map(|l| l.qkv.weight_bytes() + l.o.weight_bytes() + l.mlp.weight_bytes())
                .sum::<usize>();
        let rope = RotaryTables::new(&config, &device)?;
        let local_rope = RotaryTables::local(&config, &device)?;
        let attention = options
            .attention
            .unwrap_or_else(|| default_backend(&config, &device));
        if attention == AttentionBackend::Cuda && !cuda_runs(&config, &device) {
            return Err(ModelError::Unsupported {
                path: src.path().to_path_buf(),
                what: format!(
                    "attention backend cuda here: it needs the `cuda` feature, a CUDA device and \
                     head_dim 64 or 128 with at most 16 query heads per KV head (head_dim {}, \
                     {} over {})",
                    config.head_dim, config.num_heads, config.num_kv_heads
                ),
            });
        }
        tracing::info!(
            path = %src.path().display(),
            architecture = config.architecture.name(),
            experts = config.moe.as_ref().map_or(0, |m| m.num_experts),
            experts_per_token = config.moe.as_ref().map_or(0, |m| m.num_experts_used),
            layers = config.num_layers,
            hidden = config.hidden_size,
            weights = %kind,
            weight_mib = weight_bytes >> 20,
            ?attention,
            "model loaded"
        );
        Ok(Self {
            config,
            device,
            embed,
            layers,
            norm,
            lm_head,
            rope,
            local_rope,
            attention,
            weights: kind,
            kv_dtype: options.kv_dtype,
            adapters: Vec::new(),
        })
    }

    /// Layer `i`'s MLP as its plan says: dense, or a mixture of experts.
    fn build_mlp(
        src: &mut dyn WeightSource,
        config: &ModelConfig,
        plan: &arch::LayerPlan,
        i: usize,
        linear: &crate::weights::LinearOptions,
    ) -> Result<Mlp> {
        let (hidden, inter) = (config.hidden_size, config.intermediate_size);
        Ok(match (plan.mlp, &config.moe) {
            (MlpKind::Experts, Some(moe)) => Mlp::Experts(Box::new(Self::build_moe(
                src,
                config.architecture.traits(),
                i,
                moe,
                hidden,
                linear,
            )?)),
            (MlpKind::Dense(activation), _) => Mlp::Dense {
                activation,
                gate_up: src.linear(
                    &[(Weight::Gate(i), inter), (Weight::Up(i), inter)],
                    hidden,
                    None,
                    linear,
                )?,
                down: src.linear(&[(Weight::Down(i), hidden)], inter, None, linear)?,
            },
            (MlpKind::Experts, None) => {
                return Err(ModelError::Unsupported {
                    path: src.path().to_path_buf(),
                    what: format!("layer {i} planned with experts in a model without any"),
                })
            }
        })
    }

    /// Layer `i`'s Gated DeltaNet (the `index`-th of the model's): its in-projections stacked
    /// in the kernel's order (q, k, v, z, beta, alpha), its out-projection, and its small
    /// tensors as f32 on the host (the CPU kernel reads them; a GPU refuses these layers).
    fn build_delta_net(
        src: &mut dyn WeightSource,
        dn: &crate::config::DeltaNetConfig,
        i: usize,
        index: usize,
        hidden: usize,
        linear: &crate::weights::LinearOptions,
    ) -> Result<(Linear, Linear, DeltaNetLayer)> {
        let sh = dn.shape();
        let mixer = src.linear(
            &[
                (Weight::SsmQkv(i), sh.conv_dim()),
                (Weight::SsmGate(i), sh.value_dim()),
                (Weight::SsmBeta(i), dn.v_heads),
                (Weight::SsmAlpha(i), dn.v_heads),
            ],
            hidden,
            None,
            linear,
        )?;
        let o = src.linear(&[(Weight::SsmOut(i), hidden)], sh.value_dim(), None, linear)?;
        let mut host = |w: Weight, shape: &[usize]| -> Result<Vec<f32>> {
            Ok(src
                .dense(w, shape, &Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?)
        };
        let layer = DeltaNetLayer {
            conv: host(Weight::SsmConv(i), &[sh.conv_dim(), dn.conv_kernel])?,
            dt_bias: host(Weight::SsmDtBias(i), &[dn.v_heads])?,
            a: host(Weight::SsmA(i), &[dn.v_heads])?,
            norm: host(Weight::SsmNorm(i), &[dn.head_dim])?,
            index,
        };
        Ok((mixer, o, layer))
    }

    /// Layer `i`'s mixture of experts: its router, each expert's MLP, and qwen2moe's shared
    /// expert.
    fn build_moe(
        src: &mut dyn WeightSource,
        traits: &Traits,
        i: usize,
        moe: &crate::config::MoeConfig,
        hidden: usize,
        linear: &crate::weights::LinearOptions,
    ) -> Result<MoeLayer> {
        let n = moe.num_experts;
        let router = src.linear(&[(Weight::Router(i), n)], hidden, None, linear)?;
        let inter = moe.expert_intermediate_size;
        let shape = ExpertMatrices {
            experts: n,
            inter,
            hidden,
        };
        let mut experts = src.experts(i, shape, linear)?;
        let rules = traits
            .experts
            .as_ref()
            .expect("a family with a mixture has expert traits");
        let router_bias = if rules.biases {
            let rows = |src: &mut dyn WeightSource, w: Weight, cols: usize| -> Result<Vec<f32>> {
                Ok(src
                    .dense(w, &[n, cols], &Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()?)
            };
            let (gate, up) = (
                rows(src, Weight::ExpertGateBias(i), inter)?,
                rows(src, Weight::ExpertUpBias(i), inter)?,
            );
            let down = rows(src, Weight::ExpertDownBias(i), hidden)?;
            for (e, expert) in experts.iter_mut().enumerate() {
                let mut gate_up = gate[e * inter..][..inter].to_vec();
                gate_up.extend_from_slice(&up[e * inter..][..inter]);
                expert.gate_up_bias = Some(gate_up);
                expert.down_bias = Some(down[e * hidden..][..hidden].to_vec());
            }
            Some(
                src.dense(Weight::RouterBias(i), &[n], &Device::Cpu)?
                    .to_vec1::<f32>()?,
            )
        } else {
            None
        };
        let shared = match moe.shared_expert_intermediate_size {
            Some(sh) => Some(SharedExpert {
                mlp: crate::moe::Expert {
                    gate_up: src.linear(
                        &[(Weight::SharedGate(i), sh), (Weight::SharedUp(i), sh)],
                        hidden,
                        None,
                        linear,
                    )?,
                    down: src.linear(&[(Weight::SharedDown(i), hidden)], sh, None, linear)?,
                    gate_up_bias: None,
                    down_bias: None,
                },
                intermediate_size: sh,
                gate: src.linear(&[(Weight::SharedRouter(i), 1)], hidden, None, linear)?,
            }),
            None => None,
        };
        Ok(MoeLayer {
            router,
            router_bias,
            activation: rules.activation,
            experts,
            rule: RoutingRule {
                gating: rules.gating,
                k: moe.num_experts_used,
                norm_topk: moe.norm_topk_prob,
                scale: moe.weights_scale,
            },
            intermediate_size: inter,
            shared,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn weights(&self) -> WeightsKind {
        self.weights
    }

    pub fn attention_backend(&self) -> AttentionBackend {
        self.attention
    }

    /// A KV cache shaped for this model, of the element type it was loaded with: one pool for
    /// every attention layer, and for a hybrid as many recurrent states as blocks (a sequence
    /// holds at least one block, so every sequence the cache can hold has a state; the
    /// sequence in state `i` is addressed as state `i`, `KvCache::step_groups`).
    pub fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> Result<KvCache> {
        if self.config.delta_net.is_some() {
            let pools = KvPools {
                num_blocks,
                group_blocks: vec![num_blocks],
            };
            return self.new_kv_cache_pools(pools, block_size);
        }
        KvCache::new(
            &self.config,
            num_blocks,
            block_size,
            self.kv_dtype,
            &self.device,
        )
    }

    /// Blocks of this model's KV cache that fit in `budget_bytes`.
    pub fn kv_blocks_for_budget(&self, budget_bytes: usize, block_size: usize) -> usize {
        KvCache::num_blocks_for_budget(&self.config, budget_bytes, block_size, self.kv_dtype)
    }

    /// How `budget_bytes` splits between the full pool and, on the CPU for a model with
    /// sliding-window layers, their own pool sized for `demand` ([`KvCache::pools_for_budget`]).
    pub fn kv_pools_for_budget(
        &self,
        budget_bytes: usize,
        block_size: usize,
        demand: WindowDemand,
    ) -> KvPools {
        if !self.device.is_cpu() {
            return KvPools::one(self.kv_blocks_for_budget(budget_bytes, block_size));
        }
        KvCache::pools_for_budget(
            &self.config,
            budget_bytes,
            block_size,
            self.kv_dtype,
            demand,
        )
    }

    /// A KV cache with the pools `pools`.
    pub fn new_kv_cache_pools(&self, pools: KvPools, block_size: usize) -> Result<KvCache> {
        KvCache::with_pools(&self.config, pools, block_size, self.kv_dtype, &self.device)
    }

    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// Rejects a batch that would index out of bounds, so bad input is an error, not a panic.
    fn validate(&self, batch: &StepBatch, kv: &KvCache) -> Result<()> {
        let err = |m: String| Err(ModelError::InvalidStep(m));
        if batch.is_empty() {
            return err("empty batch".into());
        }
        if batch.block_size != kv.block_size() {
            return err(format!(
                "batch block size {} != cache block size {}",
                batch.block_size,
                kv.block_size()
            ));
        }
        let t = batch.num_tokens();
        if batch.positions.len() != t || batch.slot_mapping.len() != t {
            return err("positions and slot_mapping must have one entry per token".into());
        }
        if !batch.lora_slots.is_empty() {
            if batch.lora_slots.len() != t {
                return err("lora_slots must be empty or have one entry per token".into());
            }
            if let Some(slot) = batch.lora_slots.iter().find(|&&slot| {
                slot != 0
                    && self
                        .adapters
                        .get(slot as usize - 1)
                        .is_none_or(Option::is_none)
            }) {
                return err(format!("LoRA slot {slot} holds no adapter"));
            }
        }
        if !batch.image_rows.is_empty() {
            // The GPU forward looks every row up as a token, and a recurrent layer has no
            // bidirectional span: the loader refuses a vision tower for either, so a step with
            // image rows here is the caller's mistake.
            if self.attention == AttentionBackend::Cuda || self.config.delta_net.is_some() {
                return err("image rows on a model that takes no images here".into());
            }
            check_image_rows(batch, self.config.hidden_size)?;
        }
        // An image's rows hold cache keys, not tokens: only the others are looked up.
        let mut text_ids = batch.input_ids.iter().enumerate().filter(|(row, _)| {
            !batch
                .image_rows
                .iter()
                .any(|r| (r.row as usize..(r.row + r.len) as usize).contains(row))
        });
        if let Some((_, id)) = text_ids.find(|&(_, &id)| id as usize >= self.config.vocab_size) {
            return err(format!(
                "token id {id} is outside the vocabulary of {}",
                self.config.vocab_size
            ));
        }
        if let Some(p) = batch
            .positions
            .iter()
            .find(|&&p| p as usize >= self.rope.max_positions())
        {
            return err(format!(
                "position {p} is past the model's context length {}",
                self.rope.max_positions()
            ));
        }
        check_pool(
            &batch.slot_mapping,
            &batch.block_tables,
            kv.layout(),
            "the cache",
        )?;
        if batch.groups.len() != kv.groups().len() {
            return err(format!(
                "the step has tables for {} layer groups; the cache has {} beside its full pool",
                batch.groups.len(),
                kv.groups().len()
            ));
        }
        for (g, (tables, (kind, pool))) in batch.groups.iter().zip(kv.groups()).enumerate() {
            let (slot_mapping, block_tables) = match (tables, kind) {
                (
                    GroupTables::Recurrent {
                        states,
                        restore,
                        save,
                    },
                    CacheKind::Recurrent,
                ) => {
                    let n = batch.sequences.len();
                    if states.len() != n || restore.len() != n || save.len() != n {
                        return err(format!(
                            "layer group {g} is recurrent: the step needs one state a sequence, not {} for {}",
                            states.len(),
                            batch.sequences.len()
                        ));
                    }
                    let checkpoints = restore
                        .iter()
                        .flatten()
                        .chain(save.iter().flatten().map(|s| &s.0));
                    if let Some(s) = states
                        .iter()
                        .chain(checkpoints)
                        .find(|&&s| s as usize >= pool.num_blocks)
                    {
                        return err(format!(
                            "state {s} is outside the {} states of layer group {g}",
                            pool.num_blocks
                        ));
                    }
                    for (i, q) in batch.sequences.iter().enumerate() {
                        let start = q.context_len - q.query_len;
                        if restore[i].is_some() && start == 0 || restore[i] == Some(states[i]) {
                            return err(format!(
                                "sequence {i} restores a checkpoint at position 0 or into itself"
                            ));
                        }
                        if let Some((c, after)) = save[i] {
                            if c == states[i] || after == 0 || after as usize > q.query_len {
                                return err(format!(
                                    "sequence {i} saves its state after {after} of its {} tokens into state {c}",
                                    q.query_len
                                ));
                            }
                        }
                    }
                    continue;
                }
                (
                    GroupTables::Paged {
                        slot_mapping,
                        block_tables,
                    },
                    CacheKind::SlidingWindow(_),
                ) => (slot_mapping, block_tables),
                (_, kind) => {
                    return err(format!(
                        "layer group {g} ({kind:?}): the step gave it the other kind of tables"
                    ))
                }
            };
            if slot_mapping.len() != t || block_tables.len() != batch.block_tables.len() {
                return err(format!(
                    "layer group {g} ({kind:?}) has a pool of its own: the step needs a slot and a table entry there beside each full one"
                ));
            }
            check_pool(slot_mapping, block_tables, pool, "a layer group's pool")?;
        }
        let mut expected_start = 0;
        for s in &batch.sequences {
            if s.query_start != expected_start || s.query_len == 0 || s.context_len < s.query_len {
                return err("sequence slices must tile the batch in order".into());
            }
            if s.block_table_len * batch.block_size < s.context_len
                || s.block_table_start + s.block_table_len > batch.block_tables.len()
            {
                return err(format!(
                    "a block table of {} blocks cannot hold {} tokens",
                    s.block_table_len, s.context_len
                ));
            }
            expected_start += s.query_len;
        }
        if expected_start != t {
            return err("sequence slices do not cover the batch".into());
        }
        if !batch.model_sampling.is_empty()
            && batch.model_sampling.len() != batch.logits_indices.len()
        {
            return err(format!(
                "{} model-sampling entries for {} logits rows",
                batch.model_sampling.len(),
                batch.logits_indices.len()
            ));
        }
        if let Some(i) = batch.logits_indices.iter().find(|&&i| i as usize >= t) {
            return err(format!(
                "logits index {i} is outside the batch of {t} tokens"
            ));
        }
        if let Some(i) = batch.hidden_indices.iter().find(|&&i| i as usize >= t) {
            return err(format!(
                "hidden-state index {i} is outside the batch of {t} tokens"
            ));
        }
        Ok(())
    }

    /// One step: writes every token's K/V into its slot, and returns the logits
    /// `[logits_indices.len(), vocab]` (f32) of the rows that sample.
    pub fn forward(&self, batch: &StepBatch, kv: &mut KvCache) -> Result<Tensor> {
        Ok(self.forward_step(batch, kv)?.0)
    }

    /// [`LlamaModel::forward`], also returning the final norm's output
    /// `[hidden_indices.len(), hidden]` (f32) of the rows an embedding pools (`None` when no
    /// row asks).
    pub fn forward_step(
        &self,
        batch: &StepBatch,
        kv: &mut KvCache,
    ) -> Result<(Tensor, Option<Tensor>)> {
        self.forward_step_in(batch, kv, &mut StepScratch::default())
    }

    /// [`LlamaModel::forward_step`] with the CPU step's buffers kept in `scratch` from one step
    /// to the next (the engine's loop), so that steps stop allocating them.
    pub fn forward_step_in(
        &self,
        batch: &StepBatch,
        kv: &mut KvCache,
        scratch: &mut StepScratch,
    ) -> Result<(Tensor, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        if self.attention == AttentionBackend::Cuda {
            let mut timer = crate::cuda_profile::StepTimer::start(batch.num_tokens(), &self.device);
            let out = self.forward_step_timed(batch, kv, scratch, &mut timer);
            timer.finish();
            return out;
        }
        self.validate(batch, kv)?;
        cpu_forward::forward(&self.parts(), self.attention, batch, kv, scratch)
    }

    /// [`LlamaModel::forward_step_in`] with the step's phases marked on `timer` (the CUDA
    /// profile), which the caller finishes: its sampling belongs to the same step.
    #[cfg(feature = "cuda")]
    pub(crate) fn forward_step_timed(
        &self,
        batch: &StepBatch,
        kv: &mut KvCache,
        scratch: &mut StepScratch,
        timer: &mut crate::cuda_profile::StepTimer,
    ) -> Result<(Tensor, Option<Tensor>)> {
        self.validate(batch, kv)?;
        if self.attention == AttentionBackend::Cuda {
            return cuda_forward::forward(&self.parts(), batch, kv, timer);
        }
        cpu_forward::forward(&self.parts(), self.attention, batch, kv, scratch)
    }

    /// A decode step on `steps`' static buffers ([`crate::cuda_graph`]), which take it.
    #[cfg(feature = "cuda")]
    pub(crate) fn forward_decode(
        &self,
        steps: &mut crate::cuda_graph::DecodeSteps,
        batch: &StepBatch,
        kv: &mut KvCache,
        timer: &mut crate::cuda_graph::StepTimer,
    ) -> Result<Tensor> {
        self.validate(batch, kv)?;
        steps.forward(&self.parts(), batch, kv, timer)
    }

    /// A LoRA adapter for this model, read from `path` (a PEFT directory or a GGUF adapter)
    /// and checked against it ([`LoraAdapter::load`]).
    pub fn load_adapter(&self, path: &std::path::Path, max_rank: usize) -> Result<LoraAdapter> {
        if self.config.delta_net.is_some() {
            // An adapter's Q/K/V/O would land on a DeltaNet layer's other projections.
            return Err(ModelError::Unsupported {
                path: path.to_path_buf(),
                what: format!(
                    "a LoRA adapter on {}: adapters on models with Gated DeltaNet layers",
                    self.config.architecture.name()
                ),
            });
        }
        LoraAdapter::load(path, &self.config, max_rank)
    }

    /// Puts `adapter` in `slot` (1 and up; `None` empties it), for the rows of later steps
    /// that name the slot. The CPU forward only: on a GPU the update has no kernel yet, so
    /// this is refused rather than computed row by row on the host.
    pub fn set_adapter(&mut self, slot: u16, adapter: Option<Arc<LoraAdapter>>) -> Result<()> {
        if slot == 0 {
            return Err(ModelError::InvalidStep(
                "LoRA slot 0 is the base model".into(),
            ));
        }
        if adapter.is_some() && !self.device.is_cpu() {
            return Err(ModelError::Unsupported {
                path: adapter
                    .as_ref()
                    .map(|a| a.path().to_path_buf())
                    .unwrap_or_default(),
                what: "LoRA adapters on a GPU (sluice's CUDA forward has no low-rank update \
                       yet; serve adapters with a CPU build)"
                    .into(),
            });
        }
        let i = slot as usize - 1;
        if self.adapters.len() <= i {
            self.adapters.resize(i + 1, None);
        }
        self.adapters[i] = adapter;
        Ok(())
    }

    /// The weights as the forwards read them.
    pub(crate) fn parts(&self) -> ModelWeights<'_> {
        ModelWeights {
            config: &self.config,
            embed: &self.embed,
            layers: &self.layers,
            norm: &self.norm,
            lm_head: &self.lm_head,
            rope: &self.rope,
            local_rope: self.local_rope.as_ref(),
            adapters: &self.adapters,
        }
    }
}

/// The backend a model gets when the options name none: our CUDA kernels on a GPU where they
/// cover the model, the CPU kernel on the CPU, else the candle reference.
fn default_backend(config: &ModelConfig, device: &Device) -> AttentionBackend {
    if cuda_runs(config, device) {
        AttentionBackend::Cuda
    } else if device.is_cpu() && cpu_attention::supports(config.head_dim, config.gqa_group()) {
        AttentionBackend::Cpu
    } else {
        AttentionBackend::Reference
    }
}

/// Whether our CUDA forward runs this model on `device`.
#[cfg(feature = "cuda")]
fn cuda_runs(config: &ModelConfig, device: &Device) -> bool {
    device.is_cuda() && cuda_forward::supports(config)
}

#[cfg(not(feature = "cuda"))]
fn cuda_runs(_: &ModelConfig, _: &Device) -> bool {
    false
}

/// A step's slots and block tables all inside `layout`'s pool (`what`, for the error).
/// A step's image rows name its images, lie inside them and in row order, and its key ends
/// are one a row where it has any.
fn check_image_rows(batch: &StepBatch, hidden: usize) -> Result<()> {
    let err = |m: String| Err(ModelError::InvalidStep(m));
    if !batch.key_ends.is_empty() && batch.key_ends.len() != batch.num_tokens() {
        return err(format!(
            "{} key ends for {} rows",
            batch.key_ends.len(),
            batch.num_tokens()
        ));
    }
    let mut next = 0;
    for r in &batch.image_rows {
        let image = batch.images.get(r.image as usize);
        let fits = image.is_some_and(|i| {
            i.len() % hidden == 0 && (r.first + r.len) as usize <= i.len() / hidden
        });
        if !fits || (r.row as usize) < next || (r.row + r.len) as usize > batch.num_tokens() {
            return err(format!(
                "image rows {r:?} do not fit the step's images and rows"
            ));
        }
        next = (r.row + r.len) as usize;
    }
    Ok(())
}

fn check_pool(slots: &[u32], tables: &[u32], layout: &KvLayout, what: &str) -> Result<()> {
    if let Some(s) = slots.iter().find(|&&s| s as usize >= layout.num_slots()) {
        return Err(ModelError::InvalidStep(format!(
            "slot {s} is outside {what}'s {} slots",
            layout.num_slots()
        )));
    }
    if let Some(b) = tables.iter().find(|&&b| b as usize >= layout.num_blocks) {
        return Err(ModelError::InvalidStep(format!(
            "block {b} is outside {what}'s {} blocks",
            layout.num_blocks
        )));
    }
    Ok(())
}
