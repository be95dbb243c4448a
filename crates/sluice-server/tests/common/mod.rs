//! Test harness: the real router over a real engine, on a tiny random-weight GGUF model
//! written once per test binary (the whole loading path, tokenizer and chat template
//! included), or on the engine's weightless mock model where a test must freeze or fail the
//! engine at a known point.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;
use sluice_engine::testing::{tiny_tokenizer, MockControl, MockModel, TINY_VOCAB};
use sluice_engine::{Engine, EngineConfig};
use sluice_model::testing::TinyModelSpec;
use sluice_model::WeightsKind;
use sluice_server::config::KvCacheDtype;
use sluice_server::engine::load::{self, LoraSettings, ModelSettings};
use sluice_server::{router, AppState, HttpSettings, ServedModel};
use sluice_tokenizer::ChatTemplate;
use tower::ServiceExt;

pub const TINY_NAME: &str = "tiny";

pub fn settings() -> HttpSettings {
    HttpSettings {
        api_key: None,
        metrics_require_key: false,
        cors_origins: Vec::new(),
        body_limit: 1 << 20,
        body_timeout: Duration::from_secs(30),
        webui: true,
    }
}

/// The tiny GGUF model every `tiny_app` serves, written once per test binary.
pub fn tiny_model_path() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("tiny.gguf");
        TinyModelSpec::default()
            .write_gguf(&path)
            .expect("write the tiny model");
        dir
    });
    dir.path().join("tiny.gguf")
}

pub struct TestApp {
    pub app: Router,
    pub state: AppState,
    /// Dropping it stops the engine thread.
    pub engine: Engine,
    /// Only with the mock model.
    pub control: Option<MockControl>,
}

impl TestApp {
    pub fn engine(&self) -> sluice_engine::EngineHandle {
        self.engine.handle()
    }

    pub async fn get(&self, path: &str) -> (StatusCode, HeaderMap, Bytes) {
        call(&self.app, Method::GET, path, Body::empty(), &[]).await
    }

    pub async fn post(&self, path: &str, body: impl Into<Body>) -> (StatusCode, HeaderMap, Bytes) {
        call(&self.app, Method::POST, path, body.into(), &[]).await
    }

    /// GETs and parses the JSON answer.
    pub async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let (status, _, bytes) = self.get(path).await;
        let value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "{path} answered {status} with a body that is not JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        (status, value)
    }

    /// POSTs JSON and parses the JSON answer.
    pub async fn post_json(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let (status, _, bytes) = self.post(path, body.to_string()).await;
        let value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "{path} answered {status} with a body that is not JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        (status, value)
    }
}

/// The router over the tiny GGUF model, loaded the way `sluice serve` loads a model.
pub fn tiny_app(http: HttpSettings) -> TestApp {
    tiny_app_from(http, tiny_model_path())
}

/// [`tiny_app`] over the model of `spec`, written to `dir` (which must outlive the app).
pub fn tiny_app_of(http: HttpSettings, spec: &TinyModelSpec, dir: &std::path::Path) -> TestApp {
    let path = dir.join("tiny.gguf");
    spec.write_gguf(&path).expect("write the tiny model");
    tiny_app_from(http, path)
}

fn tiny_app_from(http: HttpSettings, model: PathBuf) -> TestApp {
    tiny_app_with(http, model, None, 0)
}

/// [`tiny_app`] serving LoRA adapters as `sluice serve` does with `lora` (its
/// `--lora-modules`, `--max-lora-rank`, `--allow-runtime-lora-updating`) and `max_loras`.
pub fn tiny_app_with_lora(http: HttpSettings, lora: LoraSettings, max_loras: usize) -> TestApp {
    tiny_app_with(http, tiny_model_path(), Some(lora), max_loras)
}

fn tiny_app_with(
    http: HttpSettings,
    model: PathBuf,
    lora: Option<LoraSettings>,
    max_loras: usize,
) -> TestApp {
    let metrics = sluice_server::observe::metrics::install();
    let loaded = load::load(&ModelSettings {
        model,
        served_model_name: TINY_NAME.into(),
        weights: WeightsKind::F32,
        cuda_graphs: sluice_model::CudaGraphs::On,
        tool_call_parser: None,
        chat_template_date: sluice_tokenizer::TemplateDate::Today,
        pooling: None,
        kv_cache_bytes: 2 << 20,
        kv_cache_dtype: KvCacheDtype::F32,
        block_size: 16,
        draft_model: None,
        lora,
        mmproj: None,
        engine: EngineConfig {
            max_num_seqs: 32,
            max_loras,
            max_num_batched_tokens: 512,
            max_waiting: 256,
            max_model_len: None,
            // The prefix cache's routes are served only with KV events on; the batches queue
            // unread (past the queue's bound they are dropped, never waited on).
            kv_events: true,
            ..EngineConfig::default()
        },
    })
    .expect("load the tiny model");
    let state = AppState::new(http.body_timeout, metrics);
    state.set_ready(loaded.model);
    TestApp {
        app: router(state.clone(), &http),
        state,
        engine: loaded.engine,
        control: None,
    }
}

