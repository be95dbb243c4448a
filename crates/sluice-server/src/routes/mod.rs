//! The HTTP surface: routes, and the middleware stack every request goes through.
//!
//! Outermost first: tracing, HTTP metrics, CORS (when configured), panic catching, rewriting
//! any non-JSON error (axum's 404/405, tower-http's 413/408) into OpenAI's error shape, the body
//! size limit and the body inactivity timeout. The API-key check wraps the API routes only
//! (and `/metrics` when asked to).
//!
//! Routes are registered through [`RouteTable`], which records each method and path as it adds
//! it: [`route_table`] is the list the OpenAPI document (`openapi.json`) is checked against.

pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod json;
pub mod lora;
pub mod messages;
pub mod render;
pub mod responses;
pub mod service;
pub mod tokenize;
pub mod webui;

use std::any::Any;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::http::header::{HeaderName, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{from_fn, from_fn_with_state, map_response};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter};
use axum::{Extension, Router};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::cors::{AllowOrigin, Any as AnyOrigin, CorsLayer};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::{
    DefaultMakeSpan, DefaultOnFailure, DefaultOnRequest, DefaultOnResponse, TraceLayer,
};
use tracing::Level;

use self::service::{health, kv_cache, metrics, models, openapi, version};
use crate::edge::auth::{self, ApiKey};
use crate::edge::error::ApiError;
use crate::engine::state::AppState;
use crate::responses::store::ResponseStore;

/// The HTTP-level settings of [`router`].
#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub api_key: Option<String>,
    /// `/metrics` requires the API key too (no effect without one).
    pub metrics_require_key: bool,
    /// Empty: CORS off. `*` allows any origin.
    pub cors_origins: Vec<String>,
    pub body_limit: usize,
    /// Longest pause between two chunks of a request body (the whole body's deadline is the
    /// same duration, enforced by the JSON extractor).
    pub body_timeout: Duration,
    /// Serve the chat page at `/` ([`webui`]).
    pub webui: bool,
}

impl HttpSettings {
    pub fn from_config(config: &crate::config::Config) -> Self {
        Self {
            api_key: config.api_key.as_ref().map(|k| k.0.clone()),
            metrics_require_key: config.metrics_require_key,
            cors_origins: config.cors_origins.0.clone(),
            body_limit: usize::try_from(config.body_limit.bytes()).unwrap_or(usize::MAX),
            body_timeout: config.request_timeout(),
            webui: config.webui == crate::config::Switch::On,
        }
    }
}

/// Routes and the methods they answer, recorded as they are added so the list cannot drift
/// from what the router serves.
struct RouteTable {
    router: Router<AppState>,
    routes: Vec<(Method, &'static str)>,
}

impl RouteTable {
    fn new() -> Self {
        Self {
            router: Router::new(),
            routes: Vec::new(),
        }
    }

    fn add<H, T>(mut self, method: Method, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let filter = MethodFilter::try_from(method.clone())
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        self.router = self.router.route(path, on(filter, handler));
        self.routes.push((method, path));
        self
    }

