//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`, as vLLM serves them: a
//! LoRA adapter added to or removed from what requests may name, while the server runs. Both
//! answer only with `--allow-runtime-lora-updating` (a 404 otherwise, as vLLM without its
//! runtime-update switch), behind the API key when one is set. Loading reads and checks the
//! adapter off the async workers; a bad one is a 400 naming the problem, and the server goes
//! on serving.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;

use crate::edge::error::ApiError;
use crate::engine::lora::{LoraError, LoraRegistry};
use crate::engine::state::AppState;
use crate::routes::json::ApiJson;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadRequest {
    pub lora_name: String,
    pub lora_path: PathBuf,
    /// vLLM's: replace an adapter loaded under the same name (without it that is a 400).
    /// Requests running with the old weights finish with them.
    #[serde(default)]
    pub load_inplace: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnloadRequest {
    pub lora_name: String,
    /// vLLM's, unused there too.
    #[serde(default)]
    pub lora_int_id: Option<u64>,
}

/// The default model's adapters, when runtime updates are on (the default is loaded again if
/// `--max-loaded-models` had unloaded it).
async fn registry(state: &AppState, route: &str) -> Result<Arc<LoraRegistry>, ApiError> {
    let model = state.model_for(None).await?;
    match &model.loras {
        Some(loras) if loras.runtime_updates => Ok(loras.clone()),
        _ => Err(ApiError::from_status(
            StatusCode::NOT_FOUND,
            format!("{route} is served only with --allow-runtime-lora-updating."),
        )),
    }
}

fn api_error(e: LoraError) -> ApiError {
    match e {
        LoraError::NotFound(_) => ApiError::from_status(StatusCode::NOT_FOUND, e.to_string()),
        LoraError::Exists(_) | LoraError::BaseName { .. } => {
            ApiError::invalid("lora_name", e.to_string())
        }
        LoraError::Invalid { .. } => ApiError::invalid("lora_path", e.to_string()),
    }
}

pub async fn load(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<LoadRequest>,
) -> Result<String, ApiError> {
    let loras = registry(&state, "POST /v1/load_lora_adapter").await?;
    if req.lora_name.is_empty() {
        return Err(ApiError::invalid("lora_name", "lora_name is empty."));
    }
    let name = req.lora_name.clone();
    tokio::task::spawn_blocking(move || {
        loras.load(&req.lora_name, &req.lora_path, req.load_inplace)
    })
    .await
    .map_err(|e| ApiError::internal(format!("Loading the adapter failed: {e}")))?
    .map_err(api_error)?;
    Ok(format!(
        "Success: LoRA adapter '{name}' added successfully."
    ))
}

pub async fn unload(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<UnloadRequest>,
) -> Result<String, ApiError> {
    let loras = registry(&state, "POST /v1/unload_lora_adapter").await?;
    let _ = req.lora_int_id;
    loras.unload(&req.lora_name).map_err(api_error)?;
    Ok(format!(
        "Success: LoRA adapter '{}' removed successfully.",
        req.lora_name
    ))
}
