//! Every way a request can be wrong gets the right status and OpenAI's error shape with
//! `param` set, and nothing a client sends gets a 5xx.

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use common::*;
use serde_json::{json, Value};
use sluice_engine::{EngineConfig, MaxTokensPolicy};
use sluice_server::HttpSettings;

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn completion(extra: Value) -> Value {
    let mut body = json!({"prompt": "hi", "max_tokens": 4});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test]
async fn invalid_parameters_are_400_naming_the_param() {
    let t = tiny_app(settings());
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        ("/v1/completions", completion(json!({"n": 0})), Some("n")),
        (
            "/v1/completions",
            completion(json!({"n": 10000})),
            Some("n"),
        ),
        ("/v1/completions", completion(json!({"n": -1})), Some("n")),
        (
            "/v1/completions",
            completion(json!({"max_tokens": 0})),
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            completion(json!({"max_tokens": -5})),
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            completion(json!({"temperature": 2.5})),
            Some("temperature"),
        ),
        (
            "/v1/completions",
            completion(json!({"temperature": -1})),
            Some("temperature"),
        ),
        (
            "/v1/completions",
            completion(json!({"temperature": "hot"})),
            Some("temperature"),
        ),
        (
            "/v1/completions",
            completion(json!({"top_p": 0})),
            Some("top_p"),
        ),
        (
            "/v1/completions",
            completion(json!({"top_p": 1.5})),
            Some("top_p"),
        ),
        (
            "/v1/completions",
            completion(json!({"top_k": -7})),
            Some("top_k"),
        ),
        (
            "/v1/completions",
            completion(json!({"min_p": 2})),
            Some("min_p"),
        ),
        (
            "/v1/completions",
            completion(json!({"top_n_sigma": -0.5})),
            Some("top_n_sigma"),
        ),
        (
            "/v1/completions",
            completion(json!({"top_n_sigma": 101})),
            Some("top_n_sigma"),
        ),
        (
            "/v1/completions",
            completion(json!({"presence_penalty": 9})),
            Some("presence_penalty"),
        ),
        (
            "/v1/completions",
            completion(json!({"frequency_penalty": -9})),
            Some("frequency_penalty"),
        ),
        (
            "/v1/completions",
            completion(json!({"repetition_penalty": 0})),
            Some("repetition_penalty"),
        ),
        (
            "/v1/completions",
            completion(json!({"logit_bias": {"x": 1}})),
            Some("logit_bias"),
        ),
        (
            "/v1/completions",
            completion(json!({"logit_bias": {"1": 500}})),
            Some("logit_bias"),
        ),
        (
            "/v1/completions",
            completion(json!({"logit_bias": {"99999": 1}})),
            Some("logit_bias"),
        ),
        (
            "/v1/completions",
            completion(json!({"logprobs": 50})),
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            completion(json!({"echo": true, "logprobs": 1})),
            Some("echo"),
        ),
        (
            "/v1/completions",
            completion(json!({"suffix": "x"})),
            Some("suffix"),
        ),
        (
            "/v1/completions",
            completion(json!({"best_of": 3})),
            Some("best_of"),
        ),
        (
            "/v1/completions",
            completion(json!({"stop": vec!["a"; 17]})),
            Some("stop"),
        ),
        (
            "/v1/completions",
            completion(json!({"stop": [""]})),
            Some("stop"),
        ),
        (
            "/v1/completions",
            completion(json!({"stop": 5})),
            Some("stop"),
        ),
        (
            "/v1/completions",
            completion(json!({"stop_token_ids": [100000]})),
            Some("stop_token_ids"),
        ),
        (
            "/v1/completions",
            completion(json!({"stop_token_ids": [-1]})),
            Some("stop_token_ids[0]"),
        ),
        (
            "/v1/completions",
            completion(json!({"min_tokens": 10})),
            Some("min_tokens"),
        ),
        (
            "/v1/completions",
            completion(json!({"seed": 1.5})),
            Some("seed"),
        ),
        (
            "/v1/completions",
            completion(json!({"stream": "yes"})),
            Some("stream"),
        ),
        (
            "/v1/completions",
            completion(json!({"prompt": ""})),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            completion(json!({"prompt": []})),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            completion(json!({"prompt": [[]]})),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            completion(json!({"prompt": [1, 99999]})),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            completion(json!({"prompt": [1, -3]})),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            completion(json!({"prompt": {"a": 1}})),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            completion(json!({"prompt": null})),
            Some("prompt"),
        ),
        ("/v1/completions", json!({"max_tokens": 3}), Some("prompt")),
        (
            "/v1/chat/completions",
            chat(json!({"messages": []})),
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"max_tokens": 3}),
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": "hi"})),
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "wizard", "content": "x"}]})),
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"content": "x"}]})),
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user", "content": {"a": [[[]]]}}]})),
            Some("messages[0].content"),
        ),
        (
            "/v1/chat/completions",
            // An image part without its `image_url`: the part itself is named.
            chat(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
            Some("messages[0].content[0]"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_completion_tokens": 0})),
            Some("max_completion_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_logprobs": 3})),
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 21})),
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": "true"})),
            Some("logprobs"),
        ),
        ("/v1/chat/completions", chat(json!({"n": 0})), Some("n")),
        ("/tokenize", json!({}), Some("prompt")),
        (
            "/tokenize",
            json!({"prompt": "a", "messages": []}),
            Some("messages"),
        ),
        (
            "/detokenize",
            json!({"tokens": [1, 123456]}),
            Some("tokens[1]"),
        ),
        ("/detokenize", json!({"tokens": "abc"}), Some("tokens")),
    ];
    for (path, body, param) in cases {
        let (status, v) = t.post_json(path, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {v}");
        assert_error(status, &v, StatusCode::BAD_REQUEST, param);
    }
}

