//! `POST /v1/messages` (Anthropic's Messages API) through the real router: the message and its
//! event stream, a forced tool call as a `tool_use` block (whole and streamed), and every
//! error in Anthropic's shape, those of the layers around the handler included.

mod common;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use common::*;
use serde_json::{json, Value};
use sluice_engine::EngineConfig;
use sluice_server::HttpSettings;

fn app() -> TestApp {
    mock_app_long(settings(), EngineConfig::default())
}

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "model": "mock",
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}],
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Each event's name and its JSON, checking that every `data` names its own event type.
fn events(body: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).unwrap();
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
        .map(|e| {
            let mut name = None;
            let mut data = None;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str::<Value>(d).unwrap());
                }
            }
            let (name, data) = (name.expect("event name"), data.expect("event data"));
            assert_eq!(data["type"], name.as_str(), "{data}");
            (name, data)
        })
        .collect()
}

#[track_caller]
fn assert_anthropic_error(status: StatusCode, body: &Value, expected: StatusCode, kind: &str) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(body.get("param").is_none() && body["error"].get("param").is_none());
}

#[tokio::test]
async fn a_message_and_its_stream_agree() {
    let t = app();
    let (status, m) = t.post_json("/v1/messages", &ask(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{m}");
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(m["model"], "mock");
    assert_eq!(m["content"][0]["type"], "text");
    assert!(["end_turn", "max_tokens"].contains(&m["stop_reason"].as_str().unwrap()));
    let usage = &m["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0);
    assert!((1..=8).contains(&usage["output_tokens"].as_u64().unwrap()));

    let (status, _, body) = t
        .post("/v1/messages", ask(json!({"stream": true})).to_string())
        .await;
    assert_eq!(status, StatusCode::OK);
    let ev = events(&body);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let start = &ev[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert!(start["stop_reason"].is_null());
    assert_eq!(start["usage"]["input_tokens"], usage["input_tokens"]);
    let text: String = ev
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, m["content"][0]["text"].as_str().unwrap());
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], m["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"], usage["output_tokens"]);
}

#[tokio::test]
async fn a_forced_tool_call_is_a_tool_use_block() {
    let t = app();
    let tool = json!({"name": "get_weather", "description": "Weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"enum": ["Rome", "Paris"]}}, "required": ["city"], "additionalProperties": false}});
    let body = ask(json!({"max_tokens": 200, "tools": [tool],
        "tool_choice": {"type": "tool", "name": "get_weather"}}));
    let (status, m) = t.post_json("/v1/messages", &body).await;
    assert_eq!(status, StatusCode::OK, "{m}");
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let call = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use block: {m}"));
    assert_eq!(call["name"], "get_weather");
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"));
    assert!(call["input"]["city"].is_string(), "{call}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, _, bytes) = t.post("/v1/messages", streamed.to_string()).await;
    let ev = events(&bytes);
    let start = ev
        .iter()
        .find(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .expect("a tool_use block starts");
    assert_eq!(start.1["content_block"]["input"], json!({}));
    let index = &start.1["index"];
    let json_text: String = ev
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && &d["index"] == index)
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "input_json_delta");
            d["delta"]["partial_json"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&json_text).unwrap(),
        call["input"]
    );
}

#[tokio::test]
async fn tool_history_is_accepted() {
    let t = app();
    let body = ask(json!({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
            "name": "w", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
            "content": [{"type": "text", "text": "sunny"}]}]}],
        "tools": [{"name": "w", "input_schema": {"type": "object"}}],
        "system": [{"type": "text", "text": "Be brief."}]}));
    let (status, m) = t.post_json("/v1/messages", &body).await;
    assert_eq!(status, StatusCode::OK, "{m}");
}

