//! The `sluice` command's subcommands: `serve` (its log output and its shutdown drain beside
//! it; its configuration is [`crate::config`]), `chat` (a conversation in the terminal),
//! `generate`, `synth`, and `pull` / `models` over the Hugging Face cache ([`hub_cache`]).

pub mod chat;
pub mod generate;
pub mod hub_cache;
pub mod logging;
pub mod serve;
pub mod shutdown;
pub mod synth;