#[tokio::test]
async fn an_unknown_model_is_404_model_not_found() {
    let t = tiny_app(settings());
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let (status, v) = t
            .post_json(path, &chat(json!({"prompt": "x", "model": "gpt-4"})))
            .await;
        assert_error(status, &v, StatusCode::NOT_FOUND, Some("model"));
        assert_eq!(v["error"]["code"], "model_not_found");
    }
    let (status, _, _) = t.get("/v1/models/gpt-4").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Under the default policy a budget past the context is lowered to what is left: the answer
/// runs to the context's end and says `length`.
#[tokio::test]
async fn prompt_plus_max_tokens_past_the_context_is_clamped_by_default() {
    let t = mock_app(settings(), EngineConfig::default());
    for max_tokens in [600, usize::MAX] {
        let (status, v) = t
            .post_json(
                "/v1/chat/completions",
                &chat(json!({"max_tokens": max_tokens, "ignore_eos": true})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
        let usage = &v["usage"];
        assert_eq!(
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap(),
            512,
            "{v}"
        );
    }
}

#[tokio::test]
async fn prompt_plus_max_tokens_past_the_context_is_refused_with_openais_message_when_strict() {
    let t = mock_app(
        settings(),
        EngineConfig {
            max_tokens_policy: MaxTokensPolicy::Strict,
            ..EngineConfig::default()
        },
    );
    let (status, v) = t
        .post_json("/v1/chat/completions", &chat(json!({"max_tokens": 600})))
        .await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, Some("messages"));
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "This model's maximum context length is 512 tokens. However, you requested"
        ),
        "{message}"
    );
    assert!(
        message.contains("in the messages, 600 in the completion"),
        "{message}"
    );
    assert_eq!(v["error"]["code"], "context_length_exceeded");

    let long = "a ".repeat(600);
    let (status, v) = t
        .post_json("/v1/completions", &json!({"prompt": long, "max_tokens": 1}))
        .await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, Some("prompt"));
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("maximum context length is 512"));
    // Without max_tokens, chat fills what is left of the context: a too-long prompt alone
    // is still refused.
    let (status, v) = t
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": long}]}),
        )
        .await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, Some("messages"));
    let (status, v) = t
        .post_json(
            "/v1/completions",
            &json!({"prompt": "x", "max_tokens": u64::MAX}),
        )
        .await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, Some("prompt"));
}

