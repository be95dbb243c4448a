//! Loading the model (a GGUF file or a Hugging Face directory) into a running engine: weights,
//! tokenizer, chat template ([`load_model`], which `sluice generate` uses too), then the KV
//! cache sized from its memory budget and the engine thread ([`load`]). Blocking (seconds for
//! a real model); the server runs it on a blocking thread while `/health` answers 503.

use sluice_tokenizer::tool_parser::ToolCallFormat;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use candle_core::Device;
use sluice_engine::{Engine, EngineConfig, SpeculationConfig};
use sluice_model::vision::{ProjectorKind, VisionTower};
use sluice_model::{
    CacheKind, CudaGraphs, LlamaModel, LoadOptions, ModelSource, PagedLlama, Pooling, WeightsKind,
    WindowDemand,
};
use sluice_tokenizer::{ChatTemplate, TemplateDate, Tokenizer};

use crate::config::{Config, KvCacheDtype, ModelChoice, Speculative};
use crate::engine::lora::LoraRegistry;
use crate::engine::state::{ImageInputSpec, ModelFacts, ServedModel};

/// What [`load`] needs from the configuration.
#[derive(Debug, Clone)]
pub struct ModelSettings {
    pub model: PathBuf,
    pub served_model_name: String,
    pub weights: WeightsKind,
    /// `--cuda-graphs`.
    pub cuda_graphs: CudaGraphs,
    /// `--tool-call-parser`.
    pub tool_call_parser: Option<ToolCallFormat>,
    /// `--chat-template-date`: what the chat template's `strftime_now` prints.
    pub chat_template_date: TemplateDate,
    /// `--pooling`; `None`: the pooling the model file declares, else mean. It replaces
    /// `engine.pooling` once the model is loaded.
    pub pooling: Option<Pooling>,
    pub kv_cache_bytes: usize,
    pub kv_cache_dtype: KvCacheDtype,
    pub block_size: usize,
    /// `--speculative draft:PATH`: the draft model (`engine.speculation` asks for one).
    pub draft_model: Option<PathBuf>,
    /// LoRA adapters, when requests may name them (`engine.max_loras` is then their slots).
    pub lora: Option<LoraSettings>,
    /// `--mmproj`: the vision tower the model takes images with.
    pub mmproj: Option<PathBuf>,
    pub engine: EngineConfig,
}

/// `--lora-modules`, `--max-lora-rank` and `--allow-runtime-lora-updating`.
#[derive(Debug, Clone)]
pub struct LoraSettings {
    pub modules: Vec<(String, PathBuf)>,
    pub max_rank: usize,
    pub runtime_updates: bool,
}

impl ModelSettings {
    /// The default model's settings (its `[[model]]` table's weights and KV memory, if any).
    pub fn from_config(c: &Config) -> Self {
        let default = c.models().swap_remove(0);
        Self {
            model: c.model.first().to_path_buf(),
            served_model_name: c.served_model_name().to_string(),
            weights: default.weights,
            cuda_graphs: *c.cuda_graphs,
            tool_call_parser: c.tool_call_parser.map(|f| *f),
            chat_template_date: *c.chat_template_date,
            pooling: c.pooling.map(|p| *p),
            kv_cache_bytes: usize::try_from(default.kv_cache_memory.bytes()).unwrap_or(usize::MAX),
            kv_cache_dtype: c.kv_cache_dtype,
            block_size: c.block_size,
            draft_model: match c.speculative.as_deref() {
                Some(Speculative::DraftModel(path)) => Some(path.clone()),
                _ => None,
            },
            lora: c.lora_enabled().then(|| LoraSettings {
                modules: default.lora_modules.clone(),
                max_rank: c.max_lora_rank,
                runtime_updates: c.allow_runtime_lora_updating,
            }),
            mmproj: default.mmproj.clone(),
            engine: EngineConfig {
                max_num_seqs: c.max_num_seqs,
                max_num_batched_tokens: c.max_num_batched_tokens,
                max_waiting: c.max_waiting,
                max_model_len: c.max_model_len,
                speculation: c.speculative.as_deref().map(|s| match s {
                    Speculative::Ngram => SpeculationConfig::ngram(c.num_speculative_tokens),
                    Speculative::DraftModel(_) => {
                        SpeculationConfig::draft_model(c.num_speculative_tokens)
                    }
                }),
                kv_events: c.kv_events.is_some(),
                max_loras: if c.lora_enabled() { c.max_loras } else { 0 },
                max_tokens_policy: *c.max_tokens_policy,
                metrics_model: c.served_model_name().to_string(),
                ..EngineConfig::default()
            },
        }
    }
}

