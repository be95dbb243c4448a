//! The `sluice` command's subcommands: `serve` (its log output and its shutdown drain beside
//! it; its configuration is [`crate::config`]), `generate` and `synth`.

pub mod generate;
pub mod logging;
pub mod serve;
pub mod shutdown;
pub mod synth;
