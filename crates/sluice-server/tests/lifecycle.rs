//! Requests against an engine frozen at a known point (the engine's mock model, held at its
//! forward): backpressure, client disconnects, engine failures, draining, and slow clients.

mod common;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use common::*;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sluice_engine::testing::MockControl;
use sluice_engine::EngineConfig;
use sluice_server::commands::shutdown::{self, Drained, Signals};
use sluice_server::edge::http::HttpServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(20);

fn config() -> EngineConfig {
    EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 512,
        max_waiting: 64,
        max_model_len: None,
        ..EngineConfig::default()
    }
}

fn streaming(max_tokens: usize) -> String {
    json!({"prompt": "hello", "max_tokens": max_tokens, "ignore_eos": true, "stream": true})
        .to_string()
}

/// Waits (off the async workers: it blocks) until the `k`-th held forward is at the mock's
/// gate.
async fn held(control: &MockControl, k: u64) -> bool {
    let control = control.clone();
    tokio::task::spawn_blocking(move || control.wait_until_held(k, LIMIT))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_full_queue_gets_429_with_retry_after() {
    let t = mock_app(
        settings(),
        EngineConfig {
            max_num_seqs: 1,
            max_waiting: 1,
            ..config()
        },
    );
    let control = t.control.clone().unwrap();
    control.hold();
    let running = send(
        &t.app,
        Method::POST,
        "/v1/completions",
        streaming(4).into(),
        &[],
    )
    .await;
    assert_eq!(running.status(), StatusCode::OK);
    assert!(held(&control, 1).await);
    // The engine is inside a step: this one waits...
    let waiting = send(
        &t.app,
        Method::POST,
        "/v1/completions",
        streaming(4).into(),
        &[],
    )
    .await;
    assert_eq!(waiting.status(), StatusCode::OK);
    // ...and the queue (one place) is full.
    let (status, headers, bytes) = call(
        &t.app,
        Method::POST,
        "/v1/completions",
        streaming(4).into(),
        &[],
    )
    .await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_error(status, &v, StatusCode::TOO_MANY_REQUESTS, None);
    assert_eq!(headers["retry-after"], "1");
    control.open();
    for response in [running, waiting] {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let chunks = sse_chunks(&bytes);
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "length"
        );
    }
}

#[tokio::test]
async fn dropping_a_stream_aborts_its_sequence() {
    let t = mock_app(settings(), config());
    let control = t.control.clone().unwrap();
    control.hold();
    let response = send(
        &t.app,
        Method::POST,
        "/v1/completions",
        streaming(400).into(),
        &[],
    )
    .await;
    assert!(held(&control, 1).await);
    control.release(3);
    // Read until the first token arrives, then hang up.
    let mut body = response.into_body();
    let frame = tokio::time::timeout(LIMIT, body.frame()).await.unwrap();
    assert!(frame.is_some());
    drop(body);
    control.open();
    let engine = t.engine();
    assert!(
        eventually(LIMIT, || {
            let s = engine.stats();
            s.in_flight() == 0 && s.kv_blocks_used == 0
        })
        .await,
        "{:?}",
        engine.stats()
    );
    assert!(
        control.forwards() < 400,
        "the sequence ran to its end: not aborted"
    );
    assert!(eventually(LIMIT, || t.state.in_flight() == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streaming_client_that_hangs_up_aborts_its_request() {
    let t = mock_app(settings(), config());
    let control = t.control.clone().unwrap();
    control.hold();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = HttpServer::spawn(listener, t.app.clone(), Duration::from_secs(10));
    let mut client = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let body = json!({"prompt": "hello", "max_tokens": 400, "ignore_eos": true}).to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    assert!(held(&control, 1).await);
    drop(client);
    // The handler (and with it the request's stream) goes when hyper sees the hang-up.
    assert!(eventually(LIMIT, || t.state.in_flight() == 0).await);
    control.open();
    let engine = t.engine();
    assert!(eventually(LIMIT, || engine.stats().in_flight() == 0).await);
    assert!(
        control.forwards() < 400,
        "the request ran to its end: not aborted"
    );
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn an_engine_failure_is_an_error_never_a_hang() {
    let t = mock_app(settings(), config());
    let control = t.control.clone().unwrap();
    control.fail_next(1);
    let (status, v) = t
        .post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 3}))
        .await;
    assert_error(status, &v, StatusCode::INTERNAL_SERVER_ERROR, None);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("injected failure"));

    control.fail_next(1);
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
                      "stream": true});
    let (status, _, bytes) = t.post("/v1/chat/completions", body.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = sse_chunks(&bytes);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let error = &chunks.last().unwrap()["error"];
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("injected failure"),
        "{chunks:?}"
    );
    assert_eq!(error["type"], "server_error");

    // The engine keeps serving.
    let (status, _) = t
        .post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 3}))
        .await;
    assert_eq!(status, StatusCode::OK);

    // Both failures are counted on /metrics (at least: the recorder is shared by this test
    // binary's other tests, and counters only grow).
    let (status, _, body) = t.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8_lossy(&body);
    // Summed over the series of `name` whose labels hold `label` (every engine series also
    // carries `model`).
    let value = |name: &str, label: &str| -> f64 {
        let values: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter(|l| l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        assert!(!values.is_empty(), "no {name} {label} in /metrics:\n{text}");
        values.iter().sum()
    };
    assert!(value("sluice_engine_step_failures_total", "model=") >= 2.0);
    assert!(value("sluice_request_success_total", "finish_reason=\"error\"") >= 2.0);
}