impl ModelSettings {
    /// Another model served beside the default one: the default's settings (limits, KV-cache
    /// dtype, block size) with its own path, name, weights and KV memory; the default's draft
    /// model, adapters and KV events stay the default's.
    /// Its adapters (a `[[model]]` table's `lora_modules`) get `lora`'s rank and `max_loras`
    /// slots, without runtime updates.
    pub fn for_other_model(
        &self,
        model: PathBuf,
        choice: &ModelChoice,
        max_lora_rank: usize,
        max_loras: usize,
    ) -> Self {
        let name = choice.name.clone();
        let mut settings = self.clone();
        settings.model = model;
        settings.weights = choice.weights;
        settings.kv_cache_bytes =
            usize::try_from(choice.kv_cache_memory.bytes()).unwrap_or(usize::MAX);
        settings.engine.metrics_model = name.clone();
        settings.served_model_name = name;
        settings.draft_model = None;
        settings.mmproj = choice.mmproj.clone();
        settings.lora = (!choice.lora_modules.is_empty()).then(|| LoraSettings {
            modules: choice.lora_modules.clone(),
            max_rank: max_lora_rank,
            runtime_updates: false,
        });
        settings.engine.speculation = settings
            .engine
            .speculation
            .filter(|_| self.draft_model.is_none());
        settings.engine.kv_events = false;
        settings.engine.max_loras = if settings.lora.is_some() {
            max_loras
        } else {
            0
        };
        settings
    }
}

pub struct Loaded {
    /// Owns the engine thread; [`Engine::shutdown`] drains it.
    pub engine: Engine,
    pub model: ServedModel,
}

/// A model's weights and what goes with them, before any KV cache or engine exists.
pub struct LoadedModel {
    pub model: LlamaModel,
    pub tokenizer: Tokenizer,
    /// `None` when the model has no usable chat template (not even the ChatML fallback).
    pub chat_template: Option<ChatTemplate>,
}

/// Opens `path` (a GGUF file, or a Hugging Face directory: config.json, tokenizer.json,
/// *.safetensors) and loads its tokenizer, chat template and weights.
pub fn load_model(
    path: &Path,
    weights: WeightsKind,
    kv_cache_dtype: KvCacheDtype,
) -> anyhow::Result<LoadedModel> {
    let start = Instant::now();
    let mut source = ModelSource::open(path)
        .with_context(|| format!("cannot open the model {}", path.display()))?;
    let tokenizer = source
        .tokenizer()
        .with_context(|| format!("cannot build the tokenizer of {}", path.display()))?;
    let chat_template = chat_template(&tokenizer);
    let options = LoadOptions {
        weights,
        device: device()?,
        attention: None,
        kv_dtype: kv_cache_dtype.dtype(),
        ..LoadOptions::default()
    };
    let model = source
        .load_model(&options)
        .with_context(|| format!("cannot load the weights of {}", path.display()))?;
    tracing::info!(
        model = %path.display(),
        weights = %weights,
        kv_cache_dtype = ?kv_cache_dtype,
        context_length = model.config().max_position_embeddings,
        load_ms = start.elapsed().as_millis() as u64,
        "model loaded"
    );
    Ok(LoadedModel {
        model,
        tokenizer,
        chat_template,
    })
}