#[tokio::test]
async fn malformed_json_is_400_without_param() {
    let t = tiny_app(settings());
    for body in [
        &b"{"[..],
        b"{\"prompt\": \"a\",",
        b"not json",
        b"",
        b"{\"prompt\": \"a\"} {}",
        b"{\"prompt\": \"\xff\xfe\"}",
        b"{\"prompt\": \"\\ud800\"}",
        b"{\"prompt\": \"a\", \"max_tokens\": 1e999}",
    ] {
        let (status, _, bytes) = t.post("/v1/completions", body.to_vec()).await;
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{:?}: {v}",
            String::from_utf8_lossy(body)
        );
        assert!(v["error"]["message"].is_string());
    }
}

/// Odd, hostile or broken bodies on every POST route: never a 5xx, never a panic, and any
/// error is in OpenAI's shape.
#[tokio::test]
async fn a_malformed_input_corpus_never_gets_a_5xx() {
    let t = tiny_app(settings());
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let stops: Vec<String> = (0..10_000).map(|i| format!("s{i}")).collect();
    let mut bodies: Vec<Vec<u8>> = vec![
        b"null".to_vec(),
        b"[]".to_vec(),
        b"\"prompt\"".to_vec(),
        b"123".to_vec(),
        b"{\"prompt\": \"x\", \"n\": 1e300}".to_vec(),
        b"{\"prompt\": \"x\", \"n\": 18446744073709551616}".to_vec(),
        b"{\"prompt\": \"x\", \"max_tokens\": 18446744073709551615}".to_vec(),
        b"{\"prompt\": \"x\", \"temperature\": \"NaN\"}".to_vec(),
        b"{\"prompt\": \"x\", \"temperature\": NaN}".to_vec(),
        b"{\"prompt\": \"x\", \"temperature\": Infinity}".to_vec(),
        b"{\"prompt\": \"x\", \"temperature\": 1e39}".to_vec(),
        b"{\"prompt\": \"x\", \"top_p\": -0.0}".to_vec(),
        b"{\"prompt\": \"x\", \"seed\": -9223372036854775808}".to_vec(),
        b"{\"prompt\": \"x\", \"seed\": 99999999999999999999999}".to_vec(),
        b"{\"prompt\": [4294967295]}".to_vec(),
        b"{\"prompt\": [[4294967296]]}".to_vec(),
        b"{\"prompt\": \"x\", \"logit_bias\": {\"-1\": 1}}".to_vec(),
        b"{\"prompt\": \"x\", \"logit_bias\": {\"1\": \"a\"}}".to_vec(),
        b"{\"prompt\": \"x\", \"stream_options\": 5}".to_vec(),
        b"{\"prompt\": \"x\", \"unknown_field\": {\"nested\": [1, 2, {}]}, \"max_tokens\": 1}"
            .to_vec(),
        b"{\"prompt\": \"\\u0000\\u0001\", \"max_tokens\": 1}".to_vec(),
        b"{\"prompt\": \"<|im_start|><|im_end|><|endoftext|>\", \"max_tokens\": 1}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": null}], \"max_tokens\": 1}".to_vec(),
        b"{\"messages\": [{\"role\": \"assistant\"}], \"max_tokens\": 1}".to_vec(),
        b"{\"messages\": [{\"role\": 5, \"content\": \"x\"}]}".to_vec(),
        b"{\"messages\": [[[[[{}]]]]]}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 7}]}]}"
            .to_vec(),
        b"{\"messages\": {\"role\": \"user\"}}".to_vec(),
        b"{\"tokens\": [[1]]}".to_vec(),
        b"{\"tokens\": [1.5]}".to_vec(),
        format!("{{\"prompt\": {deep}}}").into_bytes(),
        deep.into_bytes(),
        json!({"prompt": "x", "stop": stops})
            .to_string()
            .into_bytes(),
        json!({"messages": [{"role": "user", "content": "x"}], "stop": stops})
            .to_string()
            .into_bytes(),
        json!({"prompt": "x", "stop": ["a".repeat(100_000)]})
            .to_string()
            .into_bytes(),
        json!({"prompt": (0..5000).map(|i| i % 300).collect::<Vec<_>>(), "max_tokens": 1})
            .to_string()
            .into_bytes(),
        json!({"prompt": vec!["x"; 300], "n": 128, "max_tokens": 1})
            .to_string()
            .into_bytes(),
        json!({"prompt": "x", "n": 128, "max_tokens": 1, "stream": true})
            .to_string()
            .into_bytes(),
    ];
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    bodies.push(garbage);
    for path in [
        "/v1/completions",
        "/v1/chat/completions",
        "/tokenize",
        "/detokenize",
    ] {
        for body in &bodies {
            let (status, _, bytes) = t.post(path, body.clone()).await;
            let shown = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
            assert!(
                !status.is_server_error(),
                "{path} {shown}: {status} {bytes:?}"
            );
            if status.is_client_error() {
                let v: Value = serde_json::from_slice(&bytes)
                    .unwrap_or_else(|e| panic!("{path} {shown}: error body is not JSON: {e}"));
                assert!(v["error"]["message"].is_string(), "{path} {shown}: {v}");
            }
        }
    }
    // Still serving.
    let (status, _, _) = t.get("/health").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn unknown_routes_and_methods_get_json_errors() {
    let t = tiny_app(settings());
    let (status, _, body) = t.get("/v1/nope").await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_error(status, &v, StatusCode::NOT_FOUND, None);
    let (status, _, body) = t.get("/v1/completions").await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_error(status, &v, StatusCode::METHOD_NOT_ALLOWED, None);
    let (status, _, body) = call(&t.app, Method::DELETE, "/health", Body::empty(), &[]).await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_error(status, &v, StatusCode::METHOD_NOT_ALLOWED, None);
}

