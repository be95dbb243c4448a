//! The `sluice` command: `sluice serve` runs the OpenAI-compatible server; `sluice chat` talks
//! to one (or to a model served in-process) in the terminal; `sluice generate` runs one prompt
//! through the model.

mod allocator;

use clap::{Parser, Subcommand};
use sluice_server::commands::{chat, generate, hub_cache, synth};

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
    /// Chat in the terminal with a running server (--url) or a model served in-process
    /// (--model and serve's flags).
    Chat(chat::ChatArgs),
    /// Generate a continuation of one prompt and print it as it is produced.
    Generate(generate::GenerateArgs),
    /// Write a random-weight GGUF model of a real model's shape, in any format, for benchmarks
    /// on machines that can download nothing.
    Synth(synth::SynthArgs),
    /// Download a model from the Hugging Face hub into its cache (HF_HUB_CACHE, HF_HOME) and
    /// print the path `--model` loads; `serve --model ORG/NAME` does the same on its own.
    Pull(hub_cache::PullArgs),
    /// List the models the Hugging Face cache holds, with their sizes.
    Models(hub_cache::ModelsArgs),
}

fn main() -> anyhow::Result<()> {
    allocator::keep_working_set();
    match Cli::parse().command {
        // The server sets up its own logging from its configuration.
        Command::Serve(args) => sluice_server::commands::serve::run(*args),
        Command::Chat(args) => {
            log_to_stderr("warn");
            chat::run(args)
        }
        Command::Generate(args) => {
            log_to_stderr("warn");
            generate::run(args)
        }
        Command::Synth(args) => synth::run(args),
        Command::Pull(args) => {
            log_to_stderr("info");
            hub_cache::pull(args)
        }
        Command::Models(args) => hub_cache::models(args),
    }
}

/// Log lines at `level` and above (or as `SLUICE_LOG` says) to stderr, leaving stdout to what
/// the command prints.
fn log_to_stderr(level: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                .unwrap_or_else(|_| level.into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_flags_of_every_subcommand_are_consistent() {
        // Catches two flags of one name (chat flattens serve's flags beside its own).
        super::Cli::command().debug_assert();
    }
}
