//! `sluice serve`'s configuration: one typed [`Config`], layered from built-in defaults, the
//! TOML file (`config/sluice.toml`), `SLUICE_*` environment variables and command-line flags,
//! each overriding the one before.
//!
//! Every key is declared once, in [`config_keys!`]'s list below: its `--help` line, its type,
//! its default and its flag. The macro writes the flags ([`ServeArgs`]) and the configuration
//! ([`Config`], with its defaults) from that one list, so a key cannot be half-added.
//!
//! The layers are merged by figment: `Config::default()` < the file < what clap read. clap
//! reads a flag and its environment variable together (the flag wins), so figment's own `Env`
//! provider is not used: clap already parses `SLUICE_*` with each flag's own parser (`yes`
//! for a boolean, a comma-separated origin list) and lists the variables in `--help`, and a
//! second reader of the same variables could only disagree with it. A value is parsed the
//! same way in every layer (a name such as `bf16` through [`Named`]), so a bad one is an
//! error naming its key or flag wherever it was written.

use sluice_tokenizer::tool_parser::ToolCallFormat;
use sluice_tokenizer::TemplateDate;
use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use figment::providers::{Data, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize, Serializer};
use sluice_engine::MaxTokensPolicy;
use sluice_model::{CudaGraphs, KvDtype, Pooling, WeightsKind};

use crate::media::limits::{self as media, HostList, ImagesPerPrompt, MediaLimits};
use crate::observe::kv_events::{EndpointMode, EventFormat, ZmqEndpoint};

/// The config file read when `--config` is not given, if it exists.
mod models;
pub use models::{ModelChoice, ModelEntry, ModelPaths};

