//! `/v1/completions` request and response bodies (OpenAI's legacy completions API, with vLLM's
//! sampling extensions).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use serde_json::Value;

use super::common::{Prompt, Seed, StopList, StreamOptions, Usage};
use super::structured::{ConstraintFields, ExtraFields, ResponseFormat, StructuredOutputs};

with_sampling_fields!(generation_request! {
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    /// Defaults to 16, as OpenAI's.
    pub max_tokens: Option<usize>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Log-probabilities of each token and of this many alternatives.
    pub logprobs: Option<usize>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<usize>,
    pub user: Option<String>,
    // Structured outputs: OpenAI's, then vLLM's.
    pub response_format: Option<ResponseFormat>,
    pub structured_outputs: Option<StructuredOutputs>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    /// Every other field: refused when it is an OpenAI feature sluice does not serve, else
    /// named in a debug log line ([`crate::edge::field_policy::check_extra_fields`]).
    #[serde(flatten)]
    pub extra: ExtraFields,
}
});

impl CompletionRequest {
    /// The fields that constrain the output (moved out: a schema can be large).
    pub fn constraint_fields(&mut self) -> ConstraintFields {
        ConstraintFields {
            response_format: self.response_format.take(),
            structured_outputs: self.structured_outputs.take(),
            guided_json: self.guided_json.take(),
            guided_regex: self.guided_regex.take(),
            guided_choice: self.guided_choice.take(),
            guided_grammar: self.guided_grammar.take(),
        }
    }
}

/// OpenAI's completions `logprobs` object: parallel lists, one entry per token.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<HashMap<String, f32>>,
    /// Character offset of each token in the choice's text (after the echoed prompt).
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    pub fn append(&mut self, other: CompletionLogprobs) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        self.text_offset.extend(other.text_offset);
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// vLLM's extension: the stop string or token id that ended the choice (null for EOS or
    /// any other reason).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    /// Always present in a full response; in a stream, only with `include_usage`, null on
    /// every chunk but the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}