#[tokio::test]
async fn an_api_key_guards_the_api_but_not_health_metrics_or_version() {
    let t = tiny_app(HttpSettings {
        api_key: Some("sk-test".into()),
        ..settings()
    });
    let protected = [
        (Method::GET, "/v1/models", String::new()),
        (
            Method::POST,
            "/v1/completions",
            completion(json!({})).to_string(),
        ),
        (
            Method::POST,
            "/v1/chat/completions",
            chat(json!({})).to_string(),
        ),
        (
            Method::POST,
            "/tokenize",
            json!({"prompt": "a"}).to_string(),
        ),
        (
            Method::POST,
            "/detokenize",
            json!({"tokens": [1]}).to_string(),
        ),
    ];
    for (method, path, body) in &protected {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("sk-test"),
            Some("Bearer sk-test-longer"),
        ] {
            let headers: Vec<(&str, &str)> =
                auth.map(|a| ("authorization", a)).into_iter().collect();
            let (status, _, bytes) = call(
                &t.app,
                method.clone(),
                path,
                Body::from(body.clone()),
                &headers,
            )
            .await;
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            assert_error(status, &v, StatusCode::UNAUTHORIZED, None);
            assert_eq!(v["error"]["code"], "invalid_api_key");
        }
        let headers = [("authorization", "Bearer sk-test")];
        let (status, _, bytes) = call(
            &t.app,
            method.clone(),
            path,
            Body::from(body.clone()),
            &headers,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{path}: {bytes:?}");
    }
    for path in ["/health", "/metrics", "/version", "/openapi.json"] {
        let (status, _, _) = t.get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn metrics_require_key_puts_metrics_behind_the_key_too() {
    let t = tiny_app(HttpSettings {
        api_key: Some("sk-test".into()),
        metrics_require_key: true,
        ..settings()
    });
    for auth in [None, Some("Bearer wrong")] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        let (status, _, bytes) =
            call(&t.app, Method::GET, "/metrics", Body::empty(), &headers).await;
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_error(status, &v, StatusCode::UNAUTHORIZED, None);
    }
    let headers = [("authorization", "Bearer sk-test")];
    let (status, _, body) = call(&t.app, Method::GET, "/metrics", Body::empty(), &headers).await;
    assert_eq!(status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&body).contains("sluice_"));
    // Probes and the API description stay open.
    for path in ["/health", "/version", "/openapi.json"] {
        let (status, _, _) = t.get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn bodies_over_the_limit_are_413() {
    let t = tiny_app(HttpSettings {
        body_limit: 1024,
        ..settings()
    });
    let big = json!({"prompt": "x".repeat(4096)}).to_string();
    let (status, _, bytes) = t.post("/v1/completions", big.clone()).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_error(status, &v, StatusCode::PAYLOAD_TOO_LARGE, None);
    // Without a Content-Length (chunked), the limit applies while reading.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .into_bytes()
        .chunks(100)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let body = Body::from_stream(futures_util::stream::iter(chunks));
    let (status, _, bytes) = call(&t.app, Method::POST, "/v1/completions", body, &[]).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_error(status, &v, StatusCode::PAYLOAD_TOO_LARGE, None);
    // A body under the limit still works.
    let (status, _) = t.post_json("/v1/completions", &completion(json!({}))).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_body_that_stalls_is_408() {
    let t = tiny_app(HttpSettings {
        body_timeout: Duration::from_millis(200),
        ..settings()
    });
    let first: Result<Vec<u8>, std::io::Error> = Ok(b"{\"prompt\": ".to_vec());
    let stalled = futures_util::stream::iter([first]).chain(futures_util::stream::pending());
    let body = Body::from_stream(stalled);
    let (status, _, bytes) = call(&t.app, Method::POST, "/v1/completions", body, &[]).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_error(status, &v, StatusCode::REQUEST_TIMEOUT, None);
}

use futures_util::StreamExt as _;

#[tokio::test]
async fn cors_is_off_by_default_and_answers_allowed_origins_when_on() {
    let t = tiny_app(settings());
    let preflight = [
        ("origin", "http://app.example"),
        ("access-control-request-method", "POST"),
    ];
    let (_, headers, _) = call(
        &t.app,
        Method::OPTIONS,
        "/v1/completions",
        Body::empty(),
        &preflight,
    )
    .await;
    assert!(headers.get("access-control-allow-origin").is_none());

    let t = tiny_app(HttpSettings {
        cors_origins: vec!["http://app.example".into()],
        api_key: Some("k".into()),
        ..settings()
    });
    let (status, headers, _) = call(
        &t.app,
        Method::OPTIONS,
        "/v1/completions",
        Body::empty(),
        &preflight,
    )
    .await;
    assert!(status.is_success(), "{status}");
    assert_eq!(headers["access-control-allow-origin"], "http://app.example");
    let (_, headers, _) = call(
        &t.app,
        Method::OPTIONS,
        "/v1/completions",
        Body::empty(),
        &[
            ("origin", "http://evil.example"),
            ("access-control-request-method", "POST"),
        ],
    )
    .await;
    assert!(headers.get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn while_loading_health_and_the_api_are_503() {
    let metrics = sluice_server::observe::metrics::install();
    let state = sluice_server::AppState::new(Duration::from_secs(5), metrics);
    let app = sluice_server::router(state, &settings());
    let (status, _, _) = call(&app, Method::GET, "/health", Body::empty(), &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _, _) = call(&app, Method::GET, "/metrics", Body::empty(), &[]).await;
    assert_eq!(status, StatusCode::OK);
    for (method, path, body) in [
        (Method::GET, "/v1/models", String::new()),
        (
            Method::POST,
            "/v1/completions",
            completion(json!({})).to_string(),
        ),
        (
            Method::POST,
            "/tokenize",
            json!({"prompt": "a"}).to_string(),
        ),
    ] {
        let (status, _, bytes) = call(&app, method, path, Body::from(body), &[]).await;
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_error(status, &v, StatusCode::SERVICE_UNAVAILABLE, None);
    }
}
