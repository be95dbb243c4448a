//! The OpenAI API through the real router on a tiny real model: response shapes, streaming
//! chunk order, logprobs, seeds, stop strings, and the auxiliary routes.

mod common;

use axum::http::StatusCode;
use common::*;
use serde_json::{json, Value};
use sluice_engine::EngineConfig;

fn text_of(v: &Value, choice: usize) -> String {
    v["choices"][choice]["text"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn completion_has_openais_shape() {
    let t = tiny_app(settings());
    let (status, v) = t
        .post_json(
            "/v1/completions",
            &json!({"model": TINY_NAME, "prompt": "the cat", "max_tokens": 5,
                    "temperature": 0, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], TINY_NAME);
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 1);
    assert_eq!(choices[0]["index"], 0);
    assert_eq!(choices[0]["finish_reason"], "length");
    assert!(choices[0]["logprobs"].is_null());
    let usage = &v["usage"];
    assert_eq!(usage["completion_tokens"], 5);
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + 5)
    );
}

#[tokio::test]
async fn max_tokens_defaults_to_16_for_completions() {
    let t = tiny_app(settings());
    let (status, v) = t
        .post_json(
            "/v1/completions",
            &json!({"prompt": "x", "ignore_eos": true, "temperature": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 16);
}

#[tokio::test]
async fn several_prompts_times_n_index_choices_prompt_major() {
    let t = tiny_app(settings());
    let (status, v) = t
        .post_json(
            "/v1/completions",
            &json!({"prompt": ["one", "two three"], "n": 2, "max_tokens": 3,
                    "temperature": 0, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    // Greedy: both samples of a prompt agree.
    assert_eq!(text_of(&v, 0), text_of(&v, 1));
    assert_eq!(text_of(&v, 2), text_of(&v, 3));
    assert_eq!(v["usage"]["completion_tokens"], 12);

    // The same prompts as token ids give the same texts.
    let ids = |text: &str| {
        let t = &t;
        let text = text.to_string();
        async move {
            let (_, v) = t.post_json("/tokenize", &json!({"prompt": text})).await;
            v["tokens"].clone()
        }
    };
    let (a, b) = (ids("one").await, ids("two three").await);
    let (status, w) = t
        .post_json(
            "/v1/completions",
            &json!({"prompt": [a, b], "max_tokens": 3, "temperature": 0, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{w}");
    assert_eq!(text_of(&w, 0), text_of(&v, 0));
    assert_eq!(text_of(&w, 1), text_of(&v, 2));
    assert_eq!(w["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"]);
}

#[tokio::test]
async fn streamed_completion_matches_the_full_one() {
    let t = tiny_app(settings());
    let body = json!({"prompt": "hello there", "max_tokens": 8, "temperature": 0,
                      "ignore_eos": true});
    let (_, full) = t.post_json("/v1/completions", &body).await;
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    stream_body["stream_options"] = json!({"include_usage": true});
    let (status, headers, bytes) = t.post("/v1/completions", stream_body.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let chunks = sse_chunks(&bytes);
    let (usage_chunk, chunks) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], full["usage"]);
    let mut text = String::new();
    for c in chunks {
        assert_eq!(c["object"], "text_completion");
        assert!(c["usage"].is_null(), "usage is null before the last chunk");
        assert_eq!(c["id"], chunks[0]["id"]);
        text.push_str(c["choices"][0]["text"].as_str().unwrap());
    }
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert_eq!(text, text_of(&full, 0));
}

#[tokio::test]
async fn echo_prepends_the_prompt() {
    let t = tiny_app(settings());
    let body = json!({"prompt": "echo me", "max_tokens": 3, "temperature": 0,
                      "ignore_eos": true});
    let (_, plain) = t.post_json("/v1/completions", &body).await;
    let mut echo = body.clone();
    echo["echo"] = json!(true);
    let (status, v) = t.post_json("/v1/completions", &echo).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(text_of(&v, 0), format!("echo me{}", text_of(&plain, 0)));
}

#[tokio::test]
async fn chat_completion_has_openais_shape() {
    let t = tiny_app(settings());
    let (status, v) = t
        .post_json(
            "/v1/chat/completions",
            &json!({"model": TINY_NAME, "max_completion_tokens": 4, "temperature": 0,
                    "ignore_eos": true,
                    "messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    // The prompt is the ChatML rendering of the messages.
    let (_, tok) = t
        .post_json(
            "/tokenize",
            &json!({"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(v["usage"]["prompt_tokens"], tok["count"]);
}

#[tokio::test]
async fn chat_stream_sends_role_then_content_then_finish_then_usage() {
    let t = tiny_app(settings());
    let body = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6,
                      "temperature": 0, "ignore_eos": true, "n": 2, "stream": true,
                      "stream_options": {"include_usage": true}});
    let (status, _, bytes) = t.post("/v1/chat/completions", body.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = sse_chunks(&bytes);
    let (usage, chunks) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    for index in 0..2 {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["choices"][0]["index"] == index)
            .collect();
        assert!(mine.iter().all(|c| c["object"] == "chat.completion.chunk"));
        assert!(mine
            .iter()
            .all(|c| c["choices"].as_array().unwrap().len() == 1));
        let first = &mine[0]["choices"][0];
        assert_eq!(first["delta"]["role"], "assistant");
        let last = &mine.last().unwrap()["choices"][0];
        assert_eq!(last["finish_reason"], "length");
        assert_eq!(last["delta"], json!({}));
        for middle in &mine[1..mine.len() - 1] {
            let c = &middle["choices"][0];
            assert!(c["delta"]["content"].is_string() && c["delta"].get("role").is_none());
            assert!(c["finish_reason"].is_null());
        }
    }
}

#[tokio::test]
async fn completion_logprobs_have_the_legacy_shape() {
    let t = tiny_app(settings());
    let (status, v) = t
        .post_json(
            "/v1/completions",
            &json!({"prompt": "abc", "max_tokens": 5, "logprobs": 2, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 5);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 5);
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!((1..=3).contains(&top.len()), "{top:?}");
        let chosen = tokens[i].as_str().unwrap();
        assert!(top.contains_key(chosen), "the chosen token is listed");
        assert!(lp["token_logprobs"][i].as_f64().unwrap() <= 0.0);
    }
}

#[tokio::test]
async fn chat_logprobs_list_token_objects() {
    let t = tiny_app(settings());
    let (status, v) = t
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
                    "logprobs": true, "top_logprobs": 2, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    for entry in content {
        assert!(entry["token"].is_string());
        assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
        assert!(entry["bytes"].is_array());
        assert_eq!(entry["top_logprobs"].as_array().unwrap().len(), 2);
    }
}

#[tokio::test]
async fn a_seed_reproduces_a_sample() {
    let t = tiny_app(settings());
    let body = json!({"prompt": "seeded", "max_tokens": 12, "temperature": 1.0, "seed": 1234,
                      "ignore_eos": true});
    let (_, a) = t.post_json("/v1/completions", &body).await;
    let (_, b) = t.post_json("/v1/completions", &body).await;
    assert_eq!(text_of(&a, 0), text_of(&b, 0));
}

#[tokio::test]
async fn a_stop_string_ends_the_text_before_it() {
    let t = tiny_app(settings());
    let body = json!({"prompt": "stop here", "max_tokens": 40, "temperature": 0,
                      "ignore_eos": true});
    let (_, full) = t.post_json("/v1/completions", &body).await;
    let text = text_of(&full, 0);
    // A stop string taken from the middle of the greedy output.
    let chars: Vec<char> = text.chars().collect();
    let Some(start) = (chars.len() / 2..chars.len().saturating_sub(1))
        .find(|&i| !chars[i].is_whitespace() && !chars[i].is_control())
    else {
        return;
    };
    let stop: String = chars[start..start + 1].iter().collect();
    let mut with_stop = body.clone();
    with_stop["stop"] = json!([stop]);
    let (status, v) = t.post_json("/v1/completions", &with_stop).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let cut = text_of(&v, 0);
    let expected: String = text[..text.find(&stop).unwrap()].to_string();
    assert_eq!(cut, expected);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], json!(stop));
}

#[tokio::test]
async fn models_health_version_and_metrics() {
    let t = tiny_app(settings());
    let (status, _, body) = t.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["object"], "list");
    let card = &v["data"][0];
    assert_eq!(card["id"], TINY_NAME);
    assert_eq!(card["object"], "model");
    assert_eq!(card["owned_by"], "sluice");
    assert_eq!(card["max_model_len"], 512);
    // vLLM's fields: what the model was loaded from (its file's name, no path), and no parent
    // (an adapter would name its base).
    assert_eq!(card["root"], "tiny.gguf");
    assert_eq!(card["parent"], Value::Null);
    // sluice's: what it serves, a dense model (every parameter active, no experts).
    assert_eq!(card["architecture"], "llama");
    assert!(card["parameters"].as_u64().unwrap() > 0);
    assert_eq!(card["active_parameters"], card["parameters"]);
    assert_eq!(card["mixture_of_experts"], Value::Null);
    let (status, _, _) = t.get("/v1/models/tiny").await;
    assert_eq!(status, StatusCode::OK);

    let (status, _, body) = t.get("/health").await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let (status, _, body) = t.get("/version").await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));

    // Some traffic, so every engine histogram has samples.
    let (status, _) = t
        .post_json(
            "/v1/completions",
            &json!({"prompt": "metrics", "max_tokens": 3, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // A constrained request, so the grammar-mask histogram has a sample.
    let (status, v) = t
        .post_json(
            "/v1/completions",
            &json!({"prompt": "metrics", "max_tokens": 3, "guided_choice": ["a", "b"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, headers, body) = t.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = String::from_utf8(body.to_vec()).unwrap();
    let http = [
        "sluice_http_requests_total{route=\"/v1/models\",status=\"200\"}",
        "sluice_http_request_duration_seconds_bucket{route=\"/health\"",
    ];
    for name in sluice_engine::metrics::ALL.iter().chain(&http) {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    // vLLM's names for the routers, colons kept, labelled with the served model's name.
    for name in sluice_server::observe::vllm_metrics::ALL {
        assert!(
            text.contains(&format!("# TYPE {name} "))
                && text.contains(&format!("{name}{{model_name=\"{TINY_NAME}\",engine=\"0\"")),
            "{name} missing from:\n{text}"
        );
    }
}

/// The render routes answer with the very prompt a generation of the same body runs: its
/// tokens are `/tokenize`'s and the generation's `prompt_tokens`, its text the template's.
#[tokio::test]
async fn render_routes_show_the_prompt_a_generation_runs() {
    let t = tiny_app(settings());
    let body = json!({"prompt": "the theme", "max_tokens": 3, "temperature": 0.5, "seed": 7});
    let (status, rendered) = t.post_json("/v1/completions/render", &body).await;
    assert_eq!(status, StatusCode::OK, "{rendered}");
    let [one] = rendered.as_array().unwrap().as_slice() else {
        panic!("one prompt renders one request: {rendered}");
    };
    let (_, tokenized) = t
        .post_json("/tokenize", &json!({"prompt": "the theme"}))
        .await;
    assert_eq!(one["token_ids"], tokenized["tokens"]);
    assert_eq!(one["prompt"], "the theme");
    assert!(one["request_id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(one["model"], TINY_NAME);
    assert_eq!(one["stream"], false);
    assert_eq!(one["features"], Value::Null);
    let params = &one["sampling_params"];
    assert_eq!(params["max_tokens"], 3);
    assert_eq!(params["temperature"], 0.5);
    assert_eq!(params["seed"], 7);
    assert_eq!(params["n"], 1);
    let (status, generated) = t.post_json("/v1/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{generated}");
    assert_eq!(
        generated["usage"]["prompt_tokens"],
        one["token_ids"].as_array().unwrap().len()
    );

    // Several prompts: one rendered request each, in order; token ids as given, with their
    // text.
    let (status, two) = t
        .post_json(
            "/v1/completions/render",
            &json!({"prompt": [tokenized["tokens"], [5, 6, 7]]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{two}");
    assert_eq!(two.as_array().unwrap().len(), 2, "{two}");
    assert_eq!(two[0]["token_ids"], tokenized["tokens"]);
    assert_eq!(two[0]["prompt"], "the theme");
    assert_eq!(two[1]["token_ids"], json!([5, 6, 7]));
    assert_eq!(two[1]["sampling_params"]["max_tokens"], 16);
    assert_eq!(two[1]["sampling_params"]["top_n_sigma"], 0.0);
    // llama.cpp's top_n_sigma reaches the engine's parameters (-1 is llama.cpp's "off").
    for (given, run) in [(json!(1.5), 1.5), (json!(-1), 0.0)] {
        let body = json!({"prompt": "x", "top_n_sigma": given});
        let (status, r) = t.post_json("/v1/completions/render", &body).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        assert_eq!(r[0]["sampling_params"]["top_n_sigma"], run, "{given}");
    }

    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true});
    let (status, rendered) = t.post_json("/v1/chat/completions/render", &chat).await;
    assert_eq!(status, StatusCode::OK, "{rendered}");
    assert_eq!(
        rendered["prompt"],
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    let (_, tokenized) = t
        .post_json("/tokenize", &json!({"messages": chat["messages"]}))
        .await;
    assert_eq!(rendered["token_ids"], tokenized["tokens"]);
    assert!(rendered["request_id"]
        .as_str()
        .unwrap()
        .starts_with("chatcmpl-"));
    assert_eq!(rendered["stream"], true);
    assert_eq!(rendered["stream_options"]["include_usage"], false);
    // No max_tokens: what is left of the context (the tiny model's 512 tokens).
    let prompt_len = rendered["token_ids"].as_array().unwrap().len();
    assert_eq!(rendered["sampling_params"]["max_tokens"], 512 - prompt_len);
}

/// A body the generation route refuses, the render route refuses alike: same status, same
/// field named.
#[tokio::test]
async fn render_routes_refuse_what_generation_refuses() {
    let t = tiny_app(settings());
    let cases = [
        (
            "/v1/completions",
            json!({"prompt": "x", "temperature": 9}),
            "temperature",
        ),
        ("/v1/completions", json!({"prompt": ""}), "prompt"),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 0}),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "suffix": "y"}),
            "suffix",
        ),
        ("/v1/chat/completions", json!({"messages": []}), "messages"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "top_p": 0}),
            "top_p",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}),
            "max_completion_tokens",
        ),
    ];
    for (route, body, param) in cases {
        let render = format!("{route}/render");
        let (status, refused) = t.post_json(&render, &body).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{render} {body}: {refused}"
        );
        assert_eq!(
            refused["error"]["param"], param,
            "{render} {body}: {refused}"
        );
        let (status, generated) = t.post_json(route, &body).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{route} {body}: {generated}"
        );
        assert_eq!(generated["error"], refused["error"], "{route} {body}");
    }
    let (status, v) = t
        .post_json(
            "/v1/chat/completions/render",
            &json!({"model": "other", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn tokenize_and_detokenize_round_trip() {
    let t = tiny_app(settings());
    let (status, v) = t
        .post_json("/tokenize", &json!({"prompt": "the theme"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["count"], v["tokens"].as_array().unwrap().len());
    assert_eq!(v["max_model_len"], 512);
    let (status, d) = t
        .post_json("/detokenize", &json!({"tokens": v["tokens"]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{d}");
    assert_eq!(d["prompt"], "the theme");
    let (status, m) = t
        .post_json(
            "/tokenize",
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{m}");
    let (_, text) = t
        .post_json("/detokenize", &json!({"tokens": m["tokens"]}))
        .await;
    assert_eq!(
        text["prompt"],
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

/// A completion that ends in EOS lists its EOS token by name (it used to be an empty string),
/// and each `top_logprobs` map holds the alternatives asked for plus the chosen token.
#[tokio::test]
async fn logprobs_name_control_tokens() {
    let t = mock_app(settings(), EngineConfig::default());
    let bias = json!({"259": 100, "260": 100, "261": 100});
    let (status, v) = t
        .post_json(
            "/v1/completions",
            &json!({"prompt": "abc", "max_tokens": 4, "logprobs": 3, "logit_bias": bias}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{v}");
    let lp = &choice["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    let last = tokens.last().unwrap().as_str().unwrap();
    assert!(
        ["<|endoftext|>", "<|im_end|>"].contains(&last),
        "the EOS token is named: {lp}"
    );
    for (top, token) in lp["top_logprobs"].as_array().unwrap().iter().zip(tokens) {
        let top = top.as_object().unwrap();
        // Logprobs come from the unbiased logits: the chosen token is listed beside the three
        // most likely ones when it is not among them.
        assert!((3..=4).contains(&top.len()), "{top:?}");
        assert!(top.contains_key(token.as_str().unwrap()), "{top:?}");
    }
    // The text leaves the control tokens out; the offsets follow the text.
    assert_eq!(choice["text"], "");
    let (status, v) = t
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                    "logprobs": true, "top_logprobs": 3, "logit_bias": bias}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let entry = &v["choices"][0]["logprobs"]["content"][0];
    let token = entry["token"].as_str().unwrap();
    assert!(token.starts_with("<|"), "{entry}");
    assert_eq!(entry["bytes"], json!(token.as_bytes()));
}

#[tokio::test]
async fn the_chat_page_is_served_with_its_policy_and_without_the_key() {
    let t = mock_app(
        sluice_server::HttpSettings {
            api_key: Some("sk-page".into()),
            ..settings()
        },
        EngineConfig::default(),
    );
    for (path, kind, marker) in [
        ("/", "text/html", "\"webui/app.js\""),
        (
            "/webui/app.js",
            "text/javascript",
            "\"v1/chat/completions\"",
        ),
        ("/webui/style.css", "text/css", "{"),
    ] {
        let (status, headers, body) = t.get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let header = |name: &str| headers[name].to_str().unwrap().to_string();
        assert!(header("content-type").starts_with(kind), "{path}");
        assert_eq!(
            header("content-security-policy"),
            sluice_server::routes::webui::CSP,
            "{path}"
        );
        assert!(header("content-security-policy").contains("script-src 'self';"));
        assert_eq!(header("x-content-type-options"), "nosniff");
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.contains(marker), "{path} lacks {marker}");
    }
    // The page is open; what it calls is not.
    let (status, _) = t.get_json("/v1/models").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(sluice_server::routes::webui::page_bytes() < 200 * 1024);
}

#[tokio::test]
async fn the_chat_page_turned_off_is_a_404() {
    let t = mock_app(
        sluice_server::HttpSettings {
            webui: false,
            ..settings()
        },
        EngineConfig::default(),
    );
    for path in ["/", "/webui/app.js", "/webui/style.css"] {
        let (status, v) = t.get_json(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert!(v["error"]["message"].is_string(), "{path}: {v}");
    }
}
