//! Property tests of request parsing and validation (the fuzzing of this crate; cargo-fuzz
//! would need nightly): arbitrary bytes, arbitrary JSON, and near-valid requests with
//! arbitrary values in real fields, sent through the real router on the tiny model to every
//! POST route. Each answer is a 200 or a 4xx in the route's error shape (OpenAI's, or
//! Anthropic's on `/v1/messages`), never a 5xx or a panic; a stream always ends as its API
//! ends one (`[DONE]`, `message_stop`, `response.completed`); and afterwards no sequence is
//! left in the engine.
//!
//! Case counts are small so `cargo test` stays quick; `PROPTEST_CASES=20000 cargo test
//! --release -p sluice-server --test fuzz` runs a longer campaign.

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use common::*;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Map, Number, Value};

const ROUTES: [&str; 7] = [
    "/v1/completions",
    "/v1/chat/completions",
    "/tokenize",
    "/detokenize",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
];

/// Every field the request types read, so generated objects hit real fields, not just unknown
/// ones.
const FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "echo",
    "suffix",
    "best_of",
    "user",
    "top_k",
    "min_p",
    "top_n_sigma",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "tokens",
    "add_special_tokens",
    "add_generation_prompt",
    "role",
    "content",
    "include_usage",
    "type",
    "text",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "tool_calls",
    "tool_call_id",
    "audio",
    "modalities",
    "input",
    "encoding_format",
    "dimensions",
    "instructions",
    "max_output_tokens",
    "store",
    "previous_response_id",
    "system",
    "stop_sequences",
    "output_config",
    // Image parts (chat's, the Responses API's, Anthropic's).
    "image_url",
    "url",
    "detail",
    "source",
    "media_type",
    "data",
    "file_id",
];

/// `PROPTEST_CASES` when set, else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runner(default_cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases: cases(default_cases),
        failure_persistence: None,
        ..Config::default()
    })
}

/// Numbers at and past every boundary the validators check, and some ordinary ones.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-3i64..300).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop::sample::select(vec![
            0.0f64, -0.0, 1e-9, 0.5, 1.0, 1.5, 2.0, 2.0001, -2.0, 100.0, -100.5, 1e38, 1e300,
            -1e300,
        ])
        .prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        prop::sample::select(vec![
            u64::MAX,
            u64::from(u32::MAX),
            u64::from(u32::MAX) + 1,
            i64::MAX as u64,
            128,
            129,
            20,
            21,
            16,
            17,
            262,
            261,
        ])
        .prop_map(Value::from),
    ]
}

fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z ]{0,12}",
        any::<String>(),
        prop::sample::select(vec![
            "",
            "user",
            "assistant",
            "system",
            "developer",
            "tool",
            "text",
            "image_url",
            "input_image",
            "image",
            "base64",
            "data:image/png;base64,iVBORw0KGgo=",
            "data:image/png;base64,@@",
            "data:text/plain;base64,aGk=",
            "https://example.com/a.png",
            "http://169.254.169.254/latest/meta-data/",
            "file:///etc/passwd",
            "<|im_start|>",
            "<|im_end|>",
            "<|endoftext|>",
            "\u{0}",
            "\u{fffd}",
            "🦀",
            "NaN",
            "Infinity",
            "-1",
            "1e999",
        ])
        .prop_map(String::from),
    ]
}

