//! A model that thinks, end to end through the router: its `<think>` block goes to
//! `reasoning_content` (message and stream deltas) and is counted in
//! `usage.completion_tokens_details.reasoning_tokens`, and `chat_template_kwargs` reach the
//! template. The mock model's own tokens are noise, so each test fixes the output with a
//! grammar: the parsers see exactly the text a thinking model would write.

mod common;

use common::*;
use serde_json::{json, Value};
use sluice_engine::EngineConfig;
use sluice_tokenizer::ChatTemplate;

/// Qwen3's shape: the generation prompt opens `<think>`, unless `enable_thinking` is false,
/// which closes an empty block instead.
const THINKING_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% else %}{{ '<think>\n' }}{% endif %}{% endif %}";

fn app() -> TestApp {
    let template = ChatTemplate::new(THINKING_TEMPLATE, None, None).unwrap();
    mock_app_with_template(settings(), EngineConfig::default(), template)
}

fn request(output: &str, extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Is it?"}],
        "max_tokens": 64,
        "guided_choice": [output],
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test]
async fn thinking_goes_to_reasoning_content_and_is_counted() {
    let t = app();
    let (status, v) = t
        .post_json(
            "/v1/chat/completions",
            &request("Let me think.\n</think>\n\nYes.", json!({})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let message = &v["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "Let me think.", "{v}");
    assert_eq!(message["content"], "Yes.", "{v}");
    let reasoning_tokens = v["usage"]["completion_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    let completion_tokens = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(
        reasoning_tokens > 0 && reasoning_tokens < completion_tokens,
        "{v}"
    );
}

#[tokio::test]
async fn streamed_thinking_comes_as_reasoning_deltas_then_content() {
    let t = app();
    let body = request(
        "Let me think.\n</think>\n\nYes.",
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let (status, _, bytes) = t.post("/v1/chat/completions", body.to_string()).await;
    assert_eq!(status, 200);
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut content_started = false;
    let mut usage = Value::Null;
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(line).unwrap();
        if !chunk["usage"].is_null() {
            usage = chunk["usage"].clone();
        }
        let Some(delta) = chunk["choices"].get(0).map(|c| &c["delta"]) else {
            continue;
        };
        if let Some(r) = delta["reasoning_content"].as_str() {
            assert!(!content_started, "reasoning after content: {text}");
            reasoning.push_str(r);
        }
        if let Some(c) = delta["content"].as_str() {
            content_started |= !c.is_empty();
            content.push_str(c);
        }
    }
    assert_eq!(reasoning, "Let me think.");
    assert_eq!(content, "Yes.");
    assert!(
        !text.contains("<think>") && !text.contains("</think>"),
        "{text}"
    );
    assert!(usage["completion_tokens_details"]["reasoning_tokens"].as_u64() > Some(0));
}

#[tokio::test]
async fn chat_template_kwargs_reach_the_template() {
    let t = app();
    let prompt = |kwargs: Value| {
        let t = &t;
        async move {
            let mut body = json!({"messages": [{"role": "user", "content": "Is it?"}]});
            if !kwargs.is_null() {
                body["chat_template_kwargs"] = kwargs;
            }
            let (status, v) = t.post_json("/tokenize", &body).await;
            assert_eq!(status, 200, "{v}");
            let (_, d) = t
                .post_json("/detokenize", &json!({"tokens": v["tokens"]}))
                .await;
            d["prompt"].as_str().unwrap().to_string()
        }
    };
    assert!(prompt(Value::Null).await.ends_with("<think>\n"));
    let off = prompt(json!({"enable_thinking": false})).await;
    assert!(off.ends_with("<think>\n\n</think>\n\n"), "{off:?}");
    // Without thinking the answer is all content, and no reasoning is reported.
    let (status, v) = t
        .post_json(
            "/v1/chat/completions",
            &request(
                "Yes.",
                json!({"chat_template_kwargs": {"enable_thinking": false}}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "Yes.", "{v}");
    assert!(
        v["choices"][0]["message"]["reasoning_content"].is_null(),
        "{v}"
    );
}
