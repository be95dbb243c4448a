//! Prometheus metrics: the exporter (installed once per process, before the engine starts so
//! its handles register with it) and the HTTP request metrics, by route and status.
//!
//! | name | kind | what |
//! | --- | --- | --- |
//! | `sluice_http_requests_total{route,status}` | counter | responses, by matched route (`unmatched` for unknown paths) and status code |
//! | `sluice_http_request_duration_seconds{route}` | histogram | time until the response head is ready (for a stream: until it starts) |
//!
//! plus the engine's `sluice_*` metrics (see `sluice_engine::metrics`), and vLLM's names of the
//! engine's counts for the routers that read them ([`crate::vllm_metrics`]).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics::{counter, describe_counter, describe_histogram, histogram, Unit};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

pub const HTTP_REQUESTS: &str = "sluice_http_requests_total";
pub const HTTP_REQUEST_DURATION: &str = "sluice_http_request_duration_seconds";

/// Seconds: from sub-millisecond HTTP answers and decode steps to multi-minute generations.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
];
/// Tokens per engine step: single decodes up to full prefill budgets.
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];

/// How often histogram samples are folded into their buckets between scrapes.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder as the global `metrics` recorder (once per process; later
/// calls return the same handle). Must run before the engine starts.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = builder().unwrap_or_else(|e| {
                tracing::warn!("histogram buckets rejected ({e}); exporting summaries");
                PrometheusBuilder::new()
            });
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("another metrics recorder is installed; /metrics will be empty");
            }
            describe_counter!(
                HTTP_REQUESTS,
                Unit::Count,
                "HTTP responses by route and status."
            );
            describe_histogram!(
                HTTP_REQUEST_DURATION,
                Unit::Seconds,
                "Time to produce the HTTP response head, by route."
            );
            handle
        })
        .clone()
}

/// Histograms with buckets render as Prometheus histograms (summaries otherwise).
fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(sluice_engine::metrics::TOKENS_PER_STEP.into()),
            TOKEN_BUCKETS,
        )
}

/// Middleware: counts every response by route and status and times it.
pub async fn track_http(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let start = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    counter!(HTTP_REQUESTS, "route" => route.clone(), "status" => status).increment(1);
    histogram!(HTTP_REQUEST_DURATION, "route" => route).record(start.elapsed().as_secs_f64());
    response
}
