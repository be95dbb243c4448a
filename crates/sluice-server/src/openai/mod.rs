//! OpenAI API bodies: what clients send and what they get back. Plain data; the mapping onto
//! engine requests lives in [`crate::request_fields`], the validation in the engine.

pub mod chat;
pub mod common;
pub mod completions;
pub mod embeddings;
pub mod render;
pub mod structured;
pub mod tokenize;

use std::collections::HashMap;

pub use common::{Prompt, Seed, StopList, StreamOptions, Usage};

/// The sampling and stopping fields the two generation endpoints share. The request types list
/// them again rather than `#[serde(flatten)]` this struct: flattening loses the field path of a
/// type error (`"n": -1` would no longer answer with `param: "n"`), which clients rely on.
#[derive(Debug, Clone, Default)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub n: Option<usize>,
    pub stop: Option<StopList>,
    pub seed: Option<Seed>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<usize>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub skip_special_tokens: Option<bool>,
    pub include_stop_str_in_output: Option<bool>,
}
