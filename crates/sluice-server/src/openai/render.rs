//! What `POST /v1/completions/render` and `POST /v1/chat/completions/render` answer: the
//! request the engine would run, not run, in the shape of vLLM's answer (its `GenerateRequest`),
//! with the prompt's text added. The completions route answers a list, one per prompt; the chat
//! route one object.

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct RenderedRequest {
    /// `cmpl-…` or `chatcmpl-…`, as the generation would be named.
    pub request_id: String,
    /// The prompt exactly as the engine would be given it.
    pub token_ids: Vec<u32>,
    /// The text those ids were tokenized from: the chat template's output (tools, the assistant
    /// turn's opening), or a completion's prompt as given (token ids given: their decoded text).
    /// vLLM's answer has no such field.
    pub prompt: String,
    /// Multimodal features in vLLM's answer: always null, as sluice's prompts are text.
    pub features: Option<()>,
    pub sampling_params: RenderedSampling,
    /// The served model's name.
    pub model: String,
    pub stream: bool,
    /// With `stream`, whether a usage chunk ends the stream.
    pub stream_options: Option<RenderedStreamOptions>,
}

/// The sampling and stopping parameters the engine would run each sequence with, every default
/// filled in, under vLLM's `SamplingParams` names.
#[derive(Debug, Clone, Serialize)]
pub struct RenderedSampling {
    pub n: usize,
    /// The request's, or its default: 16 for completions, the rest of the context for chat.
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    /// 0: no limit.
    pub top_k: usize,
    pub min_p: f32,
    pub top_n_sigma: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
    pub seed: Option<u64>,
    /// Alternatives reported per token; null: no logprobs.
    pub logprobs: Option<usize>,
    /// Token id (as a string, JSON's keys) to bias; null when none.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub min_tokens: usize,
    pub skip_special_tokens: bool,
    pub include_stop_str_in_output: bool,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct RenderedStreamOptions {
    pub include_usage: bool,
}
