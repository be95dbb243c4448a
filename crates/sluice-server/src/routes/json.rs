//! The JSON body extractor every POST route uses instead of axum's `Json`: its rejections are
//! OpenAI errors (400 naming the offending field, 413 past the body limit, 408 for a body that
//! does not arrive in time) instead of axum's plain-text ones.
//!
//! The content type is not checked: `curl -d` sends `application/x-www-form-urlencoded` by
//! default, and a JSON body is recognised by parsing it.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::edge::error::ApiError;
use crate::engine::state::AppState;

pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        // tower-http's body timeout bounds the gap between two chunks; this bounds the whole
        // body, so a client trickling a byte at a time cannot hold a connection forever.
        let read = Bytes::from_request(req, state);
        let bytes = match tokio::time::timeout(state.body_timeout(), read).await {
            Err(_) => return Err(ApiError::body_timeout()),
            Ok(Err(rejection)) => return Err(body_error(rejection)),
            Ok(Ok(bytes)) => bytes,
        };
        parse(&bytes).map(Self)
    }
}

/// Parses a request body, naming the field a type error is in (`messages[0].content`).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        json_error(&path, &inner)
    })?;
    de.end().map_err(|e| json_error(".", &e))?;
    Ok(value)
}

fn json_error(path: &str, e: &serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Data => {
            let at_root = path == "." || path.is_empty();
            let param = match (missing_field(&e.to_string()), at_root) {
                (Some(field), true) => field,
                (Some(field), false) => format!("{path}.{field}"),
                (None, true) => String::new(),
                (None, false) => path.to_string(),
            };
            if param.is_empty() {
                ApiError::malformed(format!("Invalid request body: {e}"))
            } else {
                ApiError::invalid(param.clone(), format!("Invalid value for `{param}`: {e}"))
            }
        }
        Category::Syntax | Category::Eof | Category::Io => {
            ApiError::malformed(format!("The request body is not valid JSON: {e}"))
        }
    }
}

/// serde reports a missing field at the struct that lacks it, not at the field: "missing field
/// `role`" at `messages[0]`.
fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest[..rest.find('`')?].to_string())
}

fn body_error(rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::payload_too_large(None);
    }
    // tower-http's inactivity timeout surfaces as a body error whose source chain holds its
    // `TimeoutError`.
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&rejection);
    while let Some(e) = source {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return ApiError::body_timeout();
        }
        source = e.source();
    }
    ApiError::from_status(
        rejection.status(),
        format!("Cannot read the request body: {rejection}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Req {
        n: Option<usize>,
        messages: Vec<Msg>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Msg {
        content: String,
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (r#"{"messages":[], "n":"x"}"#, Some("n")),
            (
                r#"{"messages":[{"content":5}]}"#,
                Some("messages[0].content"),
            ),
            (r#"{"n":1}"#, Some("messages")),
            (r#"{"messages":[], "n":-1}"#, Some("n")),
            (r#"{"messages":[], "n":1e400}"#, None),
            (r#"{"messages":[]"#, None),
            (r#"{"messages":[]} trailing"#, None),
            ("[]", None),
            ("\"\\ud800\"", None),
        ];
        for (body, param) in cases {
            let e = parse::<Req>(body.as_bytes()).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
        }
        let e = parse::<Req>(b"{\"messages\":[{\"content\":\"\xff\"}]}").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }
}
