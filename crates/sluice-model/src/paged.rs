//! [`PagedLlama`]: a model with the paged KV cache it owns, sized from a memory budget, whose
//! forward writes the sampling rows' logits into a reused buffer. This is what the engine's
//! step loop drives (through its `Model` trait).

use crate::batch::{StepBatch, StepOutput};
use crate::cpu_forward::StepScratch;
use crate::error::{ModelError, Result};
use crate::kv_cache::{CacheKind, KvCache, KvPools, WindowDemand};
use crate::load::CudaGraphs;
use crate::model::LlamaModel;
use crate::model_sampling::{copy_rows, split_rows, RowSampler};
use crate::vision::{VisionError, VisionSpec, VisionTower};

/// The real model and its KV cache.
pub struct PagedLlama {
    model: LlamaModel,
    kv: KvCache,
    /// The CPU step's buffers, reused from step to step.
    scratch: StepScratch,
    /// What sampling rows in the model keeps from step to step.
    sampler: RowSampler,
    /// Decode steps on static buffers and CUDA graphs, once enabled on a GPU.
    #[cfg(feature = "cuda")]
    decode: Option<crate::cuda_graph::DecodeSteps>,
    /// The vision tower whose rows an image's tokens read ([`PagedLlama::attach_vision`]).
    vision: Option<VisionTower>,
}

/// The recurrent states of a cache given by its block count ([`PagedLlama::new`]): one
/// sequence running and one prefix checkpoint, or one sequence that speculates.
pub const STATES_OF_A_SMALL_CACHE: usize = 2;

impl PagedLlama {
    /// A cache of `num_blocks` blocks of `block_size` tokens, one pool for every attention
    /// layer (and [`STATES_OF_A_SMALL_CACHE`] states for a model's recurrent layers).
    pub fn new(model: LlamaModel, num_blocks: usize, block_size: usize) -> Result<Self> {
        let pools = KvPools::one_with_states(model.config(), num_blocks, STATES_OF_A_SMALL_CACHE);
        Self::with_pools(model, pools, block_size)
    }

    /// A cache with the pools `pools` (a second one for the sliding-window layers, if it has).
    pub fn with_pools(model: LlamaModel, pools: KvPools, block_size: usize) -> Result<Self> {
        let kv = model.new_kv_cache_pools(pools, block_size)?;
        Ok(Self {
            model,
            kv,
            scratch: StepScratch::default(),
            sampler: RowSampler::default(),
            #[cfg(feature = "cuda")]
            decode: None,
            vision: None,
        })
    }

    /// On a GPU, decode steps of up to `max_seqs` sequences run on static buffers (allocated
    /// here) as `mode` says: replayed CUDA graphs (`On`), or their launches enqueued eagerly.
    /// Returns the buffers' bytes: 0 where nothing was allocated (`Off`, the CPU, a build
    /// without `cuda`, or a model whose matrices are GGUF blocks on the device).
    pub fn enable_cuda_graphs(&mut self, mode: CudaGraphs, max_seqs: usize) -> Result<usize> {
        #[cfg(feature = "cuda")]
        {
            let parts = self.model.parts();
            self.decode =
                crate::cuda_graph::DecodeSteps::new(&parts, mode, max_seqs, self.kv.block_size())?;
            if let Some(decode) = &mut self.decode {
                decode.capture_all(&parts, &self.kv)?;
            }
            Ok(self.decode.as_ref().map_or(0, |d| d.bytes()))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (mode, max_seqs);
            Ok(0)
        }
    }

    /// As many blocks as fit in `kv_cache_bytes` (K and V of every layer, in the model's KV
    /// element type). A model with sliding-window layers gives them a pool of their own on the
    /// CPU, sized for what `demand`'s sequences' windows can hold at once, and the rest to
    /// the full pool ([`KvCache::pools_for_budget`]).
    pub fn with_memory_budget(
        model: LlamaModel,
        kv_cache_bytes: usize,
        block_size: usize,
        demand: WindowDemand,
    ) -> Result<Self> {
        let pools = model.kv_pools_for_budget(kv_cache_bytes, block_size, demand);
        if pools.num_blocks == 0 {
            let block_bytes = model.kv_dtype().bytes_per_token(model.config()) * block_size;
            return Err(ModelError::KvCacheBudget {
                budget_bytes: kv_cache_bytes,
                block_size,
                block_bytes,
            });
        }
        Self::with_pools(model, pools, block_size)
    }

    pub fn model(&self) -> &LlamaModel {
        &self.model
    }

    /// Gives the model a vision tower (`--mmproj`), whose rows the tokens of a prompt's images
    /// read. Refused where this model cannot take them: a tower whose embeddings are not the
    /// text model's width, a text model of another family than the projector's (Gemma 3's
    /// projector feeds Gemma 3, whose image tokens see the whole image), a model on a GPU (its
    /// forward looks every row up as a token), or one with recurrent layers.
    pub fn attach_vision(
        &mut self,
        tower: VisionTower,
        path: &std::path::Path,
    ) -> Result<(), VisionError> {
        let config = self.model.config();
        let spec = tower.spec();
        let refuse = |what: String| {
            Err(VisionError::Unsupported {
                path: path.to_path_buf(),
                what,
            })
        };
        if spec.embedding_width != config.hidden_size {
            return refuse(format!(
                "a projector into {} values for a text model of hidden size {}: the pair does \
                 not match",
                spec.embedding_width, config.hidden_size
            ));
        }
        if crate::arch::vision_projector(config.architecture) != Some(spec.projector.name()) {
            return refuse(format!(
                "a `{}` projector beside a `{}` text model, which reads {}",
                spec.projector.name(),
                config.architecture.name(),
                crate::arch::vision_projector(config.architecture)
                    .map_or("no images".to_string(), |p| format!(
                        "a `{p}` projector's images"
                    ))
            ));
        }
        if self.model.device().is_cuda() {
            return refuse(
                "a vision tower on a GPU: images run on the CPU only for now (serve this model \
                 with --device cpu, or without --mmproj)"
                    .into(),
            );
        }
        if config.delta_net.is_some() {
            return refuse("a vision tower beside recurrent layers".into());
        }
        self.vision = Some(tower);
        Ok(())
    }

