//! The `sluice` command's subcommands: `serve` (with its layered configuration), `generate`
//! and `synth`.

pub mod config;
pub mod generate;
pub mod serve;
pub mod synth;
