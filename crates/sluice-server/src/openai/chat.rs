//! `/v1/chat/completions` request and response bodies.

use std::collections::HashMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::common::{Seed, StopList, StreamOptions, Usage};
pub use super::content::{ContentPart, MessageContent};
use super::structured::{
    ConstraintFields, ExtraFields, ResponseFormat, StructuredOutputs, ToolCallDelta, ToolCallIn,
    ToolCallOut, ToolChoice,
};

with_sampling_fields!(generation_request! {
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    #[serde(deserialize_with = "messages_naming_images")]
    pub messages: Vec<ChatMessageIn>,
    /// Defaults to what is left of the context.
    pub max_tokens: Option<usize>,
    /// OpenAI's newer name for `max_tokens`; wins when both are given.
    pub max_completion_tokens: Option<usize>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<usize>,
    pub user: Option<String>,
    // Structured outputs: OpenAI's, then vLLM's.
    pub response_format: Option<ResponseFormat>,
    pub structured_outputs: Option<StructuredOutputs>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    // Function calling.
    /// As sent: the template prints them verbatim; [`crate::chat::tools::plan`] checks them.
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    /// Extra variables for the chat template (`enable_thinking`, ...).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Every other field: refused when it is an OpenAI feature sluice does not serve, else
    /// named in a debug log line ([`crate::edge::field_policy::check_extra_fields`]).
    #[serde(flatten)]
    pub extra: ExtraFields,
}
});

impl ChatRequest {
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

/// `messages`, each image named by its whole path (`messages[1].content[0].image_url`), which
/// its errors give.
pub fn messages_naming_images<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<ChatMessageIn>, D::Error> {
    let mut messages = Vec::<ChatMessageIn>::deserialize(d)?;
    name_images(&mut messages);
    Ok(messages)
}

/// [`messages_naming_images`] for an optional `messages` (`/tokenize`'s).
pub fn some_messages_naming_images<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<ChatMessageIn>>, D::Error> {
    let mut messages = Option::<Vec<ChatMessageIn>>::deserialize(d)?;
    if let Some(messages) = &mut messages {
        name_images(messages);
    }
    Ok(messages)
}

fn name_images(messages: &mut [ChatMessageIn]) {
    for (i, m) in messages.iter_mut().enumerate() {
        m.content.name_images(&format!("messages[{i}]"));
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    /// Absent or null only makes sense for an assistant turn (which then contributes an empty
    /// text).
    #[serde(default)]
    pub content: MessageContent,
    pub name: Option<String>,
    /// An assistant turn's calls, sent back in the history.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` message answers this call.
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning, sent back in the history (vLLM's field; `reasoning` is
    /// its newer name): shown to templates that render it.
    #[serde(default, alias = "reasoning")]
    pub reasoning_content: Option<String>,
}

/// One entry of a chat choice's `logprobs.content`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatMessageOut {
    pub role: &'static str,
    /// Null when the message is only tool calls, as OpenAI's.
    pub content: Option<String>,
    /// What a thinking model thought before answering (vLLM's field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// What a stream chunk adds to a choice's message.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    /// Only with `stream_options.include_usage`: null on every chunk but the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}