    /// The attached vision tower's input and output, where there is one.
    pub fn vision(&self) -> Option<&VisionSpec> {
        self.vision.as_ref().map(VisionTower::spec)
    }

    /// The tower's rows for `images` (each preprocessed by [`crate::vision::preprocess`])
    /// into `out`, replaced: `[images.len(), tokens_per_image, hidden_size]`, in one batched
    /// forward.
    pub fn encode_images(&self, images: &[&[f32]], out: &mut Vec<f32>) -> Result<(), VisionError> {
        let Some(tower) = &self.vision else {
            return Err(VisionError::InvalidInput(
                "this model has no vision tower".into(),
            ));
        };
        let spec = tower.spec();
        out.clear();
        out.resize(
            images.len() * spec.tokens_per_image * spec.embedding_width,
            0.0,
        );
        tower.encode(images, out)
    }

    pub fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    pub fn max_model_len(&self) -> usize {
        self.model.config().max_position_embeddings
    }

    pub fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    /// Blocks of the full pool.
    pub fn num_blocks(&self) -> usize {
        self.kv.num_blocks()
    }

    /// The layer groups with a pool of their own (none when every layer lives in the full
    /// pool): what each keeps, and its blocks. The step carries their tables in this order
    /// ([`StepBatch::groups`]).
    pub fn kv_groups(&self) -> Vec<(CacheKind, usize)> {
        self.kv
            .groups()
            .iter()
            .map(|(kind, layout)| (*kind, layout.num_blocks))
            .collect()
    }

    /// Bytes of the KV cache, every pool.
    pub fn kv_cache_bytes(&self) -> usize {
        self.kv.bytes(self.model.config())
    }

    pub fn hidden_size(&self) -> usize {
        self.model.config().hidden_size
    }

    /// Puts `adapter` in LoRA slot `slot` ([`LlamaModel::set_adapter`]).
    pub fn set_adapter(
        &mut self,
        slot: u16,
        adapter: Option<std::sync::Arc<crate::lora::LoraAdapter>>,
    ) -> Result<()> {
        self.model.set_adapter(slot, adapter)
    }

    /// Whether sampling rows inside the model ([`StepBatch::model_sampling`]) saves work: on
    /// a GPU, where the full logits would otherwise cross to the host. On the CPU the engine's
    /// own sampler is the faster one, though this model samples rows by the same rule there
    /// when asked.
    pub fn samples_rows(&self) -> bool {
        self.model.device().is_cuda()
    }

    /// A mixture of experts: the share of its experts' weights the last step read (experts at
    /// least one row chose, over every layer's experts); `None` for a dense model.
    pub fn expert_share(&self) -> Option<f64> {
        self.scratch.expert_share()
    }

    /// Computes every token of `batch`, writing their K/V into the cache, and replaces
    /// `out.logits` with the `[rows, vocab_size]` logits of the sampling rows it does not
    /// sample itself (`None` in [`StepBatch::model_sampling`]), `out.sampled` with the tokens of those it
    /// does, and `out.hidden` with the `[batch.hidden_indices.len(), hidden_size]` final
    /// hidden states of the pooled rows, row-major.
    pub fn forward(&mut self, batch: &StepBatch, out: &mut StepOutput) -> Result<()> {
        #[cfg(feature = "cuda")]
        {
            use crate::cuda_profile::{Phase, StepTimer};
            if let Some(decode) = self.decode.as_mut().filter(|d| d.takes(batch)) {
                let mut timer = StepTimer::start(batch.sequences.len(), self.model.device());
                let logits = self
                    .model
                    .forward_decode(decode, batch, &mut self.kv, &mut timer)?;
                out.hidden.clear();
                split_rows(&logits, batch, out, &mut self.sampler)?;
                timer.mark(Phase::Sample);
                timer.finish();
                return Ok(());
            }
            if self.model.device().is_cuda() {
                let mut timer = StepTimer::start(batch.num_tokens(), self.model.device());
                let (logits, hidden) = self.model.forward_step_timed(
                    batch,
                    &mut self.kv,
                    &mut self.scratch,
                    &mut timer,
                )?;
                split_rows(&logits, batch, out, &mut self.sampler)?;
                timer.mark(Phase::Sample);
                timer.finish();
                return copy_hidden(hidden.as_ref(), out);
            }
        }
        let (logits, hidden) =
            self.model
                .forward_step_in(batch, &mut self.kv, &mut self.scratch)?;
        split_rows(&logits, batch, out, &mut self.sampler)?;
        copy_hidden(hidden.as_ref(), out)
    }
}

/// The pooled rows' final hidden states into `out.hidden` (cleared when the step pooled none).
fn copy_hidden(hidden: Option<&candle_core::Tensor>, out: &mut StepOutput) -> Result<()> {
    match hidden {
        Some(hidden) => copy_rows(hidden, &mut out.hidden),
        None => {
            out.hidden.clear();
            Ok(())
        }
    }
}