/// Loads the model and starts the engine. Install the metrics recorder first
/// ([`crate::observe::metrics::install`]): the engine registers its metrics when it starts.
pub fn load(settings: &ModelSettings) -> anyhow::Result<Loaded> {
    let LoadedModel {
        model,
        tokenizer,
        chat_template,
    } = load_model(&settings.model, settings.weights, settings.kv_cache_dtype)?;
    let chat_template = chat_template.map(|t| dated(t, settings.chat_template_date));
    let context_length = model.config().max_position_embeddings;
    let facts = ModelFacts::of(model.config());
    let loras = settings
        .lora
        .as_ref()
        .map(|lora| lora_registry(&model, &settings.served_model_name, lora))
        .transpose()?;
    crate::observe::metrics::record_model(
        &settings.served_model_name,
        facts.parameters as u64,
        facts.active_parameters as u64,
        facts.experts,
    );
    if let Some(len) = settings
        .engine
        .max_model_len
        .filter(|&l| l > context_length)
    {
        tracing::warn!(
            requested = len,
            max_model_len = context_length,
            "--max-model-len {len} is past the model's context length: serving {context_length} \
             tokens a sequence"
        );
    }
    let pooling = settings
        .pooling
        .or(model.config().pooling)
        .unwrap_or(Pooling::Mean);
    tracing::info!(
        pooling = pooling.name(),
        declared = model.config().pooling.map(Pooling::name),
        "embeddings pool by {}",
        pooling.name()
    );
    // Sliding-window layers get a pool sized for what the running sequences' windows hold.
    let demand = WindowDemand {
        max_seqs: settings.engine.max_num_seqs,
        max_batched_tokens: settings.engine.max_num_batched_tokens,
    };
    let shared_window = window_pool_advice(&model, settings, demand);
    let mut paged =
        PagedLlama::with_memory_budget(model, settings.kv_cache_bytes, settings.block_size, demand)
            .context("cannot allocate the KV cache")?;
    let image_input = settings
        .mmproj
        .as_deref()
        .map(|path| attach_vision(&mut paged, path, &tokenizer))
        .transpose()?;
    let groups = paged.kv_groups();
    for &(kind, group_blocks) in &groups {
        match kind {
            CacheKind::SlidingWindow(window) => tracing::info!(
                window,
                window_blocks = group_blocks,
                full_blocks = paged.num_blocks(),
                kv_cache_mib = paged.kv_cache_bytes() >> 20,
                "sliding-window layers keep only their window: their own pool of {group_blocks} \
                 blocks, the rest of --kv-cache-memory goes to the full-attention layers"
            ),
            CacheKind::Recurrent => {
                let state_mib = paged
                    .model()
                    .config()
                    .delta_net
                    .as_ref()
                    .map_or(0.0, |d| d.state_bytes() as f64 / (1 << 20) as f64);
                tracing::info!(
                    states = group_blocks,
                    state_mib,
                    full_blocks = paged.num_blocks(),
                    kv_cache_mib = paged.kv_cache_bytes() >> 20,
                    "Gated DeltaNet layers keep a fixed state a sequence: {group_blocks} states \
                     of {state_mib:.1} MiB (up to twice --max-num-seqs, for running sequences \
                     and prefix checkpoints, in at most half of --kv-cache-memory), the rest to \
                     the full-attention layers' KV blocks"
                )
            }
        }
    }
    if let (true, Some(advice)) = (groups.is_empty(), shared_window) {
        tracing::warn!("{advice}");
    }
    // The decode steps' static buffers (GPU): the largest bucket is the most sequences a step
    // may hold.
    paged
        .enable_cuda_graphs(settings.cuda_graphs, settings.engine.max_num_seqs)
        .context("cannot allocate the CUDA graphs' step buffers")?;
    let config = EngineConfig {
        pooling,
        ..settings.engine.clone()
    };
    let tokenizer = Arc::new(tokenizer);
    let engine = match &settings.draft_model {
        None => Engine::start(Box::new(paged), tokenizer, config),
        Some(path) => {
            let draft = load_draft_model(settings, path, &tokenizer, &paged)?;
            Engine::start_with_draft(Box::new(paged), Box::new(draft), tokenizer, config)
        }
    }
    .context("cannot start the engine")?;
    if let Some(spec) = settings.engine.speculation {
        match &settings.draft_model {
            None => tracing::info!(
                method = "ngram",
                num_speculative_tokens = spec.num_tokens,
                max_running = spec.max_running,
                "speculative decoding on for requests without penalties or grammar (no extra weights or cache)"
            ),
            Some(path) => tracing::info!(
                method = "draft",
                draft_model = %path.display(),
                num_speculative_tokens = spec.num_tokens,
                max_running = spec.max_running,
                "speculative decoding on for requests without penalties or grammar, guessed by the draft model"
            ),
        }
    }
    let limits = engine.handle().limits();
    if limits.kv_cache_tokens < limits.max_model_len {
        tracing::warn!(
            kv_cache_tokens = limits.kv_cache_tokens,
            max_model_len = limits.max_model_len,
            "the KV cache cannot hold one sequence at full context: sequences are limited to \
             {} tokens (raise --kv-cache-memory or lower --max-model-len)",
            limits.kv_cache_tokens
        );
    }
    let mut model = ServedModel::new(
        engine.handle(),
        settings.served_model_name.clone(),
        chat_template,
    );
    model.tool_call_format = settings.tool_call_parser;
    model.root = source_name(&settings.model);
    model.facts = Some(facts);
    model.loras = loras.map(Arc::new);
    model.image_input = image_input;
    Ok(Loaded { engine, model })
}

