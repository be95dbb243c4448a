//! Anthropic Messages API bodies: what clients send and what they get back. Plain data; the
//! mapping onto the chat pipeline lives in [`super::translate`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::openai::structured::ExtraFields;

#[derive(Debug, Clone, Deserialize)]
pub struct MessagesRequest {
    pub model: String,
    /// Required by Anthropic's API.
    pub max_tokens: usize,
    pub messages: Vec<MessageIn>,
    pub system: Option<TextContent>,
    pub stop_sequences: Option<Vec<String>>,
    /// Anthropic's range is [0, 1].
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub tools: Option<Vec<ToolIn>>,
    pub tool_choice: Option<ToolChoiceIn>,
    pub stream: Option<bool>,
    /// Structured output (`format`) and `effort`, the template's thinking switch where it has
    /// one ([`crate::chat::thinking`]).
    pub output_config: Option<OutputConfig>,
    /// Whether the model may think: the template's switch where it has one, else nothing
    /// (a model that does not think honours it by not thinking).
    pub thinking: Option<ThinkingIn>,
    /// Edits of the conversation before it is rendered ([`super::translate::context_edits`]).
    pub context_management: Option<ContextManagementIn>,
    /// Every other field, by [`crate::edge::field_policy::MESSAGES`]: accepted with its local
    /// meaning, or refused by name.
    #[serde(flatten)]
    pub extra: ExtraFields,
}

/// `POST /v1/messages/count_tokens`: a Messages request without `max_tokens` (and without the
/// fields that only steer generation).
#[derive(Debug, Clone, Deserialize)]
pub struct CountTokensRequest {
    pub model: String,
    pub messages: Vec<MessageIn>,
    pub system: Option<TextContent>,
    pub tools: Option<Vec<ToolIn>>,
    pub tool_choice: Option<ToolChoiceIn>,
    pub thinking: Option<ThinkingIn>,
    pub output_config: Option<OutputConfig>,
    pub context_management: Option<ContextManagementIn>,
    #[serde(flatten)]
    pub extra: ExtraFields,
}

#[derive(Debug, Clone, Serialize)]
pub struct CountTokensResponse {
    pub input_tokens: usize,
}

#[derive(Debug, Clone, Deserialize)]
pub struct OutputConfig {
    pub format: Option<OutputFormat>,
    pub effort: Option<crate::chat::thinking::Effort>,
}

/// `thinking`: `{"type": "enabled", "budget_tokens"}`, `{"type": "adaptive"}` (the model
/// decides) or `{"type": "disabled"}`; `display` says whether thinking text comes back.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ThinkingIn {
    Enabled {
        budget_tokens: usize,
        display: Option<ThinkingDisplay>,
    },
    Adaptive {
        display: Option<ThinkingDisplay>,
    },
    Disabled,
}

/// Whether thinking text is returned: `summarized` (Anthropic's default; sluice returns the
/// thinking itself, it writes no summaries) or `omitted` (thinking blocks come back empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThinkingDisplay {
    Summarized,
    Omitted,
}

impl ThinkingIn {
    /// Whether thinking text is left out of the answer.
    pub fn omits_text(&self) -> bool {
        matches!(
            self,
            Self::Enabled {
                display: Some(ThinkingDisplay::Omitted),
                ..
            } | Self::Adaptive {
                display: Some(ThinkingDisplay::Omitted)
            }
        )
    }
}

/// `context_management`: edits applied to the conversation before it reaches the model.
#[derive(Debug, Clone, Deserialize)]
pub struct ContextManagementIn {
    /// Read one by one in [`super::translate::context_edits`], so an error names
    /// `context_management.edits[i]`.
    #[serde(default)]
    pub edits: Vec<Value>,
}

/// `output_config.format`: the answer is JSON valid against `schema`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputFormat {
    JsonSchema {
        schema: serde_json::Map<String, Value>,
    },
}

/// `system`: a string, or a list of text blocks.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum TextContent {
    Text(String),
    Blocks(Vec<TextBlock>),
}

impl TextContent {
    /// The text, blocks joined with newlines.
    pub fn into_text(self) -> String {
        match self {
            Self::Text(text) => text,
            Self::Blocks(blocks) => blocks
                .into_iter()
                .map(|b| b.text)
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct TextBlock {
    #[serde(rename = "type")]
    pub kind: TextKind,
    pub text: String,
}

/// The only block type a system prompt may hold.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TextKind {
    Text,
}

#[derive(Debug, Clone, Deserialize)]
pub struct MessageIn {
    pub role: String,
    pub content: MessageContentIn,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContentIn {
    Text(String),
    Blocks(Vec<ContentBlockIn>),
}

/// A block of a message in the conversation. Images are taken in user turns (refused, naming
/// them, for a model that reads text only); documents are refused; earlier thinking is
/// dropped, as the chat templates of thinking models drop it.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlockIn {
    Text {
        text: String,
    },
    Image {
        source: ImageSourceIn,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        content: Option<ToolResultContent>,
        is_error: Option<bool>,
    },
    Thinking {
        thinking: String,
    },
    RedactedThinking {
        data: String,
    },
}

/// An image block's `source`: base64 data with its media type, or a URL to fetch.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSourceIn {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

/// A tool result's `content`: a string, or text and image blocks.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ToolResultContent {
    Text(String),
    Blocks(Vec<ToolResultBlock>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolResultBlock {
    Text { text: String },
    Image { source: ImageSourceIn },
}

/// A client tool. Anthropic's server tools (`web_search_...`, `bash_...`) carry a `type` other
/// than `custom` and are refused by name.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolIn {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
    /// A deferred tool is left out of the prompt, as Anthropic leaves it out of the context
    /// until a tool search finds it; the client sends it again, not deferred, to offer it.
    pub defer_loading: Option<bool>,
    /// Anthropic's strict tool use: calls are guaranteed to validate against `input_schema`
    /// (chat completions' `strict`, enforced by the same grammar).
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoiceIn {
    Auto {
        disable_parallel_tool_use: Option<bool>,
    },
    Any {
        disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        disable_parallel_tool_use: Option<bool>,
    },
    None,
}

/// A block of the model's answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlockOut {
    /// A thinking model's reasoning. sluice signs nothing: the signature is empty.
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct MessagesUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct MessagesResponse {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<ContentBlockOut>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`; null in `message_start`.
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: MessagesUsage,
}

/// A delta of a streamed content block.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    TextDelta { text: String },
    ThinkingDelta { thinking: String },
    InputJsonDelta { partial_json: String },
}

/// The events of a streamed message, in their order: `message_start`, `ping`, per block
/// `content_block_start`, `content_block_delta`..., `content_block_stop`, then
/// `message_delta` and `message_stop`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    MessageStart {
        message: MessagesResponse,
    },
    Ping,
    ContentBlockStart {
        index: usize,
        content_block: ContentBlockOut,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDeltaBody,
        usage: OutputUsage,
    },
    MessageStop,
}

impl StreamEvent {
    /// The SSE `event:` name, which Anthropic's clients dispatch on.
    pub fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::Ping => "ping",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct MessageDeltaBody {
    pub stop_reason: &'static str,
    pub stop_sequence: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct OutputUsage {
    pub output_tokens: usize,
}