/// The router over the engine's mock model (no weights; steerable through `control`).
pub fn mock_app(http: HttpSettings, config: EngineConfig) -> TestApp {
    mock_app_with_template(http, config, ChatTemplate::chatml().expect("chatml"))
}

/// [`mock_app`] with a chat template of the test's own.
pub fn mock_app_with_template(
    http: HttpSettings,
    config: EngineConfig,
    template: ChatTemplate,
) -> TestApp {
    mock_app_with(http, config, template, 512)
}

/// [`mock_app`] with a context of 4096 tokens (the whole KV cache), for prompts with tools:
/// the tiny tokenizer spends a token per byte.
pub fn mock_app_long(http: HttpSettings, config: EngineConfig) -> TestApp {
    mock_app_with(http, config, ChatTemplate::chatml().expect("chatml"), 4096)
}

fn mock_app_with(
    http: HttpSettings,
    config: EngineConfig,
    template: ChatTemplate,
    max_model_len: usize,
) -> TestApp {
    let metrics = sluice_server::observe::metrics::install();
    let model = MockModel::new(TINY_VOCAB, max_model_len, 256, 16);
    let control = model.control();
    let engine = Engine::start(Box::new(model), tiny_tokenizer(), config).expect("start engine");
    let state = AppState::new(http.body_timeout, metrics);
    state.set_ready(ServedModel::new(
        engine.handle(),
        "mock".into(),
        Some(template),
    ));
    TestApp {
        app: router(state.clone(), &http),
        state,
        engine,
        control: Some(control),
    }
}

pub async fn call(
    app: &Router,
    method: Method,
    path: &str,
    body: Body,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Bytes) {
    let response = send(app, method, path, body, headers).await;
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("read the body").to_bytes();
    (parts.status, parts.headers, bytes)
}

/// The response with its body still unread (a stream to read chunk by chunk, or drop).
pub async fn send(
    app: &Router,
    method: Method,
    path: &str,
    body: Body,
    headers: &[(&str, &str)],
) -> axum::response::Response {
    let mut request = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    app.clone()
        .oneshot(request.body(body).expect("request"))
        .await
        .expect("the router is infallible")
}

/// The `data:` payloads of an SSE body, in order (keep-alive comments skipped).
pub fn sse_data(body: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(body).expect("SSE is UTF-8");
    assert!(
        text.ends_with("\n\n"),
        "every event ends with a blank line: {text:?}"
    );
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .filter_map(|event| {
            let lines: Vec<&str> = event.lines().filter(|l| !l.starts_with(':')).collect();
            if lines.is_empty() {
                return None;
            }
            let data: Vec<&str> = lines
                .iter()
                .map(|l| {
                    l.strip_prefix("data: ")
                        .unwrap_or_else(|| panic!("not a data line: {l:?}"))
                })
                .collect();
            Some(data.join("\n"))
        })
        .collect()
}

/// The JSON chunks of an SSE body, checking it ends with `[DONE]`.
pub fn sse_chunks(body: &[u8]) -> Vec<Value> {
    let mut data = sse_data(body);
    assert_eq!(
        data.pop().as_deref(),
        Some("[DONE]"),
        "the stream ends with [DONE]"
    );
    data.iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("chunk {d:?}: {e}")))
        .collect()
}

/// Asserts OpenAI's error shape with every key, and the status and param.
#[track_caller]
pub fn assert_error(status: StatusCode, body: &Value, expected: StatusCode, param: Option<&str>) {
    assert_eq!(status, expected, "body: {body}");
    let error = body
        .get("error")
        .unwrap_or_else(|| panic!("no `error` object: {body}"));
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(error["type"].is_string(), "{body}");
    assert!(
        error.get("param").is_some() && error.get("code").is_some(),
        "{body}"
    );
    assert_eq!(error["param"].as_str(), param, "param of {body}");
}

/// Polls `done` every 10 ms for up to `limit` (generous: a liveness bound, not a timing
/// assertion).
pub async fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}