/// Opens `--mmproj` and gives its tower to `paged` ([`PagedLlama::attach_vision`], which
/// refuses a pair that cannot work, naming why); returns what requests' images need: the
/// tower's spec and the tokens the projector wraps an image in, from the model's vocabulary.
fn attach_vision(
    paged: &mut PagedLlama,
    path: &Path,
    tokenizer: &Tokenizer,
) -> anyhow::Result<ImageInputSpec> {
    let start = Instant::now();
    let tower = VisionTower::open(path)
        .with_context(|| format!("cannot load the vision tower --mmproj {}", path.display()))?;
    let vision = tower.spec().clone();
    let weight_mib = tower.weight_bytes() >> 20;
    // llama.cpp's mtmd writes these around a Gemma 3 image's positions.
    let (open, close) = match vision.projector {
        ProjectorKind::Gemma3 => ("<start_of_image>", "<end_of_image>"),
    };
    let id = |token: &str| {
        tokenizer.token_to_id(token).with_context(|| {
            format!(
                "--mmproj {}: the model's vocabulary has no `{token}`, which a `{}` projector's \
                 images are written between",
                path.display(),
                vision.projector.name()
            )
        })
    };
    let (open, close) = (id(open)?, id(close)?);
    paged
        .attach_vision(tower, path)
        .with_context(|| format!("--mmproj {}", path.display()))?;
    tracing::info!(
        mmproj = %path.display(),
        projector = vision.projector.name(),
        image_size = vision.image_size,
        tokens_per_image = vision.tokens_per_image,
        weight_mib,
        load_ms = start.elapsed().as_millis() as u64,
        "vision tower loaded: images of {0}x{0} pixels, {1} tokens each",
        vision.image_size,
        vision.tokens_per_image
    );
    Ok(ImageInputSpec {
        vision,
        open,
        close,
    })
}

/// The adapters of `--lora-modules`, each read and checked against `model`; the first that
/// fails stops the start, naming it. Refused on a GPU: the CUDA forward has no LoRA update.
fn lora_registry(
    model: &LlamaModel,
    base_name: &str,
    lora: &LoraSettings,
) -> anyhow::Result<LoraRegistry> {
    if !model.device().is_cpu() {
        anyhow::bail!(
            "LoRA adapters (--lora-modules, --allow-runtime-lora-updating) are not served on a GPU: \
             sluice's CUDA forward has no LoRA update yet. Serve them with a build without the \
             `cuda` feature, whose CPU forward runs them"
        );
    }
    let registry = LoraRegistry::new(
        model.config().clone(),
        base_name.to_string(),
        lora.max_rank,
        lora.runtime_updates,
    );
    for (name, path) in &lora.modules {
        registry
            .load(name, path, false)
            .with_context(|| format!("--lora-modules {name}={}", path.display()))?;
    }
    Ok(registry)
}

