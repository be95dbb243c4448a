//! `POST /v1/responses` and `GET /v1/responses/{id}` (OpenAI's Responses API) through the real
//! router: the response and its event stream agree, a forced function call is a
//! `function_call` item (whole and streamed), `store` and `previous_response_id` continue a
//! conversation, and what is not served is a 400 naming the field.

mod common;

use axum::http::StatusCode;
use common::*;
use serde_json::{json, Value};
use sluice_engine::EngineConfig;

fn app() -> TestApp {
    mock_app_long(settings(), EngineConfig::default())
}

fn ask(extra: Value) -> Value {
    let mut body =
        json!({"model": "mock", "input": "hi", "max_output_tokens": 8, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The events of a stream, checking names, types and sequence numbers agree.
fn events(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).unwrap();
    let events: Vec<Value> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .expect("a name");
            let data = e
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .expect("data");
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(v["type"], name);
            v
        })
        .collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    events
}

fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_response_and_its_stream_agree() {
    let t = app();
    let (status, r) = t
        .post_json("/v1/responses", &ask(json!({"instructions": "Be brief."})))
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["object"], "response");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"));
    assert!(["completed", "incomplete"].contains(&r["status"].as_str().unwrap()));
    assert_eq!(r["instructions"], "Be brief.");
    assert_eq!(
        (r["store"].as_bool(), r["truncation"].as_str()),
        (Some(true), Some("disabled"))
    );
    let u = &r["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap())
    );
    assert!(u["input_tokens_details"]["cached_tokens"].is_u64());
    if r["status"] == "incomplete" {
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(r["output"][0]["status"], "incomplete");
    }

    let (status, _, body) = t
        .post(
            "/v1/responses",
            ask(json!({"instructions": "Be brief.", "stream": true})).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let ev = events(&body);
    let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(ev[0]["response"]["status"], "in_progress");
    assert_eq!(
        types[types.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let deltas: String = ev
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap().to_string())
        .collect();
    let last = &ev[ev.len() - 1]["response"];
    assert_eq!(deltas, output_text(&r));
    assert_eq!(output_text(last), deltas);
    assert_eq!(last["status"], r["status"]);
    assert_eq!(last["usage"]["output_tokens"], r["usage"]["output_tokens"]);
    let item_id = &ev[2]["item"]["id"];
    assert_eq!(&last["output"][0]["id"], item_id);
}

#[tokio::test]
async fn a_forced_function_call_is_an_item() {
    let t = app();
    let tool = json!({"type": "function", "name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"enum": ["Rome", "Paris"]}}, "required": ["city"],
        "additionalProperties": false}});
    let body = ask(json!({"max_output_tokens": 200, "tools": [tool],
        "tool_choice": {"type": "function", "name": "get_weather"}}));
    let (status, r) = t.post_json("/v1/responses", &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let call = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("no call: {r}"));
    assert_eq!(call["name"], "get_weather");
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string());

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, _, bytes) = t.post("/v1/responses", streamed.to_string()).await;
    let ev = events(&bytes);
    let done = ev
        .iter()
        .find(|e| e["type"] == "response.function_call_arguments.done")
        .expect("arguments done");
    let pieces: String = ev
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .map(|e| e["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(done["arguments"].as_str().unwrap(), pieces);
    assert_eq!(pieces, call["arguments"].as_str().unwrap());
}

#[tokio::test]
async fn stored_responses_continue_and_read_back() {
    let t = app();
    let (_, first) = t.post_json("/v1/responses", &ask(json!({}))).await;
    let id = first["id"].as_str().unwrap();
    let (status, _, bytes) = t.get(&format!("/v1/responses/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), first);
    let (status, second) = t
        .post_json(
            "/v1/responses",
            &ask(json!({"previous_response_id": id, "input": "and?"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["previous_response_id"], id);
    let (first_in, second_in) = (
        first["usage"]["input_tokens"].as_u64().unwrap(),
        second["usage"]["input_tokens"].as_u64().unwrap(),
    );
    assert!(second_in > first_in + first["usage"]["output_tokens"].as_u64().unwrap());
    // Only a continuation's own input may be left out.
    let (status, _) = t
        .post_json(
            "/v1/responses",
            &json!({"model": "mock", "previous_response_id": id, "max_output_tokens": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    let (_, unstored) = t
        .post_json("/v1/responses", &ask(json!({"store": false})))
        .await;
    let other = unstored["id"].as_str().unwrap();
    let (status, _, _) = t.get(&format!("/v1/responses/{other}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, v) = t
        .post_json(
            "/v1/responses",
            &ask(json!({"previous_response_id": other})),
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        Some("previous_response_id"),
    );
}

#[tokio::test]
async fn unserved_or_malformed_fields_are_refused_by_name() {
    let t = app();
    for (extra, param) in [
        (json!({"input": []}), "input"),
        (
            json!({"input": [{"type": "item_reference", "id": "x"}]}),
            "input[0].type",
        ),
        (
            json!({"reasoning": {"effort": "enormous"}}),
            "reasoning.effort",
        ),
        (
            json!({"include": ["file_search_call.results"]}),
            "include[0]",
        ),
        (json!({"top_logprobs": 3}), "top_logprobs"),
        (json!({"frobnicate": true}), "frobnicate"),
        (json!({"truncation": "auto"}), "truncation"),
        (
            json!({"tools": [{"type": "custom", "name": "x"}]}),
            "tools[0].type",
        ),
        (
            json!({"tools": [{"type": "function", "name": "bad name"}]}),
            "tools[0].name",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"text": {"format": {"type": "json_schema", "schema": "{oops"}}}),
            "text.format.schema",
        ),
        (json!({"metadata": {"k": 5}}), "metadata"),
        (json!({"temperature": 3}), "temperature"),
        (json!({"max_output_tokens": 0}), "max_output_tokens"),
    ] {
        let (status, v) = t.post_json("/v1/responses", &ask(extra.clone())).await;
        assert_error(status, &v, StatusCode::BAD_REQUEST, Some(param));
    }
    let (status, v) = t
        .post_json("/v1/responses", &ask(json!({"model": "nope"})))
        .await;
    assert_error(status, &v, StatusCode::NOT_FOUND, Some("model"));
}

/// What Codex sends at its defaults (captured from `codex exec`): its reasoning, include,
/// store, cache key and metadata fields, a namespace of functions and a hosted tool, which is
/// left out and named in a header.
#[tokio::test]
async fn codexs_default_fields_are_accepted() {
    let t = app();
    let mut body = ask(json!({
        "input": [
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "You are a coding agent."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "reasoning": {"summary": "auto"},
        "store": false,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread",
        "client_metadata": {"thread_id": "thread"},
        "tools": [
            {"type": "function", "name": "exec_command", "description": "Runs a command.",
             "strict": false, "parameters": {"type": "object",
                "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
             "tools": [{"type": "function", "name": "close_agent", "description": "Close.",
                "strict": false, "parameters": {"type": "object",
                    "properties": {"target": {"type": "string"}}}}]},
            {"type": "web_search", "external_web_access": false}
        ],
    }));
    let (status, headers, bytes) = t.post("/v1/responses", body.to_string()).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
    // The mock model writes until `max_output_tokens`.
    assert_eq!(v["status"], "incomplete", "{v}");
    assert_eq!(headers["x-sluice-omitted-tools"], "web_search");
    body["stream"] = json!(true);
    let (status, headers, bytes) = t.post("/v1/responses", body.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-sluice-omitted-tools"], "web_search");
    let events = events(&bytes);
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    // A call of a namespaced function comes back with its namespace.
    let forced = ask(json!({
        "tools": [{"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
            "tools": [{"type": "function", "name": "close_agent",
                "parameters": {"type": "object", "properties": {"target": {"type": "string"}}}}]}],
        "tool_choice": {"type": "function", "name": "multi_agent_v1__close_agent"},
        "max_output_tokens": 64,
    }));
    let (status, v) = t.post_json("/v1/responses", &forced).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let call = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("a call: {v}"));
    assert_eq!(call["namespace"], "multi_agent_v1", "{call}");
    assert_eq!(call["name"], "close_agent", "{call}");
}
