//! `GET /openapi.json`: the OpenAPI 3.1 document of every route, kept by hand in
//! `openapi.json` beside this file and compiled in. Hand-kept rather than derived from the
//! types because the request types accept more shapes than a generator could describe (see
//! `openai::common`); tests keep it honest instead: `tests/openapi.rs` checks its operations
//! against the router's route table both ways, and `tests/e2e/test_openapi.py` validates real
//! responses against its schemas and runs schemathesis against the real binary.

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

/// The document, as served.
pub const DOCUMENT: &str = include_str!("openapi.json");

pub async fn document() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], DOCUMENT)
}