/// Arbitrary JSON, nested a few levels, with object keys mostly drawn from real field names.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = prop_oneof![
            3 => prop::sample::select(FIELDS).prop_map(String::from),
            1 => string(),
        ];
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(key, inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A request that is valid except for a few fields set to arbitrary values: this reaches the
/// range checks, the engine's validation and generation, not just the JSON parser.
fn near_valid() -> impl Strategy<Value = (usize, Value)> {
    let overrides = vec((prop::sample::select(FIELDS), json_value()), 0..4);
    (0..ROUTES.len(), overrides, any::<bool>()).prop_map(|(route, overrides, stream)| {
        let mut body = match ROUTES[route] {
            "/v1/completions" => json!({"prompt": "the cat", "max_tokens": 4}),
            "/v1/chat/completions" => {
                json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            }
            "/tokenize" => json!({"prompt": "the cat"}),
            "/v1/embeddings" => json!({"input": ["the cat", "the hen"]}),
            "/v1/responses" => json!({"input": "the cat", "max_output_tokens": 4}),
            "/v1/messages" => json!({"model": TINY_NAME, "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}]}),
            _ => json!({"tokens": [116, 104, 101]}),
        };
        if stream {
            body["stream"] = json!(true);
        }
        let object: &mut Map<String, Value> = body.as_object_mut().expect("an object");
        for (field, value) in overrides {
            object.insert(field.to_string(), value);
        }
        (route, body)
    })
}

/// Sends one body and checks the answer: 200 (a complete JSON body, or a stream that ends
/// with `[DONE]`) or a 4xx with OpenAI's error object.
async fn check(t: &TestApp, route: &str, body: Vec<u8>) -> Result<(), TestCaseError> {
    let shown = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    let call = call(&t.app, Method::POST, route, Body::from(body), &[]);
    let (status, headers, bytes) = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .map_err(|_| TestCaseError::fail(format!("{route} {shown}: no answer in 60 s")))?;
    let text = String::from_utf8_lossy(&bytes);
    prop_assert!(
        status == StatusCode::OK || status.is_client_error(),
        "{route} {shown}: {status} {text}"
    );
    let is_stream = headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if is_stream {
        prop_assert_eq!(status, StatusCode::OK);
        let (ends_well, failed) = match route {
            "/v1/messages" => (
                text.trim_end().lines().any(|l| l == "event: message_stop"),
                text.contains("event: error"),
            ),
            "/v1/responses" => (
                text.contains("event: response.completed"),
                text.contains("event: response.failed"),
            ),
            _ => (
                text.ends_with("data: [DONE]\n\n"),
                text.contains("\"error\""),
            ),
        };
        prop_assert!(
            ends_well,
            "{} {}: a stream that does not end as its API ends one: {}",
            route,
            shown,
            text
        );
        prop_assert!(!failed, "{route} {shown}: an error event: {text}");
        return Ok(());
    }
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| TestCaseError::fail(format!("{route} {shown}: not JSON ({e}): {text}")))?;
    if status.is_client_error() {
        // Anthropic's shape wraps the same two fields in `{"type": "error", ...}`.
        if route == "/v1/messages" {
            prop_assert!(v["type"] == "error", "{route} {shown}: {v}");
        }
        prop_assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{route} {shown}: {v}"
        );
        prop_assert!(v["error"]["type"].is_string(), "{route} {shown}: {v}");
    }
    Ok(())
}

/// Runs `strategy` through `check` on one app, then checks nothing is left running.
fn fuzz<S>(default_cases: u32, strategy: S)
where
    S: Strategy<Value = (usize, Vec<u8>)>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let t = rt.block_on(async { tiny_app(settings()) });
    let result = runner(default_cases).run(&strategy, |(route, body)| {
        rt.block_on(check(&t, ROUTES[route], body))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let engine = t.engine();
    let idle = rt.block_on(eventually(Duration::from_secs(20), || {
        let s = engine.stats();
        s.in_flight() == 0 && s.kv_blocks_used == 0
    }));
    assert!(idle, "sequences left behind: {:?}", engine.stats());
    assert_eq!(t.state.in_flight(), 0);
}

#[test]
fn arbitrary_bytes_never_get_a_5xx() {
    let bytes = prop_oneof![
        vec(any::<u8>(), 0..512),
        // Truncated JSON: a valid body cut anywhere.
        (0usize..200).prop_map(|cut| {
            let body = json!({"prompt": "a b c", "max_tokens": 3, "stop": ["x"], "n": 2,
                              "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
            .into_bytes();
            body[..cut.min(body.len())].to_vec()
        }),
    ];
    fuzz(512, (0..ROUTES.len(), bytes));
}

#[test]
fn arbitrary_json_never_gets_a_5xx() {
    let strategy = (0..ROUTES.len(), json_value())
        .prop_map(|(route, value)| (route, value.to_string().into_bytes()));
    fuzz(512, strategy);
}

/// A JSON schema built from real keywords with arbitrary values in places: reaches the
/// schema compiler, not just the request parser.
fn schema() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        prop::sample::select(vec![
            "string", "integer", "number", "boolean", "null", "object"
        ])
        .prop_map(|t| json!({ "type": t })),
        vec(string(), 1..4).prop_map(|e| json!({ "enum": e })),
        string().prop_map(|p| json!({"type": "string", "pattern": p})),
        (0u64..5, 0u64..5)
            .prop_map(|(a, b)| json!({"type": "array", "minItems": a, "maxItems": b})),
        json_value(),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            btree_map("[a-z]{1,6}", inner.clone(), 0..4).prop_map(|props| {
                let required: Vec<String> = props.keys().take(2).cloned().collect();
                json!({"type": "object", "properties": props, "required": required})
            }),
            inner
                .clone()
                .prop_map(|items| json!({"type": "array", "items": items})),
            vec(inner, 1..3).prop_map(|any| json!({ "anyOf": any })),
        ]
    })
}

