//! sluice-server: the OpenAI-compatible HTTP server over the sluice engine, and the pieces of
//! the `sluice` command. Handlers parse, tokenize, validate once into the engine's
//! `ValidRequest`, submit, and translate the engine's events into OpenAI JSON or server-sent
//! events; they never touch tensors.

pub mod anthropic;
pub mod chat;
pub mod commands;
pub mod config;
pub mod edge;
pub mod engine;
pub mod media;
pub mod observe;
pub mod openai;
pub mod responses;
pub mod routes;

pub use config::{Config, ServeArgs};
pub use edge::error::ApiError;
pub use engine::state::{AppState, ServedModel};
pub use routes::{router, HttpSettings};
