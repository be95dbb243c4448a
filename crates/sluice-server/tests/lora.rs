//! LoRA adapters through the real router on the tiny GGUF model, as `sluice serve` runs them
//! with `--lora-modules`, `--max-loras` and `--allow-runtime-lora-updating`: `/v1/models` lists
//! each adapter under its base; `model` picks an adapter on chat, completions, Responses,
//! Messages and embeddings, and an unknown name is a 404 in each API's own error shape;
//! requests over three adapters and the base, sent together with two adapter slots, answer
//! what each answers alone; adapters load and unload while the server runs, a bad one is a 400
//! naming the problem, and the server goes on serving.

mod common;

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use common::*;
use serde_json::{json, Value};
use sluice_model::testing::TinyLoraSpec;
use sluice_model::{LlamaModel, LoadOptions, LoraProjection};
use sluice_server::engine::load::LoraSettings;

/// A random rank-`rank` adapter of the tiny model, on every projection, strong enough to move
/// its greedy tokens: `adapter-SEED.gguf` in `dir`.
fn write_adapter(dir: &Path, seed: u64, rank: usize) -> PathBuf {
    let config = LlamaModel::load(tiny_model_path(), &LoadOptions::default())
        .unwrap()
        .config()
        .clone();
    let path = dir.join(format!("adapter-{seed}-r{rank}.gguf"));
    TinyLoraSpec {
        rank,
        alpha: 32.0 * rank as f32,
        targets: LoraProjection::ALL.to_vec(),
        seed,
    }
    .write_gguf(&config, &path)
    .unwrap();
    path
}

fn lora_app(dir: &Path, runtime_updates: bool) -> TestApp {
    let modules = (1..=3)
        .map(|i| (format!("lora-{i}"), write_adapter(dir, i, 8)))
        .collect();
    tiny_app_with_lora(
        settings(),
        LoraSettings {
            modules,
            max_rank: 16,
            runtime_updates,
        },
        2,
    )
}

