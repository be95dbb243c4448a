//! Images through the real router on the tiny model, which reads text only: every API parses
//! its image parts and refuses them with a 400 naming the image's field in its own error
//! shape, the parts' own errors are named alike, and `/v1/models` says the model takes text.

mod common;

use axum::http::StatusCode;
use common::*;
use serde_json::{json, Value};

const PNG: &str = "data:image/png;base64,iVBORw0KGgo=";

#[tokio::test]
async fn a_text_model_refuses_images_naming_them_on_every_api() {
    let t = tiny_app(settings());
    let chat = json!({"max_tokens": 4, "messages": [
        {"role": "user", "content": "first"},
        {"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}}]}]});
    let (status, body) = t.post_json("/v1/chat/completions", &chat).await;
    assert_error(
        status,
        &body,
        StatusCode::BAD_REQUEST,
        Some("messages[1].content[1].image_url"),
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("reads text only"),
        "{body}"
    );
    // The render route checks what the generation route checks.
    let (status, body) = t.post_json("/v1/chat/completions/render", &chat).await;
    assert_error(
        status,
        &body,
        StatusCode::BAD_REQUEST,
        Some("messages[1].content[1].image_url"),
    );
    // `/tokenize` renders text only.
    let (status, body) = t
        .post_json("/tokenize", &json!({"messages": chat["messages"]}))
        .await;
    assert_error(
        status,
        &body,
        StatusCode::BAD_REQUEST,
        Some("messages[1].content[1].image_url"),
    );

    let responses = json!({"max_output_tokens": 4, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": PNG}]}]});
    let (status, body) = t.post_json("/v1/responses", &responses).await;
    assert_error(
        status,
        &body,
        StatusCode::BAD_REQUEST,
        Some("input[0].content[1].image_url"),
    );

    let messages = json!({"model": TINY_NAME, "max_tokens": 4, "messages": [{"role": "user",
        "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
        "data": "iVBORw0KGgo="}}, {"type": "text", "text": "What is this?"}]}]});
    let mut count = messages.clone();
    count.as_object_mut().unwrap().remove("max_tokens");
    for (route, body) in [
        ("/v1/messages", &messages),
        ("/v1/messages/count_tokens", &count),
    ] {
        let (status, body) = t.post_json(route, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{route}: {body}");
        assert_eq!(body["type"], "error", "{route}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("messages[0].content[0].source: ") && message.contains("text only"),
            "{route}: {message}"
        );
    }
}

#[tokio::test]
async fn bad_image_parts_are_400s_naming_the_field() {
    let t = tiny_app(settings());
    let part = |image_url: Value| {
        json!({"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": image_url}]}]})
    };
    let cases = [
        (
            part(json!({"url": PNG, "detail": "ultra"})),
            "messages[0].content[0].image_url.detail",
        ),
        (
            part(json!({"url": "file:///etc/passwd"})),
            "messages[0].content[0].image_url",
        ),
        (
            part(json!({"url": "data:image/png;base64,@@@"})),
            "messages[0].content[0].image_url",
        ),
        (
            part(json!({"url": "data:text/html;base64,aGk="})),
            "messages[0].content[0].image_url",
        ),
    ];
    for (body, param) in cases {
        let (status, got) = t.post_json("/v1/chat/completions", &body).await;
        assert_error(status, &got, StatusCode::BAD_REQUEST, Some(param));
    }
    let audio = json!({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]});
    let (status, got) = t.post_json("/v1/chat/completions", &audio).await;
    assert_error(
        status,
        &got,
        StatusCode::BAD_REQUEST,
        Some("messages[0].content[0]"),
    );
    let file = json!({"max_output_tokens": 4, "input": [{"role": "user", "content": [
        {"type": "input_image", "file_id": "file-abc"}]}]});
    let (status, got) = t.post_json("/v1/responses", &file).await;
    assert_error(
        status,
        &got,
        StatusCode::BAD_REQUEST,
        Some("input[0].content[0].file_id"),
    );
}

#[tokio::test]
async fn the_model_card_says_it_reads_text() {
    let t = tiny_app(settings());
    let (status, body) = t.get_json("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["data"][0]["input_modalities"],
        json!(["text"]),
        "{body}"
    );
}