/// For a model with sliding-window layers that will share the full pool (on the CPU, where
/// they could have their own): why, and what would give them their own. `None` otherwise.
fn window_pool_advice(
    model: &LlamaModel,
    settings: &ModelSettings,
    demand: WindowDemand,
) -> Option<String> {
    let config = model.config();
    let window = config.sliding_window.as_ref()?.window;
    let pools = |max_seqs| {
        let demand = WindowDemand { max_seqs, ..demand };
        model.kv_pools_for_budget(settings.kv_cache_bytes, settings.block_size, demand)
    };
    let own_pools = |max_seqs| !pools(max_seqs).group_blocks.is_empty();
    if !model.device().is_cpu() || own_pools(demand.max_seqs) {
        return None;
    }
    let global = (0..config.num_layers).any(|i| config.window_of_layer(i).is_none());
    if !global {
        return None;
    }
    // The most sequences whose windows a pool of their own could hold within the budget.
    let fits = (1..demand.max_seqs).rev().find(|&n| own_pools(n));
    let hint = match fits {
        Some(n) => format!("--max-num-seqs {n} or less, or a larger --kv-cache-memory"),
        None => "a larger --kv-cache-memory".to_string(),
    };
    Some(format!(
        "the sliding-window layers (window {window}) keep every block in the full pool: \
         windows for --max-num-seqs {} sequences do not fit --kv-cache-memory beside a larger \
         full pool; {hint} gives them a pool of their own, which holds only their windows",
        demand.max_seqs
    ))
}

/// Loads the draft model of `--speculative draft:PATH`: the same weights choice as the
/// target, a tokenizer that reads every id as the target's does (else an error naming both
/// files), and a KV cache of its own holding as many tokens as the target's. Its weights
/// are logged as it loads, its cache's size here.
fn load_draft_model(
    settings: &ModelSettings,
    path: &Path,
    target_tokenizer: &Tokenizer,
    target: &PagedLlama,
) -> anyhow::Result<PagedLlama> {
    let LoadedModel {
        model, tokenizer, ..
    } = load_model(path, settings.weights, settings.kv_cache_dtype)
        .context("cannot load the draft model")?;
    if let Some(difference) = target_tokenizer.vocabulary_difference(&tokenizer) {
        anyhow::bail!(
            "the draft model {} does not share the tokenizer of the model {} ({difference}): \
             a draft model must read every token id as its target does",
            path.display(),
            settings.model.display()
        );
    }
    let tokens = target.num_blocks() * target.block_size();
    let num_blocks = tokens.div_ceil(settings.block_size);
    let bytes = model.kv_dtype().bytes_per_token(model.config()) * num_blocks * settings.block_size;
    let mut paged = PagedLlama::new(model, num_blocks, settings.block_size)
        .context("cannot allocate the draft model's KV cache")?;
    // Its steps are decodes of the few sequences that draft.
    paged
        .enable_cuda_graphs(
            settings.cuda_graphs,
            settings.engine.speculation.map_or(1, |s| s.max_running),
        )
        .context("cannot allocate the draft model's CUDA graph buffers")?;
    tracing::info!(
        draft_model = %path.display(),
        kv_cache_tokens = num_blocks * settings.block_size,
        kv_cache_mib = bytes >> 20,
        "the draft model's KV cache holds as many tokens as the target's"
    );
    Ok(paged)
}

/// The model file's or directory's own name: what `/v1/models` calls the model's `root`
/// (vLLM names the path it loaded; a path on this host is nothing a client should see).
fn source_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
        .into_owned()
}

