//! Log output for `sluice serve`: text or JSON lines on stderr, filtered by `--log-level`
//! (a level, or any tracing filter such as `info,sluice_engine=debug`).

use std::io::IsTerminal;

use anyhow::Context;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

pub fn init(format: LogFormat, level: &str) -> anyhow::Result<()> {
    let filter =
        EnvFilter::try_new(level).with_context(|| format!("invalid --log-level `{level}`"))?;
    // Colour codes only for a person at a terminal; a supervisor's log file gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