/// One constraint field (or a tool list) with a plausible or arbitrary value.
fn constraint() -> impl Strategy<Value = (&'static str, Value)> {
    prop_oneof![
        schema().prop_map(|s| (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s}})
        )),
        schema().prop_map(|s| ("guided_json", s)),
        string().prop_map(|r| ("guided_regex", Value::String(r))),
        vec(string(), 0..4).prop_map(|c| ("guided_choice", json!(c))),
        string().prop_map(|g| ("guided_grammar", Value::String(format!("start: {g}")))),
        string().prop_map(|g| ("guided_grammar", Value::String(format!("root ::= {g}")))),
        (schema(), "[a-z_]{0,8}").prop_map(|(s, name)| (
            "tools",
            json!([{"type": "function", "function": {"name": name, "parameters": s}}])
        )),
        json_value().prop_map(|v| ("structured_outputs", v)),
        json_value().prop_map(|v| ("tool_choice", v)),
    ]
}

#[test]
fn constrained_requests_get_200_or_a_4xx_and_streams_finish() {
    let strategy = (
        0..2usize,
        constraint(),
        prop::option::of(prop::sample::select(vec!["required", "auto", "none"])),
        any::<bool>(),
    )
        .prop_map(|(route, (field, value), choice, stream)| {
            let mut body = if route == 0 {
                json!({"prompt": "the cat", "max_tokens": 6})
            } else {
                json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6})
            };
            body[field] = value;
            if let (Some(choice), 1) = (choice, route) {
                if field == "tools" {
                    body["tool_choice"] = json!(choice);
                }
            }
            if stream {
                body["stream"] = json!(true);
            }
            (route, body.to_string().into_bytes())
        });
    fuzz(256, strategy);
}

/// An image part (or block) of each API with arbitrary values in its fields: the URL, the
/// detail, the media type, the data; a PNG header claiming 30000x30000 pixels among them.
fn image_part() -> impl Strategy<Value = (usize, Value)> {
    let bomb = {
        let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        png.extend_from_slice(&30_000u32.to_be_bytes());
        png.extend_from_slice(&30_000u32.to_be_bytes());
        png.extend_from_slice(&[8, 2, 0, 0, 0]);
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(png)
    };
    let url = prop_oneof![
        string().prop_map(Value::String),
        Just(Value::String(format!("data:image/png;base64,{bomb}"))),
        json_value(),
    ];
    (0..3usize, url, json_value(), any::<bool>()).prop_map(move |(api, url, other, stream)| {
        let (route, mut body) = match api {
            0 => (
                1,
                json!({"max_tokens": 4, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "what?"},
                    {"type": "image_url", "image_url": {"url": url, "detail": other}}]}]}),
            ),
            1 => (
                5,
                json!({"max_output_tokens": 4, "input": [{"role": "user", "content": [
                    {"type": "input_image", "image_url": url, "detail": other}]}]}),
            ),
            _ => (
                6,
                json!({"model": TINY_NAME, "max_tokens": 4, "messages": [{"role": "user",
                    "content": [{"type": "image", "source": {"type": "base64",
                    "media_type": other, "data": url}}]}]}),
            ),
        };
        if stream {
            body["stream"] = json!(true);
        }
        (route, body)
    })
}

#[test]
fn image_parts_get_a_4xx() {
    let strategy = image_part().prop_map(|(route, v)| (route, v.to_string().into_bytes()));
    fuzz(256, strategy);
}

#[test]
fn near_valid_requests_get_200_or_a_4xx_and_streams_finish() {
    let strategy = near_valid().prop_map(|(route, v)| (route, v.to_string().into_bytes()));
    fuzz(1024, strategy);
}
