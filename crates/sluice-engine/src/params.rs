//! What a client asks the engine for: the prompt (token ids: the server tokenizes), how many
//! sequences, how to pick tokens and when to stop. Validation lives here too, once: a
//! [`ValidRequest`] is the only thing the engine takes, and every way a request can be
//! malformed is one [`InvalidRequest`] variant the server turns into a 400.

use std::sync::Arc;

use sluice_model::LoraAdapter;

use crate::block_manager::AdapterKey;
use crate::constraint::Constraint;
use crate::images::{image_keys, ImageLimits, PromptImage};

/// Temperatures below this are greedy, as in vLLM: dividing by a tiny temperature only turns
/// the distribution into an argmax with extra rounding.
pub const GREEDY_TEMPERATURE: f32 = 1e-5;
/// Most alternatives [`SamplingParams::logprobs`] may ask for (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 20;
/// Most sequences one request may ask for.
pub const MAX_N: usize = 128;
/// Most stop strings per request, and the longest one in bytes: each generated token is
/// checked against every one of them.
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_STRING_BYTES: usize = 256;

/// How each token is chosen from the model's logits. Processing order (vLLM's): `logit_bias`,
/// then the repetition, frequency and presence penalties, then `temperature`, then the
/// `min_p`, `top_n_sigma`, `top_k` and `top_p` filters, then one draw from what is left.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 (below [`GREEDY_TEMPERATURE`]) is greedy: the argmax, no randomness. In `[0, 2]`
    /// (OpenAI's range).
    pub temperature: f32,
    /// Keep the smallest set of most likely tokens whose probability adds up to at least this;
    /// 1 keeps everything. In `(0, 1]`.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens (ties at the boundary included); 0 keeps everything.
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` times the most likely one. In `[0, 1]`.
    pub min_p: f32,
    /// Top-nσ (Tang et al., 2024; llama.cpp's `top_n_sigma`): keep the tokens whose logit is
    /// within this many standard deviations of the row's logits below the largest; 0 keeps
    /// everything. In `[0, 100]`.
    pub top_n_sigma: f32,
    /// Subtracted once from the logit of every token already generated. In `[-2, 2]`.
    pub presence_penalty: f32,
    /// Subtracted from each token's logit once per time it was generated. In `[-2, 2]`.
    pub frequency_penalty: f32,
    /// Divides positive logits and multiplies negative ones of every token in the prompt or the
    /// output; 1 is off, above 1 discourages repeats. In `(0, 2]`.
    pub repetition_penalty: f32,
    /// Added to the logit of a token id. Each bias in `[-100, 100]`.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seeds the sequence's random generator: the same seed gives the same tokens whatever
    /// else is batched. `None` draws a random seed.
    pub seed: Option<u64>,
    /// Report the log-probability of each chosen token and of this many most likely
    /// alternatives (0: the chosen token only), from the model's unmodified logits.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            top_n_sigma: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            seed: None,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Deterministic argmax decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE
    }

    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// Checks every field; `vocab_size` bounds the token ids of `logit_bias`.
    fn validate(&self, vocab_size: usize) -> Result<(), InvalidRequest> {
        in_range(
            "temperature",
            self.temperature,
            (0.0..=2.0).contains(&self.temperature),
            "[0, 2]",
        )?;
        in_range(
            "top_p",
            self.top_p,
            self.top_p > 0.0 && self.top_p <= 1.0,
            "(0, 1]",
        )?;
        in_range(
            "min_p",
            self.min_p,
            (0.0..=1.0).contains(&self.min_p),
            "[0, 1]",
        )?;
        in_range(
            "top_n_sigma",
            self.top_n_sigma,
            (0.0..=100.0).contains(&self.top_n_sigma),
            "[0, 100]",
        )?;
        for (param, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            in_range(param, value, (-2.0..=2.0).contains(&value), "[-2, 2]")?;
        }
        let repetition = self.repetition_penalty;
        in_range(
            "repetition_penalty",
            repetition,
            repetition > 0.0 && repetition <= 2.0,
            "(0, 2]",
        )?;
        for &(token, bias) in &self.logit_bias {
            if token as usize >= vocab_size {
                return Err(InvalidRequest::TokenOutOfVocab {
                    param: "logit_bias",
                    token,
                    vocab_size,
                });
            }
            if !(-100.0..=100.0).contains(&bias) {
                return Err(InvalidRequest::Param {
                    param: "logit_bias",
                    reason: format!("the bias {bias} of token {token} is not in [-100, 100]"),
                });
            }
        }
        match self.logprobs {
            Some(requested) if requested > MAX_LOGPROBS => Err(InvalidRequest::TooManyLogprobs {
                requested,
                max: MAX_LOGPROBS,
            }),
            _ => Ok(()),
        }
    }
}

/// `ok` says whether `value` is in `range` (NaN and infinities never are: every range here
/// is bounded).
fn in_range(
    param: &'static str,
    value: f32,
    ok: bool,
    range: &'static str,
) -> Result<(), InvalidRequest> {
    if ok {
        Ok(())
    } else {
        Err(InvalidRequest::OutOfRange {
            param,
            value,
            range,
        })
    }
}

/// When a sequence ends, besides `max_tokens` and the model's context length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopParams {
    /// Strings that end the sequence when they appear in its text; the text is cut before the
    /// first one (see `include_stop_str_in_output`).
    pub stop: Vec<String>,
    /// Token ids that end the sequence; their text is not part of the output.
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past the tokenizer's end-of-sequence ids.
    pub ignore_eos: bool,
    /// Before this many tokens, EOS and stop token ids cannot be sampled and stop strings are
    /// not looked for.
    pub min_tokens: usize,
    /// End the output with the stop string that matched instead of cutting it off.
    pub include_stop_str_in_output: bool,
    /// Leave control tokens (`<|im_end|>`, ...) out of the text.
    pub skip_special_tokens: bool,
}

impl Default for StopParams {
    fn default() -> Self {
        Self {
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            min_tokens: 0,
            include_stop_str_in_output: false,
            skip_special_tokens: true,
        }
    }
}

impl StopParams {
    fn validate(&self, vocab_size: usize) -> Result<(), InvalidRequest> {
        let bad = |reason: String| {
            Err(InvalidRequest::Param {
                param: "stop",
                reason,
            })
        };
        if self.stop.len() > MAX_STOP_STRINGS {
            return bad(format!(
                "{} stop strings were given; at most {MAX_STOP_STRINGS} are allowed",
                self.stop.len()
            ));
        }
        for s in &self.stop {
            if s.is_empty() {
                return bad("a stop string is empty".into());
            }
            if s.len() > MAX_STOP_STRING_BYTES {
                return bad(format!(
                    "a stop string has {} bytes; at most {MAX_STOP_STRING_BYTES} are allowed",
                    s.len()
                ));
            }
        }
        if let Some(&token) = self
            .stop_token_ids
            .iter()
            .find(|&&t| t as usize >= vocab_size)
        {
            return Err(InvalidRequest::TokenOutOfVocab {
                param: "stop_token_ids",
                token,
                vocab_size,
            });
        }
        Ok(())
    }
}

/// One generation request: `n` sequences continuing `prompt`.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Prompt token ids, as the model reads them (BOS included when the model wants it).
    pub prompt: Vec<u32>,
    /// Independent sequences to generate from the prompt (they share its KV blocks).
    pub n: usize,
    /// Most tokens each sequence generates; `None`: up to the model's context length (or the
    /// whole KV cache, when that is smaller). [`ValidRequest::new`] resolves it: in a valid
    /// request it is always `Some`.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: StopParams,
    /// The language every sequence's output must belong to (structured outputs, forced tool
    /// calls), compiled by the server at the edge.
    pub constraint: Option<Constraint>,
    /// The LoRA adapter it runs with (the server's, by the `model` name); `None`: the base.
    pub lora: Option<LoraRequest>,
    /// The images of the prompt, in prompt order: each takes `len` prompt positions, whose ids
    /// may be any token (a placeholder); [`ValidRequest::new`] writes the image's cache keys
    /// there ([`crate::images`]). Empty for text.
    pub images: Vec<PromptImage>,
}

impl Request {
    /// One greedy sequence of at most `max_tokens` tokens.
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            prompt,
            n: 1,
            max_tokens: Some(max_tokens),
            sampling: SamplingParams::greedy(),
            stop: StopParams::default(),
            constraint: None,
            lora: None,
            images: Vec::new(),
        }
    }
}

/// A [`Request`] checked against the engine's [`ModelLimits`]: the only thing the engine
/// accepts ([`crate::EngineHandle::submit`]). Every range a request must respect is checked
/// here and nowhere else; the engine, the scheduler included, trusts the type.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    /// Its `max_tokens` resolved: what each sequence may generate.
    request: Request,
    /// What it was checked against: the engine refuses a request checked for another one.
    limits: ModelLimits,
    /// An embedding: the prompt is computed, pooled and returned, nothing is generated.
    embedding: bool,
}

impl ValidRequest {
    /// Checks every field of `request` against `limits`; the error names the parameter.
    pub fn new(mut request: Request, limits: &ModelLimits) -> Result<Self, InvalidRequest> {
        limits.check_prompt(&request.prompt)?;
        if !(1..=limits.max_n).contains(&request.n) {
            return Err(InvalidRequest::InvalidN {
                n: request.n,
                max: limits.max_n,
            });
        }
        request.sampling.validate(limits.vocab_size)?;
        request.stop.validate(limits.vocab_size)?;
        let max_tokens = limits.check_length(request.prompt.len(), request.max_tokens)?;
        if request.stop.min_tokens > max_tokens {
            return Err(InvalidRequest::Param {
                param: "min_tokens",
                reason: if request.max_tokens.is_some_and(|m| m > max_tokens) {
                    format!(
                        "{} is more than the {max_tokens} tokens the context leaves after the \
                         prompt",
                        request.stop.min_tokens
                    )
                } else {
                    format!(
                        "{} is more than max_tokens ({max_tokens})",
                        request.stop.min_tokens
                    )
                },
            });
        }
        request.max_tokens = Some(max_tokens);
        if let Some(lora) = &request.lora {
            limits.check_adapter(lora)?;
        }
        if !request.images.is_empty() {
            limits.check_images(&request.images, request.prompt.len())?;
            for image in &request.images {
                let span = &mut request.prompt[image.start..image.start + image.len];
                for (id, key) in span.iter_mut().zip(image_keys(image.hash, image.len)) {
                    *id = key;
                }
            }
        }
        Ok(Self {
            request,
            limits: *limits,
            embedding: false,
        })
    }

    /// An embedding of `input`: one sequence that computes the input and generates nothing;
    /// its finish carries the pooled vector. The whole input must fit one sequence
    /// ([`ModelLimits::capacity`]); nothing is left for generation, and nothing need be.
    pub fn embedding(input: Vec<u32>, limits: &ModelLimits) -> Result<Self, InvalidRequest> {
        limits.check_prompt(&input)?;
        let capacity = limits.capacity();
        if input.len() > capacity {
            return Err(InvalidRequest::InputTooLong {
                input_tokens: input.len(),
                capacity,
            });
        }
        Ok(Self {
            request: Request {
                prompt: input,
                n: 1,
                max_tokens: Some(0),
                sampling: SamplingParams::greedy(),
                stop: StopParams::default(),
                constraint: None,
                lora: None,
                images: Vec::new(),
            },
            limits: *limits,
            embedding: true,
        })
    }

    /// Whether this is an embedding ([`ValidRequest::embedding`]).
    pub fn is_embedding(&self) -> bool {
        self.embedding
    }

    pub fn request(&self) -> &Request {
        &self.request
    }

    /// Most tokens each sequence generates (resolved: never more than the context allows).
    pub fn max_tokens(&self) -> usize {
        // Always `Some` once validated (`new` and `embedding` set it).
        self.request.max_tokens.unwrap_or(0)
    }

    pub fn n(&self) -> usize {
        self.request.n
    }

    pub fn prompt_len(&self) -> usize {
        self.request.prompt.len()
    }

    pub fn limits(&self) -> &ModelLimits {
        &self.limits
    }

    /// Runs it with a LoRA adapter, which the engine must have room for
    /// ([`ModelLimits::max_loras`]).
    pub fn with_adapter(mut self, lora: LoraRequest) -> Result<Self, InvalidRequest> {
        self.limits.check_adapter(&lora)?;
        self.request.lora = Some(lora);
        Ok(self)
    }

    /// The LoRA adapter it runs with.
    pub fn adapter(&self) -> Option<&LoraRequest> {
        self.request.lora.as_ref()
    }

    /// The checked request and its adapter, for the engine thread.
    pub(crate) fn into_parts(mut self) -> (Request, Option<LoraRequest>) {
        let lora = self.request.lora.take();
        (self.request, lora)
    }
}

/// A request's LoRA adapter: its key (admission by adapter slot, the prefix cache's root, the
/// name events report) and its weights, checked against the model when they were loaded.
#[derive(Clone)]
pub struct LoraRequest {
    pub key: AdapterKey,
    pub adapter: Arc<LoraAdapter>,
}

impl PartialEq for LoraRequest {
    /// The key names one load of one adapter: equal keys, equal weights.
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl std::fmt::Debug for LoraRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraRequest")
            .field("key", &self.key)
            .field("rank", &self.adapter.rank())
            .finish()
    }
}

/// What becomes of a request whose `max_tokens` asks for more than the context leaves after
/// its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaxTokensPolicy {
    /// Lowered to what is left, as llama.cpp's server, Ollama and LM Studio do: clients that
    /// send a fixed large budget (Qwen Code's 32768, opencode's configured output limit) get
    /// an answer that ends with `length` if it reaches the context's end.
    #[default]
    Clamp,
    /// Refused with a 400 naming the numbers, as vLLM and OpenAI do.
    Strict,
}

impl MaxTokensPolicy {
    pub fn name(self) -> &'static str {
        match self {
            Self::Clamp => "clamp",
            Self::Strict => "strict",
        }
    }
}

impl std::str::FromStr for MaxTokensPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "clamp" => Ok(Self::Clamp),
            "strict" => Ok(Self::Strict),
            _ => Err(format!(
                "`{s}` is not a max_tokens policy; use clamp or strict"
            )),
        }
    }
}

impl std::fmt::Display for MaxTokensPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What bounds a request: the model's vocabulary and context, and the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    pub vocab_size: usize,
    /// Longest sequence (prompt + generated) the engine runs.
    pub max_model_len: usize,
    /// Tokens the whole KV cache holds.
    pub kv_cache_tokens: usize,
    /// Most sequences one request may ask for: [`MAX_N`], or the waiting queue's bound when
    /// that is smaller (a request larger than the whole queue could never be admitted).
    pub max_n: usize,
    /// LoRA adapters the model holds at once; 0: requests may not name one.
    pub max_loras: usize,
    /// A `max_tokens` past what the context leaves is lowered to it, or refused.
    pub max_tokens_policy: MaxTokensPolicy,
    /// What images the model takes; `None`: text only.
    pub images: Option<ImageLimits>,
}

impl ModelLimits {
    /// A request may name a LoRA adapter only where the engine has slots for adapters.
    pub fn check_adapter(&self, lora: &LoraRequest) -> Result<(), InvalidRequest> {
        if self.max_loras == 0 {
            return Err(InvalidRequest::Param {
                param: "model",
                reason: format!(
                    "`{}` is a LoRA adapter, and this engine has no adapter slots (max_loras 0)",
                    lora.key.name
                ),
            });
        }
        Ok(())
    }

    /// A prompt's images fit the model: it takes images, each has its tokens and pixels, and
    /// they lie in the prompt in order without overlapping. The server builds them so; this is
    /// the engine's own check.
    pub fn check_images(
        &self,
        images: &[PromptImage],
        prompt_len: usize,
    ) -> Result<(), InvalidRequest> {
        let bad = |reason: String| {
            Err(InvalidRequest::Param {
                param: "images",
                reason,
            })
        };
        let Some(limits) = self.images else {
            return bad("this model takes no images".into());
        };
        let mut next = 0;
        for (i, image) in images.iter().enumerate() {
            if image.len != limits.tokens_per_image || image.pixels.len() != limits.pixels_per_image
            {
                return bad(format!(
                    "image {i} has {} tokens and {} pixel values; this model's take {} and {}",
                    image.len,
                    image.pixels.len(),
                    limits.tokens_per_image,
                    limits.pixels_per_image
                ));
            }
            if image.start < next || image.start + image.len > prompt_len {
                return bad(format!(
                    "image {i} at tokens {}..{} overlaps the one before or leaves the prompt of {prompt_len}",
                    image.start,
                    image.start + image.len
                ));
            }
            next = image.start + image.len;
        }
        Ok(())
    }

    /// The most tokens one sequence can hold: the context, or the whole KV cache when that is
    /// smaller (admission could never place a longer one).
    pub fn capacity(&self) -> usize {
        self.max_model_len.min(self.kv_cache_tokens)
    }

    /// A prompt is not empty and every token is in the vocabulary. Public so that the server
    /// can check token-id prompts before it decodes them for `echo`.
    pub fn check_prompt(&self, prompt: &[u32]) -> Result<(), InvalidRequest> {
        if prompt.is_empty() {
            return Err(InvalidRequest::EmptyPrompt);
        }
        match prompt.iter().find(|&&t| t as usize >= self.vocab_size) {
            Some(&token) => Err(InvalidRequest::TokenOutOfVocab {
                param: "prompt",
                token,
                vocab_size: self.vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// The prompt fits [`ModelLimits::capacity`] with room for a token; returns what each
    /// sequence may generate: `max_tokens`, or the rest of the context when it is `None` or
    /// (under [`MaxTokensPolicy::Clamp`]) asks for more than that.
    fn check_length(
        &self,
        prompt_tokens: usize,
        max_tokens: Option<usize>,
    ) -> Result<usize, InvalidRequest> {
        let capacity = self.capacity();
        if prompt_tokens >= capacity {
            return Err(InvalidRequest::PromptTooLong {
                prompt_tokens,
                capacity,
            });
        }
        match max_tokens {
            None => Ok(capacity - prompt_tokens),
            Some(0) => Err(InvalidRequest::ZeroMaxTokens),
            Some(m) if prompt_tokens.saturating_add(m) > capacity => match self.max_tokens_policy {
                MaxTokensPolicy::Clamp => Ok(capacity - prompt_tokens),
                MaxTokensPolicy::Strict => Err(InvalidRequest::TooManyTokens {
                    prompt_tokens,
                    max_tokens: m,
                    capacity,
                }),
            },
            Some(m) => Ok(m),
        }
    }
}

/// A request the engine cannot run as asked (HTTP 400). Each variant names its parameter
/// (the server may call it differently: `messages` for the prompt, `max_completion_tokens`,
/// `top_logprobs`) and carries what a message needs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidRequest {
    #[error("The prompt is empty.")]
    EmptyPrompt,
    #[error("n = {n} is out of range: it must be between 1 and {max}.")]
    InvalidN { n: usize, max: usize },
    #[error("max_tokens must be at least 1.")]
    ZeroMaxTokens,
    #[error("{param}: token id {token} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfVocab {
        param: &'static str,
        token: u32,
        vocab_size: usize,
    },
    /// `capacity`: [`ModelLimits::capacity`].
    #[error(
        "the prompt has {prompt_tokens} tokens, which leaves no room to generate: a sequence \
         holds at most {capacity} tokens"
    )]
    PromptTooLong {
        prompt_tokens: usize,
        capacity: usize,
    },
    /// An embedding's input does not fit one sequence.
    #[error("the input has {input_tokens} tokens; a sequence holds at most {capacity} tokens")]
    InputTooLong {
        input_tokens: usize,
        capacity: usize,
    },
    #[error(
        "prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) is more than the \
         {capacity} tokens a sequence holds"
    )]
    TooManyTokens {
        prompt_tokens: usize,
        max_tokens: usize,
        capacity: usize,
    },
    #[error("{value} is not a valid value for `{param}`: it must be in {range}.")]
    OutOfRange {
        param: &'static str,
        value: f32,
        range: &'static str,
    },
    #[error("logprobs = {requested} is more than the maximum of {max}.")]
    TooManyLogprobs { requested: usize, max: usize },
    #[error("invalid {param}: {reason}")]
    Param { param: &'static str, reason: String },
}

impl InvalidRequest {
    /// The request field at fault, as the engine calls it.
    pub fn param(&self) -> &'static str {
        match self {
            Self::EmptyPrompt
            | Self::PromptTooLong { .. }
            | Self::InputTooLong { .. }
            | Self::TooManyTokens { .. } => "prompt",
            Self::InvalidN { .. } => "n",
            Self::ZeroMaxTokens => "max_tokens",
            Self::TooManyLogprobs { .. } => "logprobs",
            Self::TokenOutOfVocab { param, .. }
            | Self::OutOfRange { param, .. }
            | Self::Param { param, .. } => param,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ModelLimits = ModelLimits {
        vocab_size: 100,
        max_model_len: 64,
        kv_cache_tokens: 48,
        max_n: MAX_N,
        max_loras: 0,
        max_tokens_policy: MaxTokensPolicy::Strict,
        images: None,
    };

    fn validate(r: &Request) -> Result<usize, InvalidRequest> {
        ValidRequest::new(r.clone(), &LIMITS).map(|v| v.max_tokens())
    }

    /// At the context's edge (48 tokens here: the cache is smaller than the context): a budget
    /// that fits is kept, one token over is lowered to what is left (or refused, strictly), and
    /// a prompt that alone fills the context is refused either way.
    #[test]
    fn a_budget_past_the_context_is_clamped_or_refused_by_the_policy() {
        let clamp = ModelLimits {
            max_tokens_policy: MaxTokensPolicy::Clamp,
            ..LIMITS
        };
        let budget = |prompt: usize, max_tokens: usize, limits: &ModelLimits| {
            ValidRequest::new(Request::new(vec![1; prompt], max_tokens), limits)
                .map(|v| v.max_tokens())
        };
        assert_eq!(budget(10, 38, &clamp), Ok(38));
        assert_eq!(budget(10, 38, &LIMITS), Ok(38));
        for over in [39, 32_768, usize::MAX] {
            assert_eq!(budget(10, over, &clamp), Ok(38));
            assert_eq!(
                budget(10, over, &LIMITS),
                Err(InvalidRequest::TooManyTokens {
                    prompt_tokens: 10,
                    max_tokens: over,
                    capacity: 48
                })
            );
        }
        assert_eq!(budget(47, 1000, &clamp), Ok(1));
        for limits in [&clamp, &LIMITS] {
            assert_eq!(
                budget(48, 1, limits),
                Err(InvalidRequest::PromptTooLong {
                    prompt_tokens: 48,
                    capacity: 48
                })
            );
        }
        // `min_tokens` is checked against the clamped budget, and says so.
        let mut r = Request::new(vec![1; 40], 100);
        r.stop.min_tokens = 9;
        let Err(InvalidRequest::Param { param, reason }) = ValidRequest::new(r, &clamp) else {
            panic!("min_tokens past the clamped budget must be refused");
        };
        assert_eq!(param, "min_tokens");
        assert!(
            reason.contains("the 8 tokens the context leaves"),
            "{reason}"
        );
        assert_eq!("clamp".parse(), Ok(MaxTokensPolicy::Clamp));
        assert_eq!(MaxTokensPolicy::Strict.to_string(), "strict");
        assert!("lenient".parse::<MaxTokensPolicy>().is_err());
    }

    #[test]
    fn max_tokens_defaults_to_what_is_left_of_the_context_or_cache() {
        let mut r = Request::new(vec![1; 10], 1);
        r.max_tokens = None;
        assert_eq!(validate(&r), Ok(38));
        r.max_tokens = Some(38);
        assert_eq!(validate(&r), Ok(38));
        for too_many in [39, usize::MAX] {
            r.max_tokens = Some(too_many);
            assert!(matches!(
                validate(&r),
                Err(InvalidRequest::TooManyTokens { .. })
            ));
        }
        r.prompt = vec![1; 48];
        assert!(matches!(
            validate(&r),
            Err(InvalidRequest::PromptTooLong { .. })
        ));
    }

    #[test]
    fn an_embedding_may_fill_the_whole_sequence_and_no_more() {
        let v = ValidRequest::embedding(vec![1; 48], &LIMITS).unwrap();
        assert!(v.is_embedding());
        assert_eq!((v.n(), v.max_tokens(), v.prompt_len()), (1, 0, 48));
        assert!(matches!(
            ValidRequest::embedding(vec![1; 49], &LIMITS),
            Err(InvalidRequest::InputTooLong {
                input_tokens: 49,
                capacity: 48
            })
        ));
        assert_eq!(
            ValidRequest::embedding(vec![], &LIMITS),
            Err(InvalidRequest::EmptyPrompt)
        );
        assert!(matches!(
            ValidRequest::embedding(vec![100], &LIMITS),
            Err(InvalidRequest::TokenOutOfVocab { .. })
        ));
    }

    #[test]
    fn malformed_requests_name_the_parameter() {
        let ok = Request::new(vec![1, 2, 3], 4);
        assert_eq!(validate(&ok), Ok(4));
        let cases: Vec<(Request, &str)> = vec![
            (Request::new(vec![], 4), "prompt is empty"),
            (Request::new(vec![1, 100], 4), "prompt: token id 100"),
            (Request::new(vec![1], 0), "max_tokens"),
            (Request { n: 0, ..ok.clone() }, "n = 0"),
            (
                Request {
                    sampling: SamplingParams {
                        top_p: 0.0,
                        ..SamplingParams::default()
                    },
                    ..ok.clone()
                },
                "top_p",
            ),
            (
                Request {
                    sampling: SamplingParams {
                        temperature: f32::NAN,
                        ..SamplingParams::default()
                    },
                    ..ok.clone()
                },
                "temperature",
            ),
            (
                Request {
                    sampling: SamplingParams {
                        top_n_sigma: -0.5,
                        ..SamplingParams::default()
                    },
                    ..ok.clone()
                },
                "top_n_sigma",
            ),
            (
                Request {
                    sampling: SamplingParams {
                        logit_bias: vec![(5, 101.0)],
                        ..SamplingParams::default()
                    },
                    ..ok.clone()
                },
                "logit_bias",
            ),
            (
                Request {
                    sampling: SamplingParams {
                        logprobs: Some(21),
                        ..SamplingParams::default()
                    },
                    ..ok.clone()
                },
                "logprobs",
            ),
            (
                Request {
                    stop: StopParams {
                        stop: vec![String::new()],
                        ..StopParams::default()
                    },
                    ..ok.clone()
                },
                "stop string is empty",
            ),
            (
                Request {
                    stop: StopParams {
                        stop_token_ids: vec![1000],
                        ..StopParams::default()
                    },
                    ..ok.clone()
                },
                "stop_token_ids",
            ),
            (
                Request {
                    stop: StopParams {
                        min_tokens: 5,
                        ..StopParams::default()
                    },
                    ..ok.clone()
                },
                "min_tokens",
            ),
        ];
        for (request, needle) in cases {
            let err = validate(&request).unwrap_err();
            assert!(
                needle.contains(err.param()),
                "{err:?} should name the parameter of {needle:?}"
            );
            let err = err.to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
        // The server's (OpenAI's) ranges, here once.
        let hot = Request {
            sampling: SamplingParams {
                temperature: 2.5,
                ..SamplingParams::default()
            },
            ..ok.clone()
        };
        assert_eq!(
            validate(&hot).unwrap_err().to_string(),
            "2.5 is not a valid value for `temperature`: it must be in [0, 2]."
        );
        let small_queue = ModelLimits { max_n: 3, ..LIMITS };
        assert_eq!(
            ValidRequest::new(Request { n: 4, ..ok }, &small_queue),
            Err(InvalidRequest::InvalidN { n: 4, max: 3 })
        );
    }
}
