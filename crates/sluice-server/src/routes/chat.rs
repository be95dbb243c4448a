//! `POST /v1/chat/completions`.

use std::time::Instant;

use axum::extract::State;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use sluice_engine::{FinishReason, TokenEvent};

use crate::chat::grammar;
use crate::chat::output::{ChoiceOutput, Delta, OutputFormat};
use crate::chat::pipeline::{self, ChatJob, ChatRun};
use crate::edge::error::{ApiError, ParamNames};
use crate::edge::field_policy;
use crate::edge::sse;
use crate::engine::fields;
use crate::engine::generation::{self, Generation, Item};
use crate::engine::logprobs;
use crate::engine::state::{AppState, ServedModel};
use crate::openai::chat::{
    ChatChoice, ChatChunk, ChatChunkChoice, ChatDelta, ChatLogprobs, ChatMessageOut, ChatRequest,
    ChatResponse,
};
use crate::routes::json::ApiJson;

const ROLE: &str = "assistant";

pub async fn handler(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let model = state.model_for(req.model.as_deref()).await?;
    let (job, delivery) = job(&model, req)?;
    let ChatRun { generation, output } = pipeline::start(
        &state,
        model,
        job,
        generation::request_id("chatcmpl"),
        "chat",
        started,
    )
    .await?;
    if delivery.stream {
        Ok(sse::response(stream_chunks(
            generation,
            output,
            delivery.want_logprobs,
            delivery.include_usage,
        )))
    } else {
        Ok(collect(generation, output, delivery.want_logprobs)
            .await?
            .into_response())
    }
}

/// How a chat request's answer is to be sent, which the conversation ([`ChatJob`]) does not
/// say.
pub struct Delivery {
    pub stream: bool,
    /// `stream_options.include_usage` (only with `stream`).
    pub include_usage: bool,
    pub want_logprobs: bool,
}

/// The checks of a chat completions request that need no template or engine (its model, its
/// logprobs, sampling and output-format fields), and the conversation the chat pipeline is to
/// run: what [`handler`] generates from and `POST /v1/chat/completions/render` renders.
pub fn job(model: &ServedModel, mut req: ChatRequest) -> Result<(ChatJob, Delivery), ApiError> {
    let lora = fields::check_model(req.model.as_deref(), model)?;
    let want_logprobs = req.logprobs.unwrap_or(false);
    let top = req.top_logprobs;
    if top.is_some_and(|k| k > 0) && !want_logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs set to true.",
        ));
    }
    let logprobs = want_logprobs.then(|| top.unwrap_or(0));
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    let mut request = fields::request(&req.sampling(), max_tokens, logprobs)?;
    request.lora = lora;
    let names = ParamNames::chat(req.max_completion_tokens.is_some());
    let stream = req.stream.unwrap_or(false);
    let include_usage = stream
        && req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);

    field_policy::check_extra_fields(&req.extra)?;
    let requested = grammar::requested_grammar(req.constraint_fields())?;
    let job = ChatJob {
        tools: req.tools.take(),
        tool_choice: req.tool_choice.take(),
        parallel_tool_calls: req.parallel_tool_calls,
        requested,
        chat_template_kwargs: req.chat_template_kwargs.take(),
        messages: req.messages,
        request,
        names,
    };
    Ok((
        job,
        Delivery {
            stream,
            include_usage,
            want_logprobs,
        },
    ))
}

fn token_logprobs(generation: &Generation, event: &TokenEvent) -> Option<ChatLogprobs> {
    let lp = event.logprobs.as_ref()?;
    Some(ChatLogprobs {
        content: vec![logprobs::chat_entry(generation.model.tokenizer(), lp)],
    })
}

async fn collect(
    generation: Generation,
    output: OutputFormat,
    want_logprobs: bool,
) -> Result<axum::Json<ChatResponse>, ApiError> {
    let mut logprobs: Vec<Option<ChatLogprobs>> = (0..generation.num_choices())
        .map(|_| want_logprobs.then(ChatLogprobs::default))
        .collect();
    let tokenizer = generation.model.tokenizer().clone();
    let thinks = output.reasoning.is_some();
    let mut run = ChatRun { generation, output };
    let choices = pipeline::collect(&mut run, |choice, event| {
        if let (Some(Some(all)), Some(lp)) = (logprobs.get_mut(choice), &event.logprobs) {
            all.content.push(logprobs::chat_entry(&tokenizer, lp));
        }
    })
    .await?;
    let generation = run.generation;
    let reasoning_tokens: usize = choices.iter().map(|c| c.reasoning_tokens).sum();
    let mut usage = generation.usage();
    if thinks {
        usage = usage.with_reasoning_tokens(reasoning_tokens);
    }
    Ok(axum::Json(ChatResponse {
        id: generation.id.clone(),
        object: "chat.completion",
        created: generation.created,
        model: generation.served_as.clone(),
        choices: choices
            .into_iter()
            .zip(logprobs)
            .enumerate()
            .map(|(index, (c, logprobs))| ChatChoice {
                index,
                finish_reason: c
                    .reason()
                    .map(|reason| finish_reason(reason, !c.calls.is_empty())),
                stop_reason: c.finish.as_ref().and_then(generation::stop_reason),
                message: ChatMessageOut {
                    role: ROLE,
                    // OpenAI's message of only calls has null content.
                    content: (!c.content.is_empty() || c.calls.is_empty()).then_some(c.content),
                    // Null, as vLLM's, when the model did not think.
                    reasoning_content: Some(c.reasoning).filter(|r| !r.is_empty()),
                    tool_calls: c.calls,
                },
                logprobs,
            })
            .collect(),
        usage,
    }))
}

