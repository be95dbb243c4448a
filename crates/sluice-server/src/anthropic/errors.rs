//! Anthropic's error shape, `{"type": "error", "error": {"type", "message"}}`, for every error
//! a Messages route answers: the handler's, and those of the layers around it (API key, body
//! limit and timeout, a bad JSON body), which all speak OpenAI's shape. A middleware rewrites
//! them at the edge, so each keeps a single typed error ([`ApiError`]) until the last moment.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::sse::Event;
use axum::response::Response;
use serde::Serialize;

use crate::edge::error::ApiError;

/// Routes that answer in Anthropic's shape.
pub fn is_anthropic_route(path: &str) -> bool {
    path == "/v1/messages" || path == "/v1/messages/count_tokens"
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

/// Anthropic's error type for an HTTP status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 408 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// Anthropic's errors name no parameter; the message does, when it does not already.
fn message_naming_param(message: &str, param: Option<&str>) -> String {
    match param {
        Some(p) if !p.is_empty() && !message.contains(p) => format!("{p}: {message}"),
        _ => message.to_string(),
    }
}

/// The body of `e` in Anthropic's shape.
pub fn to_json(status: StatusCode, message: &str, param: Option<&str>) -> String {
    let message = message_naming_param(message, param);
    serde_json::to_string(&ErrorBody {
        kind: "error",
        error: ErrorObject {
            kind: error_type(status),
            message: &message,
        },
    })
    .unwrap_or_else(|_| r#"{"type":"error","error":{"type":"api_error","message":"error"}}"#.into())
}

/// The `error` event a stream ends with when the engine fails mid-message.
pub fn stream_error(e: &ApiError) -> Event {
    Event::default()
        .event("error")
        .data(to_json(e.status, &e.message, e.param.as_deref()))
}

/// Largest error body read back for rewriting; ours are a few hundred bytes.
const MAX_ERROR_BODY: usize = 64 << 10;

/// Middleware: an error answer of an Anthropic route, in OpenAI's shape, becomes Anthropic's.
/// Status and headers (`Retry-After`) are kept.
pub async fn reshape(request: Request, next: Next) -> Response {
    let anthropic = is_anthropic_route(request.uri().path());
    let response = next.run(request).await;
    let status = response.status();
    if !anthropic || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_ERROR_BODY)
        .await
        .unwrap_or_default();
    let openai: Option<serde_json::Value> = serde_json::from_slice(&bytes).ok();
    let error = openai.as_ref().and_then(|v| v.get("error"));
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(|m| m.as_str())
        .or_else(|| status.canonical_reason())
        .unwrap_or("Request failed");
    let param = error.and_then(|e| e.get("param")).and_then(|p| p.as_str());
    let text = to_json(status, message, param);
    parts.headers.remove(CONTENT_LENGTH);
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Response::from_parts(parts, Body::from(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_take_anthropics_shape_and_name_the_field() {
        let v: serde_json::Value = serde_json::from_str(&to_json(
            StatusCode::BAD_REQUEST,
            "must be in [0, 1]",
            Some("temperature"),
        ))
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "temperature: must be in [0, 1]"}})
        );
        assert_eq!(error_type(StatusCode::UNAUTHORIZED), "authentication_error");
        assert_eq!(
            error_type(StatusCode::TOO_MANY_REQUESTS),
            "rate_limit_error"
        );
        assert_eq!(error_type(StatusCode::INTERNAL_SERVER_ERROR), "api_error");
        assert_eq!(
            message_naming_param("`max_tokens` is missing", Some("max_tokens")),
            "`max_tokens` is missing"
        );
    }
}
