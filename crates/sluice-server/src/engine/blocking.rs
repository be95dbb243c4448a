//! Work a request needs that must not run on the async workers.

use crate::edge::error::ApiError;

/// Runs tokenization (or template rendering, or detokenization) off the async workers: a
/// prompt of a few MiB takes long enough to stall every other connection on a worker.
pub async fn tokenize_blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("Tokenization failed: {e}")))?
}
