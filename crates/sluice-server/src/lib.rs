//! sluice-server: the OpenAI-compatible HTTP server over the sluice engine, and the pieces of
//! the `sluice` command. Handlers parse, tokenize, validate once into the engine's
//! `ValidRequest`, submit, and translate the engine's events into OpenAI JSON or server-sent
//! events; they never touch tensors.

pub mod anthropic;
pub mod auth;
pub mod blocking;
pub mod chat_output;
pub mod chat_request;
pub mod config;
pub mod engine_request;
pub mod error;
pub mod field_policy;
pub mod http;
pub mod ids;
pub mod json;
pub mod kv_events;
pub mod load;
pub mod logging;
pub mod logprobs;
pub mod metrics;
pub mod openai;
pub mod output_blocks;
pub mod request_fields;
pub mod responses;
pub mod routes;
pub mod serve;
pub mod shutdown;
pub mod sse;
pub mod state;
pub mod structured;
pub mod thinking;
pub mod tool_calls;
pub mod vllm_metrics;

pub use config::{Config, ServeArgs};
pub use error::ApiError;
pub use routes::{router, HttpSettings};
pub use state::{AppState, ServedModel};
