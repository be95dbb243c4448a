//! `--model` by hub name: a path is used as it is; `ORG/NAME[:QUANT]` is resolved to files in
//! the shared Hugging Face cache (downloaded when missing, with progress reported), and the
//! loader opens those. The engine never sees the difference.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use sluice_hub::{DownloadProgress, Hub, HubSettings, ModelRef};

/// How often a download says how far it is when no terminal shows a bar.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

/// The path the loader opens for `arg`: itself, or the cached files of the hub name it is,
/// fetched at `revision` if the cache lacks them. `progress` counts the download (the server
/// shows it on `/health`); a bar or log lines report it while it runs.
pub async fn resolve(
    arg: &Path,
    revision: &str,
    progress: &DownloadProgress,
) -> anyhow::Result<PathBuf> {
    let name = match ModelRef::classify(arg) {
        ModelRef::Path(path) => return Ok(path),
        ModelRef::Hub(name) => name,
    };
    let hub = Hub::new(HubSettings::from_env())?;
    tracing::info!(
        model = %name,
        revision,
        endpoint = %hub.settings().endpoint,
        cache = %hub.settings().cache_dir.display(),
        offline = hub.settings().offline,
        "resolving the model on the hub"
    );
    let reporter = tokio::spawn(progress.clone().report(LOG_EVERY));
    // The reporter ends as the resolve finishes the progress, whatever the outcome.
    let resolved = hub.resolve(&name, revision, progress).await;
    let _ = reporter.await;
    let resolved = resolved.with_context(|| format!("cannot fetch the model {name}"))?;
    tracing::info!(
        model = %name,
        commit = %resolved.commit,
        path = %resolved.path.display(),
        files = resolved.files.len(),
        "the model's files are in the cache"
    );
    Ok(resolved.path)
}

/// [`resolve`] for a command that has no async runtime of its own (`sluice generate`).
pub fn resolve_blocking(arg: &Path, revision: &str) -> anyhow::Result<PathBuf> {
    if let ModelRef::Path(path) = ModelRef::classify(arg) {
        return Ok(path);
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(resolve(arg, revision, &DownloadProgress::new()))
}
