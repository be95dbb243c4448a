//! The hand-kept OpenAPI document (`src/routes/service/openapi.json`, served at `/openapi.json`)
//! against the real router: the same operations both ways, every `$ref` resolving, real
//! requests answered with documented statuses, and the documented security being what the
//! router enforces. (Response bodies are validated against its schemas end to end, in
//! `tests/e2e/test_openapi.py`, which also runs schemathesis against the real binary.)

mod common;

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use common::*;
use serde_json::{json, Value};
use sluice_server::routes::route_table;
use sluice_server::routes::service::openapi::DOCUMENT;
use sluice_server::HttpSettings;

fn document() -> Value {
    serde_json::from_str(DOCUMENT).expect("openapi.json is JSON")
}

/// The document's operations as (METHOD, path).
fn documented_operations(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("a path item")
                .keys()
                .map(move |method| (method.to_ascii_uppercase(), path.clone()))
        })
        .collect()
}

fn routed_operations() -> BTreeSet<(String, String)> {
    route_table()
        .into_iter()
        .map(|(method, path)| (method.to_string(), path.to_string()))
        .collect()
}

fn operation<'a>(doc: &'a Value, method: &Method, path: &str) -> &'a Value {
    let op = &doc["paths"][path][method.as_str().to_ascii_lowercase()];
    assert!(op.is_object(), "{method} {path} is not in the document");
    op
}

/// Whether `status` is one of the operation's documented responses.
fn documented_status(op: &Value, status: StatusCode) -> bool {
    op["responses"].get(status.as_str()).is_some()
}

#[test]
fn the_document_lists_exactly_the_routers_routes() {
    let doc = document();
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "{}",
        doc["openapi"]
    );
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    let documented = documented_operations(&doc);
    let routed = routed_operations();
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        undocumented.is_empty() && unrouted.is_empty(),
        "routes missing from openapi.json: {undocumented:?}; documented but not routed: \
         {unrouted:?}"
    );
    for (method, path) in &documented {
        let op = &doc["paths"][path][method.to_ascii_lowercase()];
        assert!(
            op["operationId"].is_string(),
            "{method} {path}: operationId"
        );
        assert!(
            op["responses"].get("200").is_some(),
            "{method} {path}: no 200"
        );
    }
}

#[test]
fn every_reference_resolves() {
    fn walk(doc: &Value, node: &Value, refs: &mut usize) {
        match node {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    let pointer = target
                        .strip_prefix('#')
                        .unwrap_or_else(|| panic!("only local references: {target}"));
                    assert!(doc.pointer(pointer).is_some(), "dangling $ref {target}");
                    *refs += 1;
                }
                map.values().for_each(|v| walk(doc, v, refs));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(doc, v, refs)),
            _ => {}
        }
    }
    let doc = document();
    let mut refs = 0;
    walk(&doc, &doc, &mut refs);
    assert!(
        refs > 20,
        "only {refs} references: is the document complete?"
    );
}

#[tokio::test]
async fn the_document_is_served_at_openapi_json() {
    let t = tiny_app(settings());
    let (status, headers, body) = t.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(body, DOCUMENT.as_bytes());
}

/// POST routes that read no body (vLLM's `reset_prefix_cache`).
const BODILESS_POSTS: [&str; 1] = ["/reset_prefix_cache"];

/// vLLM's LoRA routes: served only with `--allow-runtime-lora-updating`, which the tiny app
/// lacks, so a valid body gets their documented 404 (tests/lora.rs runs them switched on).
const RUNTIME_LORA_POSTS: [&str; 2] = ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"];

/// `POST /models/unload`: the tiny app's engine is the test's own (it shuts it down), not the
/// server's to stop, so a valid body gets the documented 503 (tests/e2e/test_multi_model.py
/// unloads for real).
const TEST_ENGINE_POSTS: [&str; 1] = ["/models/unload"];

