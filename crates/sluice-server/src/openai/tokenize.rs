//! `/tokenize` and `/detokenize` bodies, as vLLM's.

use serde::{Deserialize, Serialize};

use super::chat::ChatMessageIn;

/// Either a `prompt` or chat `messages`.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    #[serde(default, deserialize_with = "super::chat::some_messages_naming_images")]
    pub messages: Option<Vec<ChatMessageIn>>,
    /// With `prompt`: add BOS when the model wants it. Default true.
    pub add_special_tokens: Option<bool>,
    /// With `messages`: end with the opening of an assistant turn. Default true.
    pub add_generation_prompt: Option<bool>,
    /// With `messages`: the tools the template is shown, as in a chat request.
    pub tools: Option<Vec<serde_json::Value>>,
    /// With `messages`: extra template variables, as in a chat request.
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    pub tokens: Vec<u32>,
    pub count: usize,
    pub max_model_len: usize,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}