/// The model's own template; ChatML for a model without one whose vocabulary has ChatML's
/// markers (SmolLM2 and Qwen were tuned on it); otherwise none, and chat requests are a 400.
fn chat_template(tokenizer: &Tokenizer) -> Option<ChatTemplate> {
    if let Some(source) = tokenizer.chat_template() {
        match ChatTemplate::new(source, tokenizer.bos_token(), tokenizer.eos_token()) {
            Ok(t) => return Some(t),
            Err(e) => tracing::warn!("the model's chat template does not compile: {e}"),
        }
    }
    let has_chatml = tokenizer.token_to_id("<|im_start|>").is_some()
        && tokenizer.token_to_id("<|im_end|>").is_some();
    if has_chatml {
        tracing::info!("no usable chat template in the model; using ChatML");
        return ChatTemplate::chatml().ok();
    }
    let has_gemma_turns = tokenizer.token_to_id("<start_of_turn>").is_some()
        && tokenizer.token_to_id("<end_of_turn>").is_some();
    if has_gemma_turns {
        tracing::info!("no usable chat template in the model; using Gemma's turns");
        return ChatTemplate::gemma(tokenizer.bos_token()).ok();
    }
    tracing::warn!("the model has no chat template: /v1/chat/completions will refuse requests");
    None
}

/// `template` printing `date` through `strftime_now`; logged when the template prints a date,
/// since every prompt then depends on it.
pub fn dated(template: ChatTemplate, date: TemplateDate) -> ChatTemplate {
    let template = template.with_date(date);
    if template.reads_date() {
        tracing::info!(
            chat_template_date = %date,
            "the chat template prints the date (strftime_now): {}",
            match date {
                TemplateDate::Today => "today's, so prompts change at midnight (pin it with --chat-template-date)",
                TemplateDate::Pinned(_) => "pinned by --chat-template-date",
            }
        );
    }
    template
}

#[cfg(feature = "cuda")]
fn device() -> anyhow::Result<Device> {
    Device::new_cuda(0).context("cannot open CUDA device 0")
}

