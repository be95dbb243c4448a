//! `/v1/embeddings` request and response bodies.

use serde::{Deserialize, Serialize};

use super::common::Prompt;
use super::structured::ExtraFields;

#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    /// A string, a list of strings, a list of token ids, or a list of such lists: one vector
    /// per string or id list.
    pub input: Prompt,
    /// `float` (the default) or `base64`: the vector's little-endian f32 bytes, as OpenAI's.
    pub encoding_format: Option<EncodingFormat>,
    /// Keep this many leading dimensions, then renormalise to length 1.
    pub dimensions: Option<usize>,
    pub user: Option<String>,
    /// Every other field: named in a debug log line, or refused
    /// ([`crate::edge::field_policy::check_extra_fields`]).
    #[serde(flatten)]
    pub extra: ExtraFields,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

/// One vector, as floats or as base64 text.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Embedding {
    pub object: &'static str,
    pub index: usize,
    pub embedding: EmbeddingVector,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EmbeddingResponse {
    pub object: &'static str,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
}
