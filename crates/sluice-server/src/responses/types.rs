//! Responses API bodies: what clients send and what they get back, the stream's events
//! included. Plain data; the mapping onto the chat pipeline lives in [`super::translate`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::openai::structured::ExtraFields;

#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    /// A string, or a list of items (messages, function calls and their outputs). Only
    /// optional with `previous_response_id`.
    pub input: Option<ResponseInput>,
    /// A system message put first; not carried over to a response that continues this one.
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Function tools (`{"type": "function", "name", "description", "parameters",
    /// "strict"}`), checked in [`super::translate::tools`].
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<TextConfig>,
    pub stream: Option<bool>,
    /// Keep the response for `previous_response_id` and `GET /v1/responses/{id}`; default
    /// true, as OpenAI's.
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    /// Echoed back in the response.
    pub metadata: Option<Map<String, Value>>,
    pub user: Option<String>,
    /// `disabled` (the default) only: sluice never drops input to fit the context.
    pub truncation: Option<String>,
    /// `effort`: the template's thinking switch where it has one ([`crate::chat::thinking`]);
    /// `summary`: accepted, no summary is written (a thinking model's reasoning comes back
    /// whole, as the item's content).
    pub reasoning: Option<ReasoningConfig>,
    /// Extra output: `reasoning.encrypted_content` only ([`super::translate::check_include`]).
    pub include: Option<Vec<String>>,
    /// Every other field, by [`crate::edge::field_policy::RESPONSES`]: accepted with its local
    /// meaning, or refused by name.
    #[serde(flatten)]
    pub extra: ExtraFields,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ReasoningConfig {
    pub effort: Option<crate::chat::thinking::Effort>,
    pub summary: Option<ReasoningSummary>,
    /// The deprecated name of `summary`.
    pub generate_summary: Option<ReasoningSummary>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningSummary {
    Auto,
    Concise,
    Detailed,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ResponseInput {
    Text(String),
    /// Items are read field by field in [`super::translate::input_messages`], so an error
    /// names `input[i].field`.
    Items(Vec<Value>),
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct TextConfig {
    pub format: Option<TextFormat>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    Text,
    JsonObject,
    JsonSchema {
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        schema: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
    },
}

/// A part of an output message.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// `annotations`: citations a server-side tool would add; sluice has none.
    OutputText {
        text: String,
        annotations: Vec<Value>,
    },
    ReasoningText {
        text: String,
    },
}

/// One item of a response's `output`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// A thinking model's reasoning. `encrypted_content`, with `include:
    /// ["reasoning.encrypted_content"]`: an opaque token of it (its text, base64), which a
    /// later request may send back (earlier reasoning is never shown to the model again).
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<ContentPart>,
        #[serde(skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
        status: &'static str,
    },
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<ContentPart>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        /// The namespace of a tool that came in a `namespace` tool (Codex's groups), `name`
        /// being its name inside it.
        #[serde(skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
        name: String,
        /// JSON text of the arguments object.
        arguments: String,
        status: &'static str,
    },
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct InputTokensDetails {
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IncompleteDetails {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResponseError {
    pub code: &'static str,
    pub message: String,
}

/// The request's settings a response echoes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub temperature: f64,
    pub top_p: f64,
    pub parallel_tool_calls: bool,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub text: Value,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub metadata: Map<String, Value>,
    pub user: Option<String>,
    pub truncation: &'static str,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress` while streaming, then `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub usage: Option<ResponseUsage>,
    #[serde(flatten)]
    pub echo: Echo,
}

/// The events of a streamed response. Each goes out with its `sequence_number` and as the
/// SSE `event:` name its `type`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent {
    #[serde(rename = "response.created")]
    Created { response: ResponseObject },
    #[serde(rename = "response.in_progress")]
    InProgress { response: ResponseObject },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: ContentPart,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: ContentPart,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.completed")]
    Completed { response: ResponseObject },
    #[serde(rename = "response.failed")]
    Failed { response: ResponseObject },
}