#[cfg(not(feature = "cuda"))]
fn device() -> anyhow::Result<Device> {
    Ok(Device::Cpu)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sluice_engine::{Event, FinishReason, Request};
    use sluice_model::testing::{HfExport, TinyModelSpec};

    use super::*;

    /// `--model` may name a Hugging Face directory: it loads with its tokenizer.json and chat
    /// template, and the engine generates from it.
    #[test]
    fn loads_a_hugging_face_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tiny-hf");
        TinyModelSpec::default()
            .write_hf(&dir, &HfExport::default())
            .unwrap();
        let settings = ModelSettings {
            model: dir,
            served_model_name: "tiny-hf".into(),
            tool_call_parser: None,
            chat_template_date: TemplateDate::Today,
            pooling: None,
            weights: WeightsKind::Auto,
            cuda_graphs: CudaGraphs::On,
            kv_cache_bytes: 4 << 20,
            kv_cache_dtype: KvCacheDtype::F16,
            block_size: 16,
            draft_model: None,
            lora: None,
            mmproj: None,
            engine: EngineConfig::default(),
        };
        let loaded = load(&settings).unwrap();
        assert!(loaded.model.chat_template.is_some());
        let handle = loaded.engine.handle();
        let prompt = handle.tokenizer().encode("the thin").unwrap();
        let mut request = Request::new(prompt, 4);
        request.stop.ignore_eos = true;
        let mut stream = handle.submit(handle.validate(request).unwrap()).unwrap();
        let (mut tokens, mut finish) = (0, None);
        while let Some(event) = stream.blocking_recv() {
            match event {
                Event::Token(_) => tokens += 1,
                Event::Finished(f) => finish = Some(f.reason),
            }
        }
        assert_eq!((tokens, finish), (4, Some(FinishReason::Length)));
        loaded.engine.shutdown(Duration::from_secs(1));
    }

    fn settings(model: PathBuf, draft_model: Option<PathBuf>) -> ModelSettings {
        ModelSettings {
            model,
            served_model_name: "tiny".into(),
            tool_call_parser: None,
            chat_template_date: TemplateDate::Today,
            pooling: None,
            weights: WeightsKind::F32,
            cuda_graphs: CudaGraphs::On,
            kv_cache_bytes: 4 << 20,
            kv_cache_dtype: KvCacheDtype::F32,
            block_size: 16,
            lora: None,
            mmproj: None,
            engine: EngineConfig {
                speculation: draft_model
                    .is_some()
                    .then(|| SpeculationConfig::draft_model(4)),
                ..EngineConfig::default()
            },
            draft_model,
        }
    }

    fn generate(loaded: &Loaded, text: &str) -> Vec<u32> {
        let handle = loaded.engine.handle();
        let prompt = handle.tokenizer().encode(text).unwrap();
        let mut request = Request::new(prompt, 24);
        request.stop.ignore_eos = true;
        let mut stream = handle.submit(handle.validate(request).unwrap()).unwrap();
        let mut tokens = Vec::new();
        while let Some(event) = stream.blocking_recv() {
            match event {
                Event::Token(t) => tokens.push(t.token),
                Event::Finished(f) => assert_eq!(f.reason, FinishReason::Length),
            }
        }
        tokens
    }

    /// `--speculative draft:PATH` loads a second, smaller model of the same tokenizer (here a
    /// Hugging Face directory drafting for a GGUF file) with a cache as large as the target's,
    /// and the answers are plain decoding's.
    #[test]
    fn a_draft_model_guesses_and_changes_no_token() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target.gguf");
        TinyModelSpec::default().write_gguf(&target).unwrap();
        let draft = tmp.path().join("draft-hf");
        TinyModelSpec {
            num_layers: 1,
            seed: 8,
            ..TinyModelSpec::default()
        }
        .write_hf(&draft, &HfExport::default())
        .unwrap();
        let plain = load(&settings(target.clone(), None)).unwrap();
        let texts = ["the thin", "the the the the", "a"];
        let want: Vec<Vec<u32>> = texts.iter().map(|t| generate(&plain, t)).collect();
        let drafted = load(&settings(target, Some(draft))).unwrap();
        for (text, want) in texts.iter().zip(&want) {
            assert_eq!(&generate(&drafted, text), want, "{text}");
        }
        let stats = drafted.engine.handle().stats();
        assert!(stats.spec_draft_tokens > 0, "{stats:?}");
        assert_eq!(
            stats.draft_kv_blocks_total * 16,
            stats.kv_blocks_total * 16,
            "the draft cache holds as many tokens as the target's"
        );
    }

    /// A draft model whose tokenizer reads an id differently is refused at start, by both
    /// files' names.
    #[test]
    fn a_draft_model_of_another_tokenizer_is_refused_naming_both_files() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target.gguf");
        TinyModelSpec::default().write_gguf(&target).unwrap();
        let draft = tmp.path().join("other-tokenizer");
        TinyModelSpec::default()
            .write_hf(&draft, &HfExport::default())
            .unwrap();
        // Rename one token of its vocabulary.
        let path = draft.join("tokenizer.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let vocab = json["model"]["vocab"].as_object_mut().unwrap();
        let name = vocab
            .iter()
            .find(|(_, id)| id.as_u64() == Some(100))
            .map(|(name, _)| name.clone())
            .expect("the tiny vocabulary has an id 100");
        let id = vocab.remove(&name).unwrap();
        vocab.insert("renamed".into(), id);
        std::fs::write(&path, json.to_string()).unwrap();
        let err = load(&settings(target.clone(), Some(draft.clone())))
            .err()
            .expect("refused");
        let message = format!("{err:#}");
        assert!(
            message.contains(&target.display().to_string())
                && message.contains(&draft.display().to_string())
                && message.contains("tokenizer"),
            "{message}"
        );
    }
}
