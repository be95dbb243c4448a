//! `POST /v1/embeddings` through the real router on the tiny GGUF model: every input shape,
//! float and base64 (the same vector), `dimensions` (truncated and renormalised), vectors of
//! length 1 that a batch does not change (within 1e-4), and every bad input a 400 naming it.

mod common;

use axum::http::StatusCode;
use base64::Engine as _;
use common::*;
use serde_json::{json, Value};

fn floats(v: &Value) -> Vec<f32> {
    match v {
        Value::Array(a) => a.iter().map(|x| x.as_f64().unwrap() as f32).collect(),
        Value::String(s) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        other => panic!("not an embedding: {other}"),
    }
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

async fn embed(t: &TestApp, body: Value) -> Value {
    let (status, v) = t.post_json("/v1/embeddings", &body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

#[tokio::test]
async fn vectors_are_unit_length_and_batching_changes_none() {
    let t = tiny_app(settings());
    let texts = [
        "the cat",
        "a much longer input about the thin hen and the cat",
        "x",
    ];
    let mut alone = Vec::new();
    for text in texts {
        let v = embed(&t, json!({"input": text, "model": TINY_NAME})).await;
        assert_eq!(v["object"], "list");
        assert_eq!(v["model"], TINY_NAME);
        assert_eq!(v["data"][0]["object"], "embedding");
        assert_eq!(v["data"][0]["index"], 0);
        let u = &v["usage"];
        assert!(u["prompt_tokens"].as_u64().unwrap() > 0);
        assert_eq!(u["prompt_tokens"], u["total_tokens"]);
        alone.push(floats(&v["data"][0]["embedding"]));
    }
    let batch = embed(&t, json!({"input": texts})).await;
    let data = batch["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    for (i, (entry, a)) in data.iter().zip(&alone).enumerate() {
        assert_eq!(entry["index"], i);
        let b = floats(&entry["embedding"]);
        assert!((norm(&b) - 1.0).abs() < 1e-5);
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(worst <= 1e-4, "input {i} moved by {worst} in a batch");
    }
    // base64 carries the same floats.
    let b64 = embed(&t, json!({"input": texts[0], "encoding_format": "base64"})).await;
    let decoded = floats(&b64["data"][0]["embedding"]);
    let worst = decoded
        .iter()
        .zip(&alone[0])
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(worst <= 1e-4);
}

#[tokio::test]
async fn token_ids_dimensions_and_counts() {
    let t = tiny_app(settings());
    let ids = embed(&t, json!({"input": [[104, 105], [116, 104, 101]]})).await;
    assert_eq!(ids["data"].as_array().unwrap().len(), 2);
    assert_eq!(ids["usage"]["prompt_tokens"], 5);
    let one = embed(&t, json!({"input": [104, 105]})).await;
    assert_eq!(one["data"][0]["embedding"], ids["data"][0]["embedding"]);
    let full = floats(&one["data"][0]["embedding"]);
    let short = embed(&t, json!({"input": [104, 105], "dimensions": 4})).await;
    let short = floats(&short["data"][0]["embedding"]);
    assert_eq!(short.len(), 4);
    assert!((norm(&short) - 1.0).abs() < 1e-5);
    let scale = norm(&full[..4]);
    for (s, f) in short.iter().zip(&full) {
        assert!((s - f / scale).abs() < 1e-5);
    }
}

#[tokio::test]
async fn bad_inputs_are_refused_by_name() {
    let t = tiny_app(settings());
    let size = {
        let v = embed(&t, json!({"input": "hi"})).await;
        floats(&v["data"][0]["embedding"]).len()
    };
    let long = "the cat ".repeat(600);
    for (body, param) in [
        (json!({"input": ""}), "input"),
        (json!({"input": []}), "input"),
        (json!({"input": ["a", ""]}), "input"),
        (json!({"input": [[]]}), "input"),
        (json!({"input": [1_000_000]}), "input"),
        (json!({"input": long}), "input"),
        (json!({"input": "hi", "dimensions": 0}), "dimensions"),
        (json!({"input": "hi", "dimensions": size + 1}), "dimensions"),
        (
            json!({"input": "hi", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": 5}), "input"),
    ] {
        let (status, v) = t.post_json("/v1/embeddings", &body).await;
        assert_error(status, &v, StatusCode::BAD_REQUEST, Some(param));
    }
    let (status, v) = t.post_json("/v1/embeddings", &json!({"input": long})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let (status, v) = t
        .post_json("/v1/embeddings", &json!({"input": "x", "model": "nope"}))
        .await;
    assert_error(status, &v, StatusCode::NOT_FOUND, Some("model"));
    // Nothing is left in the engine.
    let engine = t.engine();
    assert!(
        eventually(std::time::Duration::from_secs(10), || {
            let s = engine.stats();
            s.in_flight() == 0 && s.kv_blocks_used == 0
        })
        .await
    );
}
