//! The model being served, as handlers see it: its engine handle, name, chat template,
//! adapters and the facts `/v1/models` states; the constraint compiler built at first use.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_engine::{Constraint, ConstraintCompiler, EngineHandle, Grammar, ModelLimits};
use sluice_model::vision::VisionSpec;
use sluice_tokenizer::tool_parser::ToolCallFormat;
use sluice_tokenizer::{ChatTemplate, Tokenizer};

use crate::edge::error::ApiError;
use crate::engine::lora::LoraRegistry;
use crate::observe::vllm_metrics::{CacheShape, VllmMetrics};

/// The model being served, as handlers see it.
pub struct ServedModel {
    pub engine: EngineHandle,
    /// The id clients send as `model` and `/v1/models` lists.
    pub name: String,
    /// `None` when the model has no usable chat template: chat requests are then a 400.
    pub chat_template: Option<ChatTemplate>,
    /// Unix seconds when the model was loaded.
    pub created: u64,
    /// Built at the first constrained request: it walks the whole vocabulary, which a server
    /// that never sees one should not pay for at start.
    constraints: OnceLock<Result<ConstraintCompiler, String>>,
    /// `--tool-call-parser`: the format tool calls are parsed in, over the template's own.
    pub tool_call_format: Option<ToolCallFormat>,
    /// What the weights were loaded from (`/v1/models`' `root`): the model file's or
    /// directory's name, never a path on this host; the served name until a loader says.
    pub root: String,
    /// vLLM's metric names for this model, refreshed at each scrape of `/metrics`.
    pub vllm_metrics: VllmMetrics,
    /// What the loader read of the model (architecture, parameters, experts), for
    /// `/v1/models`; `None` where a test serves a model without loading one.
    pub facts: Option<ModelFacts>,
    /// The LoRA adapters served beside it; `None` when requests may name none.
    pub loras: Option<Arc<LoraRegistry>>,
    /// How the model reads images, when it does (a vision tower loaded beside it); `None`: it
    /// reads text only, and a request with an image is a 400 naming it.
    pub image_input: Option<ImageInputSpec>,
}

/// What a model that reads images needs of them: the loader fills it from its vision tower.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageInputSpec {
    /// The tower's input and output: the square images are resized to (Gemma 3's SigLIP:
    /// 896), its normalisation, the tokens one image takes in the prompt (Gemma 3: 256).
    pub vision: VisionSpec,
    /// The tokens the projector wraps an image's positions in, as llama.cpp's mtmd places
    /// them (Gemma 3: `<start_of_image>` and `<end_of_image>`).
    pub open: u32,
    pub close: u32,
}

/// What `/v1/models` and `/metrics` say of the served model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFacts {
    /// GGUF's name of the architecture (`llama` for Mixtral too).
    pub architecture: &'static str,
    pub parameters: usize,
    /// Parameters one token multiplies by: a mixture's chosen experts only.
    pub active_parameters: usize,
    /// A mixture of experts: (experts a layer holds, experts a token runs).
    pub experts: Option<(usize, usize)>,
}

impl ModelFacts {
    pub fn of(config: &sluice_model::ModelConfig) -> Self {
        Self {
            architecture: config.architecture.name(),
            parameters: config.num_parameters(),
            active_parameters: config.active_parameters(),
            experts: config
                .moe
                .as_ref()
                .map(|m| (m.num_experts, m.num_experts_used)),
        }
    }
}

impl ServedModel {
    /// Registers the model's vLLM-named metrics (labelled with `name`) with the installed
    /// recorder, so `/metrics` lists them from the moment the model is served.
    pub fn new(engine: EngineHandle, name: String, chat_template: Option<ChatTemplate>) -> Self {
        let vllm_metrics = VllmMetrics::register(&name, CacheShape::of(&engine));
        Self {
            engine,
            root: name.clone(),
            name,
            chat_template,
            created: unix_now(),
            constraints: OnceLock::new(),
            tool_call_format: None,
            vllm_metrics,
            facts: None,
            loras: None,
            image_input: None,
        }
    }

    /// Compiles a request's grammar against this model's vocabulary; a grammar that does not
    /// compile is a 400 naming `param`. Blocking (a schema can take milliseconds): call it
    /// off the async runtime.
    pub fn compile_constraint(
        &self,
        grammar: Grammar,
        param: &str,
    ) -> Result<Constraint, ApiError> {
        let compiler = self
            .constraints
            .get_or_init(|| {
                ConstraintCompiler::new(self.tokenizer().clone(), self.limits().vocab_size)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| ApiError::invalid(param, e.clone()))?;
        compiler
            .compile(grammar)
            .map_err(|e| ApiError::invalid(param, e.to_string()))
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        self.engine.tokenizer()
    }

    pub fn limits(&self) -> ModelLimits {
        self.engine.limits()
    }

    /// The most tokens one sequence can hold: the context length, or the whole KV cache when
    /// that is smaller. This is the `max_model_len` clients are shown, and the length the
    /// context-length error names.
    pub fn capacity(&self) -> usize {
        let l = self.limits();
        l.max_model_len.min(l.kv_cache_tokens)
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