    /// Wraps this group's routes in the API-key check when a key is configured.
    fn keyed(mut self, key: Option<&str>) -> Self {
        if let Some(key) = key {
            self.router = self
                .router
                .route_layer(from_fn_with_state(ApiKey::new(key), auth::require_key));
        }
        self
    }
}

/// The OpenAI-compatible API, vLLM's tokenizer, render and prefix-cache routes, and the
/// prefix cache's listing: behind the API key when one is set.
fn api_routes() -> RouteTable {
    RouteTable::new()
        .add(Method::POST, "/v1/completions", completions::handler)
        .add(Method::POST, "/v1/completions/render", render::completions)
        .add(Method::POST, "/v1/chat/completions", chat::handler)
        .add(Method::POST, "/v1/chat/completions/render", render::chat)
        .add(Method::POST, "/v1/embeddings", embeddings::handler)
        .add(Method::POST, "/v1/messages", messages::handler)
        .add(
            Method::POST,
            "/v1/messages/count_tokens",
            messages::count_tokens,
        )
        .add(Method::POST, "/v1/responses", responses::create)
        .add(
            Method::GET,
            "/v1/responses/{response_id}",
            responses::retrieve,
        )
        .add(Method::POST, "/v1/load_lora_adapter", lora::load)
        .add(Method::POST, "/v1/unload_lora_adapter", lora::unload)
        .add(Method::GET, "/v1/models", models::list)
        .add(Method::GET, "/v1/models/{model}", models::retrieve)
        .add(Method::POST, "/models/load", models::load)
        .add(Method::POST, "/models/unload", models::unload)
        .add(Method::POST, "/tokenize", tokenize::tokenize)
        .add(Method::POST, "/detokenize", tokenize::detokenize)
        .add(Method::GET, "/debug/kv_cache", kv_cache::snapshot)
        .add(
            Method::POST,
            "/reset_prefix_cache",
            kv_cache::reset_prefix_cache,
        )
}

/// Open by default for scrapers; behind the key with `metrics_require_key`.
fn metrics_routes() -> RouteTable {
    RouteTable::new().add(Method::GET, "/metrics", metrics::metrics)
}

/// Always open: probes and documentation.
fn open_routes() -> RouteTable {
    RouteTable::new()
        .add(Method::GET, "/health", health::health)
        .add(Method::GET, "/version", version::version)
        .add(Method::GET, "/openapi.json", openapi::document)
}

/// Every route the router serves, as (method, path with `{param}` placeholders).
pub fn route_table() -> Vec<(Method, &'static str)> {
    [api_routes(), metrics_routes(), open_routes()]
        .into_iter()
        .flat_map(|t| t.routes)
        .collect()
}

pub fn router(state: AppState, settings: &HttpSettings) -> Router {
    let key = settings.api_key.as_deref();
    let metrics_key = key.filter(|_| settings.metrics_require_key);
    let limit = settings.body_limit;
    // `Router::layer` wraps each route: the last added runs first.
    let mut routes = api_routes()
        .keyed(key)
        .router
        .merge(metrics_routes().keyed(metrics_key).router)
        .merge(open_routes().router);
    if settings.webui {
        // Not in `route_table`: the page is not part of the API its OpenAPI document describes.
        routes = routes.merge(webui::router());
    }
    let mut app = routes
        .fallback(not_found)
        .with_state(state)
        // The Responses API's stored responses, one store per server (the routes' own state,
        // beside the engine's).
        .layer(Extension(ResponseStore::new()))
        .layer(RequestBodyTimeoutLayer::new(settings.body_timeout))
        .layer(RequestBodyLimitLayer::new(limit))
        // tower-http's limit replaces axum's default one (2 MB), which would apply too.
        .layer(DefaultBodyLimit::disable())
        .layer(map_response(move |r: Response| {
            openai_error_shape(r, limit)
        }))
        .layer(CatchPanicLayer::custom(panic_response))
        // Outside the layers above, so their errors take Anthropic's shape too.
        .layer(from_fn(crate::anthropic::errors::reshape));
    if let Some(cors) = cors(&settings.cors_origins) {
        app = app.layer(cors);
    }
    app.layer(from_fn(crate::observe::metrics::track_http))
        .layer(trace())
}

/// Per-request HTTP spans and events at debug: the info line per generation request is the
/// handlers' own, and an error status is the client's problem, not the server's.
fn trace() -> TraceLayer<SharedClassifier<ServerErrorsAsFailures>> {
    TraceLayer::new_for_http()
        .make_span_with(DefaultMakeSpan::new().level(Level::DEBUG))
        .on_request(DefaultOnRequest::new().level(Level::DEBUG))
        .on_response(DefaultOnResponse::new().level(Level::DEBUG))
        .on_failure(DefaultOnFailure::new().level(Level::DEBUG))
}

fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::from(AnyOrigin)
    } else {
        let list: Vec<HeaderValue> = origins
            .iter()
            .filter_map(|o| match HeaderValue::from_str(o) {
                Ok(v) => Some(v),
                Err(_) => {
                    tracing::warn!(origin = %o, "ignoring a CORS origin that is no header value");
                    None
                }
            })
            .collect();
        AllowOrigin::list(list)
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers([
                AUTHORIZATION,
                CONTENT_TYPE,
                HeaderName::from_static("openai-organization"),
                HeaderName::from_static("openai-project"),
                // Anthropic's clients.
                HeaderName::from_static("x-api-key"),
                HeaderName::from_static("anthropic-version"),
                HeaderName::from_static("anthropic-beta"),
            ])
            .max_age(Duration::from_secs(600)),
    )
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::from_status(
        StatusCode::NOT_FOUND,
        format!("No route for {}.", uri.path()),
    )
}

fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    tracing::error!(panic = %message, "a request handler panicked");
    ApiError::internal("Internal server error.").into_response()
}

/// Errors produced outside our handlers (axum's 405, tower-http's 413 and 408) come as plain
/// text; clients of an OpenAI API expect the JSON error object everywhere.
async fn openai_error_shape(response: Response, body_limit: usize) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json {
        return response;
    }
    let error = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::payload_too_large(Some(body_limit as u64)),
        StatusCode::REQUEST_TIMEOUT => ApiError::body_timeout(),
        StatusCode::METHOD_NOT_ALLOWED => {
            ApiError::from_status(status, "Method not allowed on this route.")
        }
        _ => ApiError::from_status(
            status,
            status.canonical_reason().unwrap_or("Request failed"),
        ),
    };
    let (parts, _) = response.into_parts();
    let mut rewritten = error.into_response();
    for (name, value) in &parts.headers {
        if name != CONTENT_TYPE && name != CONTENT_LENGTH {
            rewritten.headers_mut().append(name, value.clone());
        }
    }
    rewritten
}
