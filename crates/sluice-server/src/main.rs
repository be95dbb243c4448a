//! The `sluice` command: `sluice serve` runs the OpenAI-compatible server; `sluice generate`
//! runs one prompt through the model.

mod allocator;

use clap::{Parser, Subcommand};
use sluice_server::commands::{generate, synth};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "OpenAI-compatible LLM inference server with continuous batching"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible HTTP API (flags override SLUICE_* variables, which override
    /// config/sluice.toml).
    Serve(Box<sluice_server::ServeArgs>),
    /// Generate a continuation of one prompt and print it as it is produced.
    Generate(generate::GenerateArgs),
    /// Write a random-weight GGUF model of a real model's shape, in any format, for benchmarks
    /// on machines that can download nothing.
    Synth(synth::SynthArgs),
}

fn main() -> anyhow::Result<()> {
    allocator::keep_working_set();
    match Cli::parse().command {
        // The server sets up its own logging from its configuration.
        Command::Serve(args) => sluice_server::commands::serve::run(*args),
        Command::Generate(args) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                        .unwrap_or_else(|_| "warn".into()),
                )
                .with_writer(std::io::stderr)
                .init();
            generate::run(args)
        }
        Command::Synth(args) => synth::run(args),
    }
}