#[tokio::test]
async fn draining_refuses_new_requests_and_finishes_those_in_flight() {
    let t = mock_app(settings(), config());
    let control = t.control.clone().unwrap();
    control.hold();
    let response = send(
        &t.app,
        Method::POST,
        "/v1/completions",
        streaming(20).into(),
        &[],
    )
    .await;
    assert!(held(&control, 1).await);

    t.state.begin_drain();
    t.engine().begin_drain();
    let (status, _, body) = t.get("/health").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["status"],
        "draining"
    );
    let (status, v) = t
        .post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 3}))
        .await;
    assert_error(status, &v, StatusCode::SERVICE_UNAVAILABLE, None);

    let reader =
        tokio::spawn(async move { response.into_body().collect().await.unwrap().to_bytes() });
    control.open();
    let mut signals = Signals::new().unwrap();
    let engine = t.engine();
    let drained =
        shutdown::drain(&t.state, || engine.stats().in_flight(), LIMIT, &mut signals).await;
    assert_eq!(drained, Drained::Idle);
    let chunks = sse_chunks(&reader.await.unwrap());
    let text_chunks = chunks
        .iter()
        .filter(|c| c["choices"][0]["finish_reason"].is_null())
        .count();
    assert!(text_chunks <= 20);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[tokio::test]
async fn requests_left_at_the_drain_timeout_end_with_abort() {
    let t = mock_app(settings(), config());
    let control = t.control.clone().unwrap();
    control.hold();
    let response = send(
        &t.app,
        Method::POST,
        "/v1/completions",
        streaming(20).into(),
        &[],
    )
    .await;
    assert!(held(&control, 1).await);
    t.state.begin_drain();
    t.engine().begin_drain();
    let mut signals = Signals::new().unwrap();
    let engine = t.engine();
    let drained = shutdown::drain(
        &t.state,
        || engine.stats().in_flight(),
        Duration::from_millis(50),
        &mut signals,
    )
    .await;
    assert_eq!(drained, Drained::TimedOut);
    let reader =
        tokio::spawn(async move { response.into_body().collect().await.unwrap().to_bytes() });
    control.open();
    let report = tokio::task::spawn_blocking(move || t.engine.shutdown(Duration::ZERO))
        .await
        .unwrap();
    assert!(report.aborted <= 1);
    let chunks = sse_chunks(&reader.await.unwrap());
    let last = &chunks.last().unwrap()["choices"][0]["finish_reason"];
    assert!(last == "abort" || last == "length", "{chunks:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let t = mock_app(settings(), config());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = HttpServer::spawn(listener, t.app.clone(), Duration::from_millis(300));
    let mut client = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    client
        .write_all(b"POST /v1/completions HTTP/1.1\r\nhost: test\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(LIMIT, client.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the server kept a half-sent request open");
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_speaks_sse_over_tcp() {
    let t = mock_app(settings(), config());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = HttpServer::spawn(listener, t.app.clone(), Duration::from_secs(10));
    let mut client = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let body = streaming(5);
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(LIMIT, client.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("content-type: text/event-stream"),
        "{text}"
    );
    assert!(text.contains("data: [DONE]"), "{text}");
    server.shutdown(Duration::from_secs(5)).await;
}
