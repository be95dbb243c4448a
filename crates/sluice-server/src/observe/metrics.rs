//! Prometheus metrics: the exporter (installed once per process, before the engine starts so
//! its handles register with it) and the HTTP request metrics, by route and status.
//!
//! | name | kind | what |
//! | --- | --- | --- |
//! | `sluice_http_requests_total{route,status}` | counter | responses, by matched route (`unmatched` for unknown paths) and status code |
//! | `sluice_http_request_duration_seconds{route}` | histogram | time until the response head is ready (for a stream: until it starts) |
//! | `sluice_model_parameters{kind}` | gauge | the served model's parameters: `total` (every expert of a mixture counted) and `active` (what one token multiplies by) |
//! | `sluice_model_experts{kind}` | gauge | a mixture of experts: experts a layer holds (`total`) and a token runs (`per_token`); absent for a dense model |
//!
//! plus the engine's `sluice_*` metrics (see `sluice_engine::metrics`), and vLLM's names of the
//! engine's counts for the routers that read them ([`crate::observe::vllm_metrics`]).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

pub const HTTP_REQUESTS: &str = "sluice_http_requests_total";
pub const HTTP_REQUEST_DURATION: &str = "sluice_http_request_duration_seconds";
pub const MODEL_PARAMETERS: &str = "sluice_model_parameters";
pub const MODEL_EXPERTS: &str = "sluice_model_experts";

/// Seconds: from sub-millisecond HTTP answers and decode steps to multi-minute generations.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
];
/// Tokens per engine step: single decodes up to full prefill budgets.
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];

/// Shares (0 to 1): a mixture of experts' share of expert weights read per step.
const SHARE_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0,
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
        )?
        .set_buckets_for_metric(
            Matcher::Full(sluice_engine::metrics::MOE_EXPERT_SHARE.into()),
            SHARE_BUCKETS,
        )
}

/// Each served model's state (`sluice_model_loaded`: 1 while loaded) and the requests waiting
/// for it to load (`sluice_model_load_waiting`), refreshed at each scrape: `(name, loaded,
/// waiting)` a model.
pub fn record_models(models: &[(String, bool, usize)]) {
    describe_gauge!(
        MODEL_LOADED,
        "1 while the served model is loaded (others load on first use)."
    );
    describe_gauge!(
        MODEL_LOAD_WAITING,
        "Requests waiting for the model to load, or for room under --max-loaded-models."
    );
    for (name, loaded, waiting) in models {
        gauge!(MODEL_LOADED, "model" => name.clone()).set(if *loaded { 1.0 } else { 0.0 });
        gauge!(MODEL_LOAD_WAITING, "model" => name.clone()).set(*waiting as f64);
    }
}

/// The served model's shape as gauges: its parameters (total and active), and a mixture's
/// experts (in a layer, per token).
pub const MODEL_LOADED: &str = "sluice_model_loaded";
pub const MODEL_LOAD_WAITING: &str = "sluice_model_load_waiting";

pub fn record_model(
    model: &str,
    parameters: u64,
    active_parameters: u64,
    experts: Option<(usize, usize)>,
) {
    let model = model.to_string();
    describe_gauge!(
        MODEL_PARAMETERS,
        Unit::Count,
        "Parameters of the served model: total, and active (what one token multiplies by)."
    );
    gauge!(MODEL_PARAMETERS, "model" => model.clone(), "kind" => "total").set(parameters as f64);
    gauge!(MODEL_PARAMETERS, "model" => model.clone(), "kind" => "active")
        .set(active_parameters as f64);
    if let Some((experts, per_token)) = experts {
        describe_gauge!(
            MODEL_EXPERTS,
            Unit::Count,
            "A mixture of experts: experts a layer holds (total) and a token runs (per_token)."
        );
        gauge!(MODEL_EXPERTS, "model" => model.clone(), "kind" => "total").set(experts as f64);
        gauge!(MODEL_EXPERTS, "model" => model, "kind" => "per_token").set(per_token as f64);
    }
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