/// A body the route accepts (200), for every POST route that reads one.
fn valid_body(path: &str) -> Value {
    match path {
        "/v1/completions" | "/v1/completions/render" => json!({"prompt": "hi", "max_tokens": 2}),
        "/v1/chat/completions" | "/v1/chat/completions/render" => {
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        }
        "/v1/messages" => json!({"model": TINY_NAME, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]}),
        "/v1/messages/count_tokens" => json!({"model": TINY_NAME,
            "messages": [{"role": "user", "content": "hi"}]}),
        "/v1/responses" => json!({"input": "hi", "max_output_tokens": 2}),
        "/v1/embeddings" => json!({"input": "hi"}),
        "/tokenize" => json!({"prompt": "hi"}),
        "/detokenize" => json!({"tokens": [104, 105]}),
        "/v1/load_lora_adapter" => json!({"lora_name": "x", "lora_path": "/none"}),
        "/v1/unload_lora_adapter" => json!({"lora_name": "x"}),
        "/models/load" | "/models/unload" => json!({"model": TINY_NAME}),
        other => panic!("no valid body known for POST {other}: add one"),
    }
}

#[tokio::test]
async fn every_operation_answers_with_a_documented_status() {
    let doc = document();
    let t = tiny_app(settings());
    // A stored response for `GET /v1/responses/{response_id}` to find.
    let (_, stored) = t
        .post_json("/v1/responses", &valid_body("/v1/responses"))
        .await;
    let response_id = stored["id"]
        .as_str()
        .expect("a stored response")
        .to_string();
    for (method, path) in route_table() {
        let op = operation(&doc, &method, path);
        let concrete = path
            .replace("{model}", TINY_NAME)
            .replace("{response_id}", &response_id);
        let mut cases: Vec<(String, Body, StatusCode)> = Vec::new();
        if method == Method::POST && BODILESS_POSTS.contains(&path) {
            cases.push((concrete.clone(), Body::empty(), StatusCode::OK));
        } else if method == Method::POST && RUNTIME_LORA_POSTS.contains(&path) {
            cases.push((
                concrete.clone(),
                Body::from(valid_body(path).to_string()),
                StatusCode::NOT_FOUND,
            ));
            cases.push((concrete.clone(), Body::from("{"), StatusCode::BAD_REQUEST));
        } else if method == Method::POST {
            let accepted = if TEST_ENGINE_POSTS.contains(&path) {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            };
            cases.push((
                concrete.clone(),
                Body::from(valid_body(path).to_string()),
                accepted,
            ));
            cases.push((concrete.clone(), Body::from("{"), StatusCode::BAD_REQUEST));
            let mut unknown_model = valid_body(path);
            unknown_model["model"] = json!("no-such-model");
            cases.push((
                concrete.clone(),
                Body::from(unknown_model.to_string()),
                StatusCode::NOT_FOUND,
            ));
        } else {
            cases.push((concrete.clone(), Body::empty(), StatusCode::OK));
            if path.contains("{model}") || path.contains("{response_id}") {
                cases.push((
                    path.replace("{model}", "no-such-model")
                        .replace("{response_id}", "resp_none"),
                    Body::empty(),
                    StatusCode::NOT_FOUND,
                ));
            }
        }
        for (uri, body, expected) in cases {
            let (status, _, bytes) = call(&t.app, method.clone(), &uri, body, &[]).await;
            assert_eq!(
                status,
                expected,
                "{method} {uri}: {}",
                String::from_utf8_lossy(&bytes)
            );
            assert!(
                documented_status(op, status),
                "{method} {path} answered {status}, which openapi.json does not document"
            );
        }
    }
}

#[tokio::test]
async fn the_documented_security_is_what_the_router_enforces() {
    let doc = document();
    let t = tiny_app(HttpSettings {
        api_key: Some("sk-doc".into()),
        metrics_require_key: true,
        ..settings()
    });
    for (method, path) in route_table() {
        let op = operation(&doc, &method, path);
        let keyed = op["security"]
            .as_array()
            .is_some_and(|s| s.iter().any(|r| r.get("apiKey").is_some()));
        let uri = path.replace("{model}", TINY_NAME);
        let body = if method == Method::POST && !BODILESS_POSTS.contains(&path) {
            Body::from(valid_body(path).to_string())
        } else {
            Body::empty()
        };
        let (status, _, _) = call(&t.app, method.clone(), &uri, body, &[]).await;
        if keyed {
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}");
            assert!(documented_status(op, status), "{method} {path}: 401");
        } else {
            assert_eq!(
                status,
                StatusCode::OK,
                "{method} {path} is documented as open"
            );
        }
    }
}