#[tokio::test]
async fn every_error_takes_anthropics_shape() {
    let t = app();
    for (body, field) in [
        (ask(json!({"temperature": 1.5})), "temperature"),
        (ask(json!({"max_tokens": 0})), "max_tokens"),
        (ask(json!({"messages": []})), "messages"),
        (
            ask(json!({"thinking": {"type": "enabled", "budget_tokens": 2048}})),
            "thinking",
        ),
        (
            ask(
                json!({"messages": [{"role": "user", "content": [{"type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}),
            ),
            "messages[0].content",
        ),
        (
            ask(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})),
            "tools[0].type",
        ),
        (
            ask(json!({"tools": [{"name": "bad name"}]})),
            "tools[0].name",
        ),
    ] {
        let (status, v) = t.post_json("/v1/messages", &body).await;
        assert_anthropic_error(status, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{field}: {message}");
    }
    let mut no_max = ask(json!({}));
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let (status, v) = t.post_json("/v1/messages", &no_max).await;
    assert_anthropic_error(status, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens"));
    let (status, v) = t
        .post_json("/v1/messages", &ask(json!({"model": "claude"})))
        .await;
    assert_anthropic_error(status, &v, StatusCode::NOT_FOUND, "not_found_error");
    let (status, _, bytes) = t.post("/v1/messages", "{oops").await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_anthropic_error(status, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
    let (status, _, bytes) = call(&t.app, Method::GET, "/v1/messages", Body::empty(), &[]).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_anthropic_error(
        status,
        &v,
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
    );
    // Other routes keep OpenAI's shape.
    let (status, v) = t
        .post_json("/v1/chat/completions", &json!({"messages": []}))
        .await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, Some("messages"));
}

#[tokio::test]
async fn the_api_key_may_come_as_x_api_key() {
    let t = tiny_app(HttpSettings {
        api_key: Some("sk-k".into()),
        ..settings()
    });
    let body = json!({"model": TINY_NAME, "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]});
    let post = |key: &'static str| {
        let body = body.to_string();
        let app = t.app.clone();
        async move {
            call(
                &app,
                Method::POST,
                "/v1/messages",
                Body::from(body),
                &[("x-api-key", key)],
            )
            .await
        }
    };
    let (status, _, _) = post("sk-k").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, bytes) = post("sk-nope").await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_anthropic_error(status, &v, StatusCode::UNAUTHORIZED, "authentication_error");
}

/// What Claude Code sends at its defaults (captured from `claude -p`): accepted with the
/// meanings of docs/api-fields.md, whole and streamed.
#[tokio::test]
async fn claude_codes_default_fields_are_accepted() {
    let t = app();
    let mut body = ask(json!({
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "medium"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "{\"device_id\":\"d\"}"},
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]}
        ],
        "tools": [
            {"name": "Read", "description": "Reads a file.",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
            {"name": "Later", "input_schema": {"type": "object"}, "defer_loading": true}
        ],
    }));
    let (status, v) = t.post_json("/v1/messages", &body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["type"], "message");
    body["stream"] = json!(true);
    let (status, _, bytes) = t.post("/v1/messages", body.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<String> = events(&bytes).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names.last().map(String::as_str),
        Some("message_stop"),
        "{names:?}"
    );
    // What is not served is refused by name, unknown fields too.
    for (extra, field) in [
        (json!({"frobnicate": 1}), "frobnicate"),
        (
            json!({"mcp_servers": [{"url": "https://x"}]}),
            "mcp_servers",
        ),
        (
            json!({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}),
            "context_management.edits[0].type",
        ),
        (json!({"output_config": {"effort": "enormous"}}), "effort"),
    ] {
        let (status, v) = t.post_json("/v1/messages", &ask(extra)).await;
        assert_anthropic_error(status, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{field}: {message}");
    }
}

/// Past the context, under the strict policy, Anthropic's words, whose numbers Claude Code
/// reads to retry; by default the budget is lowered to what the context leaves.
#[tokio::test]
async fn a_prompt_that_does_not_fit_is_told_in_anthropics_words() {
    let (status, v) = app()
        .post_json("/v1/messages", &ask(json!({"max_tokens": 100_000_000})))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(
        ["end_turn", "max_tokens"].contains(&v["stop_reason"].as_str().unwrap()),
        "{v}"
    );
    let t = mock_app_long(
        settings(),
        EngineConfig {
            max_tokens_policy: sluice_engine::MaxTokensPolicy::Strict,
            ..EngineConfig::default()
        },
    );
    let (status, v) = t
        .post_json("/v1/messages", &ask(json!({"max_tokens": 100_000_000})))
        .await;
    assert_anthropic_error(status, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("input length and `max_tokens` exceed context limit: ")
            && message.contains(" + 100000000 > ")
            && message.ends_with(", decrease input length or `max_tokens` and try again"),
        "{message}"
    );
}

/// `count_tokens` counts the prompt `/v1/messages` renders for the same request.
#[tokio::test]
async fn count_tokens_counts_what_a_message_would_read() {
    let t = app();
    let conversation = json!({"system": "Be brief.",
        "messages": [{"role": "user", "content": "hi"}]});
    let (status, message) = t
        .post_json("/v1/messages", &ask(conversation.clone()))
        .await;
    assert_eq!(status, StatusCode::OK, "{message}");
    let mut count = conversation.clone();
    count["model"] = json!("mock");
    let (status, counted) = t.post_json("/v1/messages/count_tokens", &count).await;
    assert_eq!(status, StatusCode::OK, "{counted}");
    assert_eq!(counted["input_tokens"], message["usage"]["input_tokens"]);
    count["tools"] = json!([{"name": "Read", "input_schema": {"type": "object"}}]);
    let (_, with_tool) = t.post_json("/v1/messages/count_tokens", &count).await;
    assert!(with_tool["input_tokens"].as_u64() > counted["input_tokens"].as_u64());
    let (status, v) = t
        .post_json(
            "/v1/messages/count_tokens",
            &json!({"model": "mock", "messages": []}),
        )
        .await;
    assert_anthropic_error(status, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
}
