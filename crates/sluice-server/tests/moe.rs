//! A mixture of experts served through the real loading path (a tiny qwen3moe GGUF file):
//! `/v1/models` and `/metrics` say what it is, and a completion's steps record the share of
//! the experts' weights they read. Its own test binary: the metrics recorder is one per
//! process, and the dense model of the other tests would overwrite the model's gauges.

mod common;

use axum::http::StatusCode;
use serde_json::json;
use sluice_model::testing::{TinyModelSpec, TinyMoe};
use sluice_model::Architecture;

use common::{settings, tiny_app_of};

#[tokio::test]
async fn a_mixture_says_what_it_is_on_models_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinyModelSpec {
        architecture: Architecture::Qwen3Moe,
        moe: Some(TinyMoe::new(Architecture::Qwen3Moe, 8, 2, 32)),
        ..TinyModelSpec::default()
    };
    let t = tiny_app_of(settings(), &spec, dir.path());
    let (status, v) = t
        .post_json(
            "/v1/completions",
            &json!({"prompt": "experts", "max_tokens": 4, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4);

    let (status, _, body) = t.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let card = &v["data"][0];
    assert_eq!(card["architecture"], "qwen3moe");
    assert_eq!(
        card["mixture_of_experts"],
        json!({"experts": 8, "experts_per_token": 2})
    );
    let (total, active) = (
        card["parameters"].as_u64().unwrap(),
        card["active_parameters"].as_u64().unwrap(),
    );
    // Each layer runs 2 of its 8 experts of 3 * 64 * 32 weights.
    assert_eq!(total - active, 2 * 6 * 3 * 64 * 32, "{card}");

    let (status, _, body) = t.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body.to_vec()).unwrap();
    // A series' value by its name and one of its labels (each also carries `model`).
    let value = |name: &str, label: &str| -> String {
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{model=")) && l.contains(label))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("no {name} {label} in:\n{text}"))
            .to_string()
    };
    assert_eq!(value("sluice_model_experts", "kind=\"total\""), "8");
    assert_eq!(value("sluice_model_experts", "kind=\"per_token\""), "2");
    assert_eq!(
        value("sluice_model_parameters", "kind=\"total\""),
        total.to_string()
    );
    assert_eq!(
        value("sluice_model_parameters", "kind=\"active\""),
        active.to_string()
    );
    let count = value("sluice_moe_expert_weights_read_ratio_count", "");
    // The prompt's step and the three decode steps after it.
    assert!(count.parse::<f64>().unwrap() >= 4.0, "{count}");
}