/// `tool_calls` when the choice ended by itself after calling; otherwise the engine's reason.
fn finish_reason(reason: FinishReason, called: bool) -> &'static str {
    if called && reason == FinishReason::Stop {
        "tool_calls"
    } else {
        generation::finish_reason(reason)
    }
}

/// A stream chunk's delta for what a token added.
fn chat_delta(delta: Delta) -> ChatDelta {
    let only_text = delta.reasoning.is_empty() && delta.tool_calls.is_empty();
    ChatDelta {
        role: None,
        // A token with logprobs but no text still sends `content: ""`, as before.
        content: (!delta.content.is_empty() || only_text).then_some(delta.content),
        reasoning_content: (!delta.reasoning.is_empty()).then_some(delta.reasoning),
        tool_calls: delta.tool_calls,
    }
}

fn chunk(generation: &Generation, choice: ChatChunkChoice, include_usage: bool) -> SseEvent {
    sse::json(&ChatChunk {
        id: generation.id.clone(),
        object: "chat.completion.chunk",
        created: generation.created,
        model: generation.served_as.clone(),
        choices: vec![choice],
        usage: include_usage.then_some(None),
    })
}

/// Chunks in OpenAI's order: the role first, then content deltas, then a chunk with the
/// finish reason and an empty delta (per choice), then usage when asked, then `[DONE]`.
fn stream_chunks(
    mut generation: Generation,
    output: OutputFormat,
    want_logprobs: bool,
    include_usage: bool,
) -> impl futures_util::Stream<Item = SseEvent> + Send {
    async_stream::stream! {
        let mut parsed: Vec<ChoiceOutput> = (0..generation.num_choices())
            .map(|_| ChoiceOutput::new(&output))
            .collect();
        for index in 0..generation.num_choices() {
            let role = ChatChunkChoice {
                index,
                delta: ChatDelta {
                    role: Some(ROLE),
                    content: Some(String::new()),
                    ..ChatDelta::default()
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
                    let Some(parser) = parsed.get_mut(choice) else {
                        continue;
                    };
                    let delta = parser.push(&event.text);
                    // Text held back (half a character, a possible stop string, a possible
                    // call marker) sends nothing now, unless the token's logprobs were asked
                    // for.
                    if delta.is_empty() && !(want_logprobs && logprobs.is_some()) {
                        continue;
                    }
                    let c = ChatChunkChoice {
                        index: choice,
                        delta: chat_delta(delta),
                        logprobs,
                        finish_reason: None,
                        stop_reason: None,
                    };
                    yield chunk(&generation, c, include_usage);
                }
                Item::Finished { event, .. } if event.reason == FinishReason::Error => {
                    yield sse::error(&generation::engine_failure(&event));
                    yield sse::done();
                    return;
                }
                Item::Finished { choice, event } => {
                    let Some(parser) = parsed.get_mut(choice) else {
                        continue;
                    };
                    let rest = parser.finish();
                    if !rest.is_empty() {
                        let c = ChatChunkChoice {
                            index: choice,
                            delta: chat_delta(rest),
                            logprobs: None,
                            finish_reason: None,
                            stop_reason: None,
                        };
                        yield chunk(&generation, c, include_usage);
                    }
                    let c = ChatChunkChoice {
                        index: choice,
                        delta: ChatDelta::default(),
                        logprobs: None,
                        finish_reason: Some(finish_reason(event.reason, parser.has_calls())),
                        stop_reason: generation::stop_reason(&event),
                    };
                    yield chunk(&generation, c, include_usage);
                }
                Item::Lost => {
                    yield sse::error(&generation::engine_lost());
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
                model: generation.served_as.clone(),
                choices: Vec::new(),
                usage: Some(Some(if output.reasoning.is_some() {
                    generation.usage().with_reasoning_tokens(
                        parsed.iter().map(ChoiceOutput::reasoning_tokens).sum(),
                    )
                } else {
                    generation.usage()
                })),
            });
        }
        yield sse::done();
    }
}
