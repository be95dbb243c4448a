//! `GET /version`.

use axum::Json;
use serde_json::{json, Value};

pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}
