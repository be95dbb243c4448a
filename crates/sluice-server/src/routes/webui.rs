//! The chat page at `/` (`--webui on`, the default): three files embedded in the binary at
//! build time (`crates/sluice-server/webui/`), so the page works on a machine with no network.
//! It talks to the API from the browser like any other client, sending the API key the user
//! gives it; the page itself holds no data, so it is served without the key.
//!
//! Every file goes out with a Content-Security-Policy that allows scripts, styles and
//! connections from this origin only, no inline script and no other origin: model output that
//! the page shows can never run as script or fetch anything, even if a rendering bug let markup
//! through.

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::engine::state::AppState;

const INDEX_HTML: &str = include_str!("../../webui/index.html");
const APP_JS: &str = include_str!("../../webui/app.js");
const STYLE_CSS: &str = include_str!("../../webui/style.css");

/// What the page may load and run: its own scripts, styles and API, images from data: and
/// blob: URLs (attachments), nothing else; no forms, no framing, no `<base>`.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The page's routes: `/`, `/webui/app.js`, `/webui/style.css`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/",
            get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            "/webui/app.js",
            get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/webui/style.css",
            get(|| async { asset(STYLE_CSS, "text/css; charset=utf-8") }),
        )
}

/// The bytes the page's first load transfers (the three files, uncompressed).
pub fn page_bytes() -> usize {
    INDEX_HTML.len() + APP_JS.len() + STYLE_CSS.len()
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
            (
                HeaderName::from_static("x-content-type-options"),
                HeaderValue::from_static("nosniff"),
            ),
            // Revalidate each load: a new binary serves a new page.
            (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}
