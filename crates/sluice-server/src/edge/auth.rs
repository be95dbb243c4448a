//! The optional API key: with one configured, every API route (`/v1/*`, `/tokenize`,
//! `/detokenize`) requires `Authorization: Bearer KEY`, or `x-api-key: KEY` as Anthropic's
//! clients send it; `/health`, `/version` and
//! `/openapi.json` stay open for probes, and `/metrics` for scrapers unless
//! `metrics_require_key` is set (the router decides which routes this guards).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::edge::error::ApiError;

#[derive(Clone)]
pub struct ApiKey(Arc<str>);

impl ApiKey {
    pub fn new(key: &str) -> Self {
        Self(key.into())
    }

    /// Compares in constant time, so response timing reveals nothing about how much of a
    /// guess was right (a wrong length is still told apart, which gives nothing away).
    pub fn matches(&self, header: Option<&[u8]>) -> bool {
        let Some(value) = header else {
            return false;
        };
        let Some(token) = strip_bearer(value) else {
            return false;
        };
        self.matches_key(token)
    }

    /// Whether `token` (the bare key, as `x-api-key` carries it) is the key.
    pub fn matches_key(&self, token: &[u8]) -> bool {
        token.ct_eq(self.0.as_bytes()).into()
    }
}

/// The credentials of `Bearer <token>` (scheme case-insensitive, as RFC 7235 says).
fn strip_bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() < SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    Some(value[SCHEME.len()..].trim_ascii())
}

/// Middleware for the protected routes.
pub async fn require_key(State(key): State<ApiKey>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let bearer = headers.get(AUTHORIZATION).map(|v| v.as_bytes());
    let x_api_key = headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii());
    if !(key.matches(bearer) || x_api_key.is_some_and(|k| key.matches_key(k))) {
        return ApiError::unauthorized().into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_matches() {
        let key = ApiKey::new("sk-secret");
        assert!(key.matches(Some(b"Bearer sk-secret")));
        assert!(key.matches(Some(b"bearer  sk-secret ")));
        for bad in [
            &b"Bearer sk-secre"[..],
            b"Bearer sk-secretx",
            b"sk-secret",
            b"Basic sk-secret",
            b"Bearer ",
            b"",
            b"Bearer \xff\xfe",
        ] {
            assert!(!key.matches(Some(bad)), "{bad:?}");
        }
        assert!(!key.matches(None));
        assert!(key.matches_key(b"sk-secret"));
        assert!(!key.matches_key(b"sk-secre") && !key.matches_key(b""));
    }
}
