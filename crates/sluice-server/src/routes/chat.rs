//! `POST /v1/chat/completions`.

use std::time::Instant;

use axum::extract::State;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use sluice_engine::{FinishEvent, FinishReason, TokenEvent};

use super::tokenize_blocking;
use crate::engine_request::{self, Generation, GenerationParams, Item};
use crate::error::{ApiError, ParamNames};
use crate::json::ApiJson;
use crate::logprobs;
use crate::openai::chat::{
    ChatChoice, ChatChunk, ChatChunkChoice, ChatDelta, ChatLogprobs, ChatMessageOut, ChatRequest,
    ChatResponse,
};
use crate::request_fields;
use crate::sse;
use crate::state::AppState;

const ROLE: &str = "assistant";

pub async fn handler(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let model = state.model()?;
    request_fields::check_model(req.model.as_deref(), &model)?;
    let want_logprobs = req.logprobs.unwrap_or(false);
    let top = req.top_logprobs;
    if top.is_some_and(|k| k > 0) && !want_logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs set to true.",
        ));
    }
    let logprobs = want_logprobs.then(|| top.unwrap_or(0));
    let (n, sampling, stop) = request_fields::sampling(&req.sampling(), logprobs)?;
    let names = ParamNames::chat(req.max_completion_tokens.is_some());
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    let stream = req.stream.unwrap_or(false);
    let include_usage = stream
        && req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);

    let render_model = model.clone();
    let messages = req.messages;
    let prompt = tokenize_blocking(move || {
        let text =
            request_fields::render_chat(render_model.chat_template.as_ref(), &messages, true)?;
        // The template writes any BOS the model wants itself.
        render_model
            .tokenizer()
            .encode(&text)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))
    })
    .await?;
    let generation = Generation::start(
        &state,
        model,
        engine_request::request_id("chatcmpl"),
        "chat",
        started,
        vec![prompt],
        GenerationParams {
            n,
            max_tokens,
            sampling,
            stop,
            names,
        },
    )?;
    if stream {
        Ok(sse::response(stream_chunks(
            generation,
            want_logprobs,
            include_usage,
        )))
    } else {
        Ok(collect(generation, want_logprobs).await?.into_response())
    }
}

fn token_logprobs(generation: &Generation, event: &TokenEvent) -> Option<ChatLogprobs> {
    let lp = event.logprobs.as_ref()?;
    Some(ChatLogprobs {
        content: vec![logprobs::chat_entry(
            generation.model.tokenizer(),
            generation.skip_special_tokens,
            lp,
        )],
    })
}

async fn collect(
    mut generation: Generation,
    want_logprobs: bool,
) -> Result<axum::Json<ChatResponse>, ApiError> {
    struct ChoiceState {
        text: String,
        logprobs: Option<ChatLogprobs>,
        finish: Option<FinishEvent>,
    }
    let mut choices: Vec<ChoiceState> = (0..generation.num_choices())
        .map(|_| ChoiceState {
            text: String::new(),
            logprobs: want_logprobs.then(ChatLogprobs::default),
            finish: None,
        })
        .collect();
    while let Some(item) = generation.next().await {
        match item {
            Item::Token { choice, event } => {
                let Some(state) = choices.get_mut(choice) else {
                    continue;
                };
                state.text.push_str(&event.text);
                if let (Some(all), Some(lp)) =
                    (&mut state.logprobs, token_logprobs(&generation, &event))
                {
                    all.content.extend(lp.content);
                }
            }
            Item::Finished { event, .. } if event.reason == FinishReason::Error => {
                return Err(engine_request::engine_failure(&event))
            }
            Item::Finished { choice, event } => {
                if let Some(state) = choices.get_mut(choice) {
                    state.finish = Some(event);
                }
            }
            Item::Lost => return Err(engine_request::engine_lost()),
        }
    }
    Ok(axum::Json(ChatResponse {
        id: generation.id.clone(),
        object: "chat.completion",
        created: generation.created,
        model: generation.model.name.clone(),
        choices: choices
            .into_iter()
            .enumerate()
            .map(|(index, c)| ChatChoice {
                index,
                message: ChatMessageOut {
                    role: ROLE,
                    content: c.text,
                },
                logprobs: c.logprobs,
                finish_reason: c
                    .finish
                    .as_ref()
                    .map(|f| engine_request::finish_reason(f.reason)),
                stop_reason: c.finish.as_ref().and_then(engine_request::stop_reason),
            })
            .collect(),
        usage: generation.usage(),
    }))
}

fn chunk(generation: &Generation, choice: ChatChunkChoice, include_usage: bool) -> SseEvent {
    sse::json(&ChatChunk {
        id: generation.id.clone(),
        object: "chat.completion.chunk",
        created: generation.created,
        model: generation.model.name.clone(),
        choices: vec![choice],
        usage: include_usage.then_some(None),
    })
}

/// Chunks in OpenAI's order: the role first, then content deltas, then a chunk with the
/// finish reason and an empty delta (per choice), then usage when asked, then `[DONE]`.
fn stream_chunks(
    mut generation: Generation,
    want_logprobs: bool,
    include_usage: bool,
) -> impl futures_util::Stream<Item = SseEvent> + Send {
    async_stream::stream! {
        for index in 0..generation.num_choices() {
            let role = ChatChunkChoice {
                index,
                delta: ChatDelta {
                    role: Some(ROLE),
                    content: Some(String::new()),
                },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            };
            yield chunk(&generation, role, include_usage);
        }
        while let Some(item) = generation.next().await {
            match item {
                Item::Token { choice, event } => {
                    let logprobs = token_logprobs(&generation, &event);
                    // Text held back (half a character, a possible stop string) sends
                    // nothing now, unless the token's logprobs were asked for.
                    if event.text.is_empty() && !(want_logprobs && logprobs.is_some()) {
                        continue;
                    }
                    let c = ChatChunkChoice {
                        index: choice,
                        delta: ChatDelta {
                            role: None,
                            content: Some(event.text),
                        },
                        logprobs,
                        finish_reason: None,
                        stop_reason: None,
                    };
                    yield chunk(&generation, c, include_usage);
                }
                Item::Finished { event, .. } if event.reason == FinishReason::Error => {
                    yield sse::error(&engine_request::engine_failure(&event));
                    yield sse::done();
                    return;
                }
                Item::Finished { choice, event } => {
                    let c = ChatChunkChoice {
                        index: choice,
                        delta: ChatDelta::default(),
                        logprobs: None,
                        finish_reason: Some(engine_request::finish_reason(event.reason)),
                        stop_reason: engine_request::stop_reason(&event),
                    };
                    yield chunk(&generation, c, include_usage);
                }
                Item::Lost => {
                    yield sse::error(&engine_request::engine_lost());
                    yield sse::done();
                    return;
                }
            }
        }
        if include_usage {
            yield sse::json(&ChatChunk {
                id: generation.id.clone(),
                object: "chat.completion.chunk",
                created: generation.created,
                model: generation.model.name.clone(),
                choices: Vec::new(),
                usage: Some(Some(generation.usage())),
            });
        }
        yield sse::done();
    }
}
