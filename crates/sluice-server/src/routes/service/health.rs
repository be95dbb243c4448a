//! `GET /health`: 200 once the model is loaded and its engine runs; 503 while it downloads or
//! loads (the body says how far a download is), while the server drains for shutdown, and if
//! the engine thread has stopped (so a load balancer or an orchestrator stops sending traffic,
//! or restarts the process).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use crate::engine::state::AppState;

pub async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let status = if state.is_draining() {
        "draining"
    } else if state.models().is_some() {
        // Ready once the default model has loaded; models unloaded since (under
        // --max-loaded-models) load again on use, so only a loaded engine that stopped counts.
        if state.loaded_models().iter().any(|m| !m.engine.is_running()) {
            "engine stopped"
        } else {
            return (StatusCode::OK, Json(json!({"status": "ok"})));
        }
    } else {
        match state.download().map(|d| d.snapshot()) {
            Some(download) if !download.finished => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(json!({ "status": "downloading", "download": download })),
                )
            }
            _ => "loading",
        }
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "status": status })),
    )
}
