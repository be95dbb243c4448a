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
    for line in [
        "sluice_model_experts{kind=\"total\"} 8".to_string(),
        "sluice_model_experts{kind=\"per_token\"} 2".to_string(),
        format!("sluice_model_parameters{{kind=\"total\"}} {total}"),
        format!("sluice_model_parameters{{kind=\"active\"}} {active}"),
    ] {
        assert!(text.contains(&line), "{line} missing from:\n{text}");
    }
    let count = text
        .lines()
        .find_map(|l| l.strip_prefix("sluice_moe_expert_weights_read_ratio_count "))
        .unwrap_or_else(|| panic!("no expert share in:\n{text}"));
    // The prompt's step and the three decode steps after it.
    assert!(count.parse::<f64>().unwrap() >= 4.0, "{count}");
}