pub const DEFAULT_CONFIG_PATH: &str = "config/sluice.toml";
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Writes, from one list of keys (doc, name, type in the configuration, default, the type its
/// flag parses and the flag's clap attributes): [`ServeArgs`], every flag optional and
/// serialized without the unset ones as the top layer; [`Config`], every key as the merged
/// layers give it (unknown keys in the file are an error, so a typo does not silently leave a
/// default in place); and `Config::default()`, the one place the defaults are written.
macro_rules! config_keys {
    ($(
        $(#[doc = $doc:literal])+
        $name:ident: $ty:ty = $default:expr;
        flag $flag:ty, #[arg($($arg:tt)*)]
    )+) => {
        /// Flags of `sluice serve`. Every one is optional: what is not given falls back to
        /// the environment variable, then the config file, then the default.
        #[derive(clap::Args, Serialize, Debug, Clone, Default)]
        pub struct ServeArgs {
            /// TOML config file [default: config/sluice.toml when it exists].
            #[arg(long, env = "SLUICE_CONFIG", value_name = "PATH")]
            #[serde(skip)]
            pub config: Option<PathBuf>,
            $(
                $(#[doc = $doc])+
                #[arg($($arg)*)]
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $name: Option<$flag>,
            )+
        }

        /// Everything `sluice serve` runs with: the config file's keys (the flag names with
        /// underscores), merged over their defaults and checked.
        #[derive(Clone, Debug, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Config {
            $(
                $(#[doc = $doc])+
                pub $name: $ty,
            )+
        }

        impl Default for Config {
            fn default() -> Self {
                Self {
                    $($name: $default,)+
                }
            }
        }
    };
}

config_keys! {
    /// GGUF model file, Hugging Face model directory (config.json, tokenizer.json,
    /// *.safetensors), or a hub name `ORG/NAME[:QUANT]` fetched into the Hugging Face cache
    /// (docs/models.md). Repeat it to serve several models, each by its own name; the first
    /// is the default and loads at start, the others when first asked for
    /// [default: models/SmolLM2-135M-Instruct.Q4_1.gguf].
    model: ModelPaths = ModelPaths::paths(vec![PathBuf::from(DEFAULT_MODEL)]);
    flag Vec<PathBuf>, #[arg(long, env = "SLUICE_MODEL", value_name = "PATH|ORG/NAME[:QUANT]")]

    /// Most models loaded at once when several are served: asking for another unloads the
    /// one least recently used that has no request running (new requests for a model being
    /// loaded wait) [default: 0, every model].
    max_loaded_models: usize = 0;
    flag usize, #[arg(long, env = "SLUICE_MAX_LOADED_MODELS", value_name = "N")]

    /// The hub revision (branch, tag or commit) a hub name is fetched at, for the model and
    /// a `draft:` model alike [default: main].
    revision: String = sluice_hub::DEFAULT_REVISION.into();
    flag String, #[arg(long, env = "SLUICE_REVISION", value_name = "REV")]

    /// A vision tower for the (default) model: llama.cpp's projector GGUF (`mmproj-*.gguf`,
    /// published beside a model's GGUF files), with which the model takes images on every
    /// API; on the CPU, for Gemma 3's `gemma3` projector [default: none, text only].
    mmproj: Option<PathBuf> = None;
    flag PathBuf, #[arg(long, env = "SLUICE_MMPROJ", value_name = "PATH")]

    /// Model id clients use and `/v1/models` lists [default: the model file name without
    /// extension, or the directory name].
    served_model_name: Option<String> = None;
    flag String, #[arg(long, env = "SLUICE_SERVED_MODEL_NAME", value_name = "NAME")]

    /// Address to listen on [default: 0.0.0.0].
    host: String = "0.0.0.0".into();
    flag String, #[arg(long, env = "SLUICE_HOST", value_name = "ADDR")]

    /// Port to listen on [default: 8000].
    port: u16 = 8000;
    flag u16, #[arg(long, env = "SLUICE_PORT", value_name = "N")]

    /// Weight representation: auto, exact, f32, f16, bf16 or quantized [default: auto].
    weights: Named<WeightsKind> = Named(WeightsKind::Auto);
    flag Named<WeightsKind>, #[arg(long, env = "SLUICE_WEIGHTS", value_name = "KIND")]

    /// On a GPU: decode steps replayed from CUDA graphs captured per batch-size bucket (on),
    /// every step launched op by op (off), or the graphs' launches enqueued without capture
    /// (eager, for comparisons) [default: on].
    cuda_graphs: Named<CudaGraphs> = Named(CudaGraphs::On);
    flag Named<CudaGraphs>, #[arg(long, env = "SLUICE_CUDA_GRAPHS", value_name = "MODE")]

    /// Memory for the KV cache, e.g. 512MiB, 2GiB or a number of bytes [default: 1GiB].
    kv_cache_memory: ByteSize = ByteSize(1 << 30);
    flag ByteSize, #[arg(long, env = "SLUICE_KV_CACHE_MEMORY", value_name = "SIZE")]

    /// Element type of the KV cache: f16, f32, bf16 (GPU) or q8_0 (CPU) [default: f16].
    kv_cache_dtype: KvCacheDtype = KvCacheDtype::F16;
    flag KvCacheDtype, #[arg(long, env = "SLUICE_KV_CACHE_DTYPE", value_name = "DTYPE")]

    /// Tokens per KV-cache block [default: 16].
    block_size: usize = 16;
    flag usize, #[arg(long, env = "SLUICE_BLOCK_SIZE", value_name = "N")]

    /// Most sequences running at once [default: 256].
    max_num_seqs: usize = 256;
    flag usize, #[arg(long, env = "SLUICE_MAX_NUM_SEQS", value_name = "N")]

    /// Most tokens one engine step computes [default: 512].
    max_num_batched_tokens: usize = 512;
    flag usize, #[arg(long, env = "SLUICE_MAX_NUM_BATCHED_TOKENS", value_name = "N")]

    /// Most sequences waiting; past it requests get 429 [default: 1024].
    max_waiting: usize = 1024;
    flag usize, #[arg(long, env = "SLUICE_MAX_WAITING", value_name = "N")]

    /// Longest sequence (prompt + completion) [default: the model's context length].
    max_model_len: Option<usize> = None;
    flag usize, #[arg(long, env = "SLUICE_MAX_MODEL_LEN", value_name = "N")]

    /// A `max_tokens` past what the context leaves after the prompt: `clamp` lowers it to
    /// that (the answer ends with `length` if it gets there), `strict` refuses it with a 400
    /// as vLLM does [default: clamp].
    max_tokens_policy: Named<MaxTokensPolicy> = Named(MaxTokensPolicy::Clamp);
    flag Named<MaxTokensPolicy>, #[arg(long, env = "SLUICE_MAX_TOKENS_POLICY", value_name = "POLICY")]

    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on /v1/*, /tokenize and
    /// /detokenize.
    api_key: Option<ApiKey> = None;
    flag ApiKey, #[arg(long, env = "SLUICE_API_KEY", value_name = "KEY", hide_env_values = true)]

    /// Also require the API key on /metrics (needs --api-key) [default: false, /metrics open].
    metrics_require_key: bool = false;
    flag bool, #[arg(
        long,
        env = "SLUICE_METRICS_REQUIRE_KEY",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]

    /// Comma-separated origins allowed by CORS, or `*` [default: none, CORS off].
    cors_origins: OriginList = OriginList(Vec::new());
    flag OriginList, #[arg(long, env = "SLUICE_CORS_ORIGINS", value_name = "LIST")]

    /// Largest request body; larger ones get 413 [default: 4MiB].
    body_limit: ByteSize = ByteSize(4 << 20);
    flag ByteSize, #[arg(long, env = "SLUICE_BODY_LIMIT", value_name = "SIZE")]

    /// Seconds a client has to send its request headers and body [default: 30].
    request_timeout_secs: u64 = 30;
    flag u64, #[arg(long, env = "SLUICE_REQUEST_TIMEOUT_SECS", value_name = "N")]

    /// The chat page at `/`: on or off (then `/` is a 404) [default: on].
    webui: Switch = Switch::On;
    flag Switch, #[arg(long, env = "SLUICE_WEBUI", value_name = "on|off")]

    /// Log format: text or json [default: text].
    log_format: LogFormat = LogFormat::Text;
    flag LogFormat, #[arg(long, env = "SLUICE_LOG_FORMAT", value_name = "FORMAT")]

    /// Log level or tracing filter, e.g. `info` or `info,sluice_engine=debug` [default: info].
    log_level: String = "info".into();
    flag String, #[arg(long, env = "SLUICE_LOG_LEVEL", value_name = "LEVEL")]

    /// Seconds in-flight requests may take to finish after SIGTERM [default: 30].
    drain_timeout_secs: u64 = 30;
    flag u64, #[arg(long, env = "SLUICE_DRAIN_TIMEOUT_SECS", value_name = "N")]

    /// The date chat templates print through `strftime_now` (gpt-oss's "Current date:"):
    /// `today`, the host's local date at each render, or a day `YYYY-MM-DD` pinned, so that a
    /// prompt renders the same every day [default: today].
    chat_template_date: Named<TemplateDate> = Named(TemplateDate::Today);
    flag Named<TemplateDate>, #[arg(long, env = "SLUICE_CHAT_TEMPLATE_DATE", value_name = "DATE")]

    /// Format tool calls are parsed in and forced in: hermes, llama3_json, mistral or openai (Harmony)
    /// [default: the one the chat template shows, else hermes].
    tool_call_parser: Option<Named<ToolCallFormat>> = None;
    flag Named<ToolCallFormat>, #[arg(long, env = "SLUICE_TOOL_CALL_PARSER", value_name = "NAME")]

    /// How /v1/embeddings pools a sequence's hidden states: last, mean or cls [default: the
    /// pooling the model file declares, else mean].
    pooling: Option<Named<Pooling>> = None;
    flag Named<Pooling>, #[arg(long, env = "SLUICE_POOLING", value_name = "NAME")]

    /// Speculative decoding: `ngram` drafts tokens by finding the sequence's last few tokens
    /// earlier in its own text, `draft:PATH` has a smaller model of the same tokenizer (a GGUF
    /// file or Hugging Face directory) guess them; requests without penalties or grammar
    /// verify them in the same step, with exactly plain decoding's output [default: off].
    speculative: Option<Named<Speculative>> = None;
    flag Named<Speculative>, #[arg(long, env = "SLUICE_SPECULATIVE", value_name = "METHOD")]

    /// Most tokens a sequence drafts per step with --speculative [default: 8].
    num_speculative_tokens: usize = 8;
    flag usize, #[arg(long, env = "SLUICE_NUM_SPECULATIVE_TOKENS", value_name = "N")]

    /// Publish KV-cache events (blocks stored in and removed from the prefix cache) in vLLM's
    /// ZMQ format, for prefix-aware routers: `tcp://*:PORT` binds a PUB socket subscribers
    /// connect to, `tcp://HOST:PORT` connects to a subscriber bound there [default: off].
    kv_events: Option<Named<ZmqEndpoint>> = None;
    flag Named<ZmqEndpoint>, #[arg(long, env = "SLUICE_KV_EVENTS", value_name = "ENDPOINT")]

    /// Topic of every KV-event message; llm-d reads `kv@POD@MODEL`, POD being `POD_IP:PORT` in
    /// llm-d-router 0.10 [default: empty].
    kv_events_topic: String = String::new();
    flag String, #[arg(long, env = "SLUICE_KV_EVENTS_TOPIC", value_name = "TOPIC")]

    /// ROUTER endpoint (`tcp://*:PORT`) that replays recent KV-event batches to a subscriber
    /// that sends the first sequence number it missed [default: off].
    kv_events_replay: Option<Named<ZmqEndpoint>> = None;
    flag Named<ZmqEndpoint>, #[arg(long, env = "SLUICE_KV_EVENTS_REPLAY", value_name = "ENDPOINT")]

    /// KV-event messages one subscriber's send queue holds; past it that subscriber loses
    /// messages (ZMQ's high-water mark) [default: 100000].
    kv_events_hwm: usize = 100_000;
    flag usize, #[arg(long, env = "SLUICE_KV_EVENTS_HWM", value_name = "N")]

    /// KV-event batches kept for replay [default: 10000].
    kv_events_buffer_steps: usize = 10_000;
    flag usize, #[arg(long, env = "SLUICE_KV_EVENTS_BUFFER_STEPS", value_name = "N")]

    /// How KV events are laid out: `map`, each a map tagged by `type` (vLLM's format since
    /// June 2026), or `array`, the fields by position (vLLM's earlier one) [default: map].
    kv_events_format: EventFormat = EventFormat::Map;
    flag EventFormat, #[arg(long, env = "SLUICE_KV_EVENTS_FORMAT", value_name = "FORMAT")]

    /// LoRA adapters served beside the base model, `NAME=PATH` comma-separated (a PEFT
    /// directory or a GGUF adapter each); a request's `model` names one [default: none].
    lora_modules: LoraModules = LoraModules(Vec::new());
    flag LoraModules, #[arg(long, env = "SLUICE_LORA_MODULES", value_name = "NAME=PATH,...")]

    /// LoRA adapters one step may run at once; requests for others wait their turn
    /// [default: 1].
    max_loras: usize = 1;
    flag usize, #[arg(long, env = "SLUICE_MAX_LORAS", value_name = "N")]

    /// Highest rank an adapter may have; a higher one is refused at load [default: 16].
    max_lora_rank: usize = 16;
    flag usize, #[arg(long, env = "SLUICE_MAX_LORA_RANK", value_name = "N")]

    /// Serve `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (behind the API key
    /// when one is set) [default: false].
    allow_runtime_lora_updating: bool = false;
    flag bool, #[arg(
        long,
        env = "SLUICE_ALLOW_RUNTIME_LORA_UPDATING",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]

    /// Most images one prompt may hold, as vLLM writes it (`{"image": 4}`) or a bare number;
    /// more is a 400 naming the first image past it [default: 8].
    limit_mm_per_prompt: ImagesPerPrompt = ImagesPerPrompt::default();
    flag ImagesPerPrompt, #[arg(long, env = "SLUICE_LIMIT_MM_PER_PROMPT", value_name = "JSON|N")]

    /// Hosts image URLs may be fetched from, comma-separated, each compared whole (`*`: any
    /// host); with none, image URLs are refused and images must come as data URIs
    /// [default: none].
    allowed_media_domains: HostList = HostList::default();
    flag HostList, #[arg(long, env = "SLUICE_ALLOWED_MEDIA_DOMAINS", value_name = "HOSTS")]

    /// Let image URLs reach private, loopback and link-local addresses (this host's network)
    /// [default: false].
    allow_private_media_urls: bool = false;
    flag bool, #[arg(
        long,
        env = "SLUICE_ALLOW_PRIVATE_MEDIA_URLS",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]

    /// Seconds fetching one image URL may take, its redirects and body included [default: 10].
    media_fetch_timeout_secs: u64 = media::DEFAULT_FETCH_TIMEOUT_SECS;
    flag u64, #[arg(long, env = "SLUICE_MEDIA_FETCH_TIMEOUT_SECS", value_name = "N")]

    /// Largest image, as sent or fetched, before decoding [default: 20MiB].
    max_image_bytes: ByteSize = ByteSize(media::DEFAULT_MAX_IMAGE_BYTES);
    flag ByteSize, #[arg(long, env = "SLUICE_MAX_IMAGE_BYTES", value_name = "SIZE")]

    /// Most pixels (width times height) of one image, read from its header before it is
    /// decoded [default: 50000000].
    max_image_pixels: u64 = media::DEFAULT_MAX_IMAGE_PIXELS;
    flag u64, #[arg(long, env = "SLUICE_MAX_IMAGE_PIXELS", value_name = "N")]
}

/// Most tokens a sequence may draft per step: past it a draft only adds rows to verify.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// How sequences guess tokens ahead (`--speculative`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Speculative {
    /// Prompt lookup: drafts copied from the sequence's own text.
    Ngram,
    /// A draft model (`draft:PATH`): a smaller model of the same tokenizer guesses.
    DraftModel(PathBuf),
}

impl FromStr for Speculative {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "ngram" => Ok(Self::Ngram),
            "draft:" => Err("`draft:` names no model; write draft:PATH".into()),
            draft if draft.starts_with("draft:") => {
                Ok(Self::DraftModel(PathBuf::from(&draft["draft:".len()..])))
            }
            other => Err(format!(
                "`{other}` is not a speculation method; use ngram or draft:PATH"
            )),
        }
    }
}

impl fmt::Display for Speculative {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ngram => f.write_str("ngram"),
            Self::DraftModel(path) => write!(f, "draft:{}", path.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A value of the file or a flag that does not fit its key (figment's message names the
    /// key and where the value came from), or an unknown key in the file.
    #[error("invalid configuration: {0}")]
    Layers(Box<figment::Error>),
    #[error("invalid {key}: {reason}")]
    Invalid { key: &'static str, reason: String },
}

impl Config {
    /// Reads the config file (`--config`, else `config/sluice.toml` if present) and layers the
    /// flags and environment over it.
    pub fn resolve(args: &ServeArgs) -> Result<Self, ConfigError> {
        let path = match &args.config {
            Some(path) => Some(path.clone()),
            None => Some(PathBuf::from(DEFAULT_CONFIG_PATH)).filter(|p| p.is_file()),
        };
        let file = match path {
            Some(path) => {
                // figment treats a missing file as empty; a file named on purpose must exist.
                if let Err(source) = std::fs::File::open(&path) {
                    return Err(ConfigError::Read { path, source });
                }
                Some(Toml::file_exact(path))
            }
            None => None,
        };
        Self::from_layers(file, args)
    }

    /// `args` (flags and environment) over `file` over the defaults.
    pub fn from_layers(file: Option<Data<Toml>>, args: &ServeArgs) -> Result<Self, ConfigError> {
        let mut layers = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            layers = layers.merge(file);
        }
        let mut config: Config = layers
            .merge(Serialized::defaults(args))
            .extract()
            .map_err(|e| ConfigError::Layers(Box::new(e)))?;
        // A `[[model]]` table's name for the default model stands over --served-model-name.
        if let Some(name) = config
            .model
            .0
            .first()
            .and_then(|e| e.served_model_name.clone())
        {
            config.served_model_name = Some(name);
        }
        if config.served_model_name.is_none() {
            config.served_model_name = Some(default_served_name(config.model.first()));
        }
        // An empty key would make "Bearer " a valid credential; treat it as no key.
        config.api_key = config.api_key.filter(|k| !k.0.is_empty());
        config.check()?;
        Ok(config)
    }

    /// Whether requests may name the default model's LoRA adapters: some are listed, or may
    /// be loaded at run time.
    pub fn lora_enabled(&self) -> bool {
        !self.lora_modules.0.is_empty()
            || self.allow_runtime_lora_updating
            || self
                .model
                .0
                .first()
                .is_some_and(|e| !e.adapters().is_empty())
    }

    /// Every model served, the default first, with what it is loaded with: a `[[model]]`
    /// table's own name, weights and KV memory, else the server's (the default's name is
    /// `--served-model-name`'s, the others' their files' or hub names).
    pub fn models(&self) -> Vec<ModelChoice> {
        self.model
            .0
            .iter()
            .enumerate()
            .map(|(i, e)| ModelChoice {
                path: e.model.clone(),
                name: match (&e.served_model_name, i) {
                    (Some(name), _) => name.clone(),
                    (None, 0) => self.served_model_name().to_string(),
                    (None, _) => default_served_name(&e.model),
                },
                weights: e.weights.map_or(*self.weights, |w| *w),
                kv_cache_memory: e.kv_cache_memory.unwrap_or(self.kv_cache_memory),
                mmproj: match (&e.mmproj, i) {
                    (Some(path), _) => Some(path.clone()),
                    (None, 0) => self.mmproj.clone(),
                    (None, _) => None,
                },
                lora_modules: match i {
                    0 => self
                        .lora_modules
                        .0
                        .iter()
                        .chain(e.adapters())
                        .cloned()
                        .collect(),
                    _ => e.adapters().to_vec(),
                },
            })
            .collect()
    }

    /// The model id clients use (resolved from the model's path when not given).
    pub fn served_model_name(&self) -> &str {
        self.served_model_name.as_deref().unwrap_or_default()
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs(self.drain_timeout_secs)
    }

    /// What the server takes of images.
    pub fn media_limits(&self) -> MediaLimits {
        MediaLimits {
            max_image_bytes: self.max_image_bytes.0,
            max_image_pixels: self.max_image_pixels,
            max_images_per_prompt: self.limit_mm_per_prompt.0,
            allowed_hosts: self.allowed_media_domains.clone(),
            allow_private: self.allow_private_media_urls,
            fetch_timeout: Duration::from_secs(self.media_fetch_timeout_secs),
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        let positive = |key: &'static str, value: u64| {
            if value == 0 {
                Err(ConfigError::Invalid {
                    key,
                    reason: "must be at least 1".into(),
                })
            } else {
                Ok(())
            }
        };
        if self.model.0.is_empty() {
            return Err(ConfigError::Invalid {
                key: "model",
                reason: "names no model".into(),
            });
        }
        // Model and adapter names share one namespace: a request's `model` picks either.
        let mut names: Vec<String> = self
            .models()
            .into_iter()
            .flat_map(|m| std::iter::once(m.name).chain(m.lora_modules.into_iter().map(|(n, _)| n)))
            .collect();
        names.sort();
        if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(ConfigError::Invalid {
                key: "model",
                reason: format!(
                    "two models or adapters would be served as `{}`: give them other names (a \
                     model's served name is its file's stem, a directory's name or the hub \
                     name, unless a [[model]] table names it)",
                    pair[0]
                ),
            });
        }
        positive("block_size", self.block_size as u64)?;
        positive("max_num_seqs", self.max_num_seqs as u64)?;
        positive("max_num_batched_tokens", self.max_num_batched_tokens as u64)?;
        positive("max_waiting", self.max_waiting as u64)?;
        positive("kv_cache_memory", self.kv_cache_memory.0)?;
        positive("body_limit", self.body_limit.0)?;
        positive("request_timeout_secs", self.request_timeout_secs)?;
        positive("max_image_bytes", self.max_image_bytes.0)?;
        positive("max_image_pixels", self.max_image_pixels)?;
        positive("media_fetch_timeout_secs", self.media_fetch_timeout_secs)?;
        if let Some(len) = self.max_model_len {
            positive("max_model_len", len as u64)?;
        }
        positive("num_speculative_tokens", self.num_speculative_tokens as u64)?;
        if self.num_speculative_tokens > MAX_SPECULATIVE_TOKENS {
            return Err(ConfigError::Invalid {
                key: "num_speculative_tokens",
                reason: format!("must be at most {MAX_SPECULATIVE_TOKENS}"),
            });
        }
        positive("kv_events_hwm", self.kv_events_hwm as u64)?;
        if self.lora_enabled() {
            positive("max_loras", self.max_loras as u64)?;
            positive("max_lora_rank", self.max_lora_rank as u64)?;
        }
        let mut names = std::collections::HashSet::new();
        for (name, _) in &self.lora_modules.0 {
            if !names.insert(name) {
                return Err(ConfigError::Invalid {
                    key: "lora_modules",
                    reason: format!("`{name}` is named twice"),
                });
            }
            if *name == self.served_model_name() {
                return Err(ConfigError::Invalid {
                    key: "lora_modules",
                    reason: format!("`{name}` is the base model's name"),
                });
            }
        }
        if let Some(replay) = &self.kv_events_replay {
            let reason = if self.kv_events.is_none() {
                "needs kv_events to be set"
            } else if replay.mode() != EndpointMode::Bind {
                "must bind (tcp://*:PORT): subscribers connect to it"
            } else {
                ""
            };
            if !reason.is_empty() {
                return Err(ConfigError::Invalid {
                    key: "kv_events_replay",
                    reason: reason.into(),
                });
            }
        }
        // Protecting /metrics with no key to protect it with would silently leave it open.
        if self.metrics_require_key && self.api_key.is_none() {
            return Err(ConfigError::Invalid {
                key: "metrics_require_key",
                reason: "needs api_key to be set".into(),
            });
        }
        if self.served_model_name().is_empty() {
            return Err(ConfigError::Invalid {
                key: "served_model_name",
                reason: "must not be empty".into(),
            });
        }
        Ok(())
    }
}

/// `models/SmolLM2-135M-Instruct.Q4_1.gguf` is served as `SmolLM2-135M-Instruct.Q4_1`, a
/// Hugging Face directory `models/Qwen2.5-0.5B-Instruct/` as `Qwen2.5-0.5B-Instruct`, and a hub
/// name as written (`Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q8_0`, as vLLM serves `org/name`).
fn default_served_name(model: &Path) -> String {
    if let sluice_hub::ModelRef::Hub(name) = sluice_hub::ModelRef::classify(model) {
        return name.to_string();
    }
    let name = if model.is_dir() {
        model.file_name()
    } else {
        model.file_stem()
    };
    name.map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| model.to_string_lossy().into_owned())
}

/// A key whose value is written as one of its names (`bf16`, `last`, `hermes`): the flag, the
/// variable and the file read it with the type's own `FromStr`, and the file's key holds its
/// `Display`. Reads as the value itself.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Named<T>(pub T);

impl<T> Deref for Named<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: fmt::Debug> fmt::Debug for Named<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: FromStr<Err = String>> FromStr for Named<T> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse().map(Self)
    }
}

impl<T: fmt::Display> Serialize for Named<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de, T: FromStr<Err = String>> Deserialize<'de> for Named<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map(Self).map_err(serde::de::Error::custom)
    }
}

/// The API key: kept out of logs and panics (its `Debug` says only that it is set).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ApiKey(pub String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<set>")
    }
}

impl FromStr for ApiKey {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_string()))
    }
}

fn split_origins(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// CORS origins: a list of strings in the file, or one comma-separated string (the flag, the
/// variable, or the file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct OriginList(pub Vec<String>);

impl FromStr for OriginList {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(split_origins(s)))
    }
}

impl<'de> Deserialize<'de> for OriginList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self(split_origins(&one_or_many(d)?)))
    }
}

/// A file key written as one comma-separated string or as a list of them: the list joined by
/// commas, so both parse alike.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::One(s) => s,
        Raw::Many(v) => v.join(","),
    })
}

/// `--lora-modules`: adapters by name, `NAME=PATH` comma-separated (in the file, one string or
/// a list of them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
pub struct LoraModules(pub Vec<(String, PathBuf)>);

impl LoraModules {
    fn parse(s: &str) -> Result<Vec<(String, PathBuf)>, String> {
        s.split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(|m| match m.split_once('=') {
                Some((name, path)) if !name.trim().is_empty() && !path.trim().is_empty() => {
                    Ok((name.trim().to_string(), PathBuf::from(path.trim())))
                }
                _ => Err(format!("`{m}` is not NAME=PATH")),
            })
            .collect()
    }
}

impl FromStr for LoraModules {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s).map(Self)
    }
}

impl From<LoraModules> for String {
    fn from(m: LoraModules) -> String {
        m.0.iter()
            .map(|(name, path)| format!("{name}={}", path.display()))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl<'de> Deserialize<'de> for LoraModules {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(&one_or_many(d)?)
            .map(Self)
            .map_err(serde::de::Error::custom)
    }
}

/// A number of bytes, written as a plain number or with a unit: `B`, `KB`/`MB`/`GB` (powers of
/// 1000), `KiB`/`MiB`/`GiB` or `K`/`M`/`G` (powers of 1024); case-insensitive, fractions
/// allowed (`1.5GiB`).
///
/// Parsed by the `bytesize` crate, through a thin wrapper that keeps what sluice documents
/// where bytesize differs: it reads a bare `K`/`M`/`G`/`T` as powers of 1000 (sluice: 1024),
/// saturates a size past `u64::MAX` (sluice: an error), and does not trim blanks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
        for (name, size) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{name}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let bad = || format!("`{s}` is not a size such as 512MiB, 2GiB or 1048576");
        // A bare K, M, G or T is binary here: spell it KiB, MiB... for bytesize.
        let binary;
        let spelled = match s.chars().last() {
            Some(c) if "kmgtKMGT".contains(c) => {
                binary = format!("{s}iB");
                &binary
            }
            _ => s,
        };
        match spelled.parse::<bytesize::ByteSize>() {
            // bytesize saturates what does not fit; no configuration means 16 EiB.
            Ok(size) if size.as_u64() == u64::MAX => Err(bad()),
            Ok(size) => Ok(Self(size.as_u64())),
            Err(reason) => Err(format!("{}: {reason}", bad())),
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(n) => Ok(Self(n)),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Element type of the KV cache. `bf16` only on a GPU (the CPU attention kernel reads f16,
/// f32 and q8_0); `q8_0` (int8 with a scale per 32 values, 1.8x the tokens of f16 per byte)
/// only on the CPU. Loading refuses either elsewhere with a message that says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    F16,
    F32,
    Bf16,
    #[serde(rename = "q8_0")]
    #[value(name = "q8_0")]
    Q8_0,
}

impl KvCacheDtype {
    pub fn dtype(self) -> KvDtype {
        match self {
            Self::F16 => KvDtype::F16,
            Self::F32 => KvDtype::F32,
            Self::Bf16 => KvDtype::Bf16,
            Self::Q8_0 => KvDtype::Q8_0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// A feature turned on or off by name (`--webui off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    On,
    Off,
}

#[cfg(test)]
mod tests;