async fn complete(t: &TestApp, model: &str, prompt: &str) -> String {
    let (status, v) = t
        .post_json(
            "/v1/completions",
            &json!({"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                    "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn models_lists_each_adapter_under_its_base() {
    let dir = tempfile::tempdir().unwrap();
    let t = lora_app(dir.path(), false);
    let (status, v) = t.get_json("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    let data = v["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [TINY_NAME, "lora-1", "lora-2", "lora-3"]);
    assert_eq!(data[0]["parent"], Value::Null);
    for m in &data[1..] {
        assert_eq!(m["parent"], TINY_NAME);
        assert!(m["root"].as_str().unwrap().ends_with(".gguf"), "{m}");
        assert!(
            !m["root"].as_str().unwrap().contains('/'),
            "no host path: {m}"
        );
    }
    let (status, v) = t.get_json("/v1/models/lora-2").await;
    assert_eq!(
        (status, v["parent"].as_str()),
        (StatusCode::OK, Some(TINY_NAME))
    );
    // The inference extension's LoRA-affinity scorer reads this gauge.
    complete(&t, "lora-1", "hi").await;
    let (_, _, metrics) = t.get("/metrics").await;
    let metrics = String::from_utf8(metrics.to_vec()).unwrap();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("vllm:lora_requests_info{"))
        .unwrap_or_else(|| panic!("no vllm:lora_requests_info in {metrics}"));
    for label in [
        "max_lora=\"2\"",
        "running_lora_adapters=\"\"",
        "waiting_lora_adapters=\"\"",
    ] {
        assert!(line.contains(label), "{label} in {line}");
    }
}

#[tokio::test]
async fn the_model_field_picks_an_adapter_on_every_api() {
    let dir = tempfile::tempdir().unwrap();
    let t = lora_app(dir.path(), false);
    let base = complete(&t, TINY_NAME, "the thin hen").await;
    let adapted = complete(&t, "lora-1", "the thin hen").await;
    assert_ne!(base, adapted, "the adapter changes the answer");
    assert_eq!(complete(&t, "lora-1", "the thin hen").await, adapted);

    let chat = |model: &str| {
        json!({"model": model, "messages": [{"role": "user", "content": "hi"}],
               "max_tokens": 6, "temperature": 0})
    };
    let (status, v) = t.post_json("/v1/chat/completions", &chat("lora-2")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["model"], "lora-2");
    let (status, v) = t
        .post_json(
            "/v1/responses",
            &json!({"model": "lora-3", "input": "hi", "max_output_tokens": 6, "temperature": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["model"], "lora-3");
    let messages = |model: &str| {
        json!({"model": model, "max_tokens": 6,
               "messages": [{"role": "user", "content": "hi"}]})
    };
    let (status, v) = t.post_json("/v1/messages", &messages("lora-1")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["model"], "lora-1");
    let embed = |model: &str| json!({"model": model, "input": "the thin hen"});
    let (status, e_base) = t.post_json("/v1/embeddings", &embed(TINY_NAME)).await;
    assert_eq!(status, StatusCode::OK, "{e_base}");
    let (status, e_lora) = t.post_json("/v1/embeddings", &embed("lora-1")).await;
    assert_eq!(status, StatusCode::OK, "{e_lora}");
    assert_eq!(e_lora["model"], "lora-1");
    assert_ne!(
        e_base["data"][0]["embedding"],
        e_lora["data"][0]["embedding"]
    );

    // Unknown names: OpenAI's 404 on the OpenAI routes, Anthropic's on Messages.
    let (status, v) = t.post_json("/v1/chat/completions", &chat("lora-9")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    let (status, v) = t.post_json("/v1/messages", &messages("lora-9")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
}

#[tokio::test]
async fn mixed_adapters_answer_what_each_answers_alone() {
    let dir = tempfile::tempdir().unwrap();
    let t = lora_app(dir.path(), false);
    let models = [TINY_NAME, "lora-1", "lora-2", "lora-3"];
    let jobs: Vec<(String, String)> = (0..16)
        .map(|i| {
            (
                models[i % 4].to_string(),
                format!("the thin hen {} and the cat", "a".repeat(i % 5)),
            )
        })
        .collect();
    let mut alone = Vec::new();
    for (model, prompt) in &jobs {
        alone.push(complete(&t, model, prompt).await);
    }
    let together = futures_util::future::join_all(
        jobs.iter()
            .map(|(model, prompt)| complete(&t, model, prompt)),
    )
    .await;
    assert_eq!(alone, together);
}

#[tokio::test]
async fn adapters_load_and_unload_while_serving_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Without the switch the routes are not served.
    let closed = lora_app(dir.path(), false);
    let load = |name: &str, path: &Path| json!({"lora_name": name, "lora_path": path});
    let (status, _, _) = closed
        .post(
            "/v1/load_lora_adapter",
            load("x", &dir.path().join("none")).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let t = lora_app(dir.path(), true);
    let extra = write_adapter(dir.path(), 7, 8);
    let (status, _, body) = t
        .post("/v1/load_lora_adapter", load("late", &extra).to_string())
        .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let late = complete(&t, "late", "the thin hen").await;
    assert_ne!(late, complete(&t, TINY_NAME, "the thin hen").await);
    let (status, v) = t
        .post_json("/v1/load_lora_adapter", &load("late", &extra))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "loaded twice: {v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("load_inplace"), "{message}");

    // In place: the name serves the new weights, as the same file does under a name of its
    // own; nothing the old weights computed (their cached prefix) is reused.
    let other = write_adapter(dir.path(), 9, 8);
    let mut in_place = load("late", &other);
    in_place["load_inplace"] = json!(true);
    for body in [in_place, load("other", &other)] {
        let (status, _, text) = t.post("/v1/load_lora_adapter", body.to_string()).await;
        let text = String::from_utf8_lossy(&text);
        assert_eq!(status, StatusCode::OK, "{text}");
    }
    let replaced = complete(&t, "late", "the thin hen").await;
    assert_ne!(replaced, late);
    assert_eq!(replaced, complete(&t, "other", "the thin hen").await);

    // Bad adapters: each refused naming its problem, and the server still answers.
    let too_big = write_adapter(dir.path(), 8, 32);
    let missing = dir.path().join("missing.gguf");
    let not_lora = tiny_model_path();
    for (path, words) in [
        (too_big.as_path(), "rank"),
        (missing.as_path(), "missing.gguf"),
        (not_lora.as_path(), "adapter"),
    ] {
        let (status, v) = t
            .post_json("/v1/load_lora_adapter", &load("bad", path))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{words}: {message}");
        assert_eq!(v["error"]["param"], "lora_path");
    }
    assert!(!complete(&t, "lora-1", "the thin hen").await.is_empty());

    let unload = |name: &str| json!({"lora_name": name});
    let (status, _, _) = t
        .post("/v1/unload_lora_adapter", unload("late").to_string())
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, v) = t
        .post_json(
            "/v1/completions",
            &json!({"model": "late", "prompt": "hi", "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, _, _) = t
        .post("/v1/unload_lora_adapter", unload("late").to_string())
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
