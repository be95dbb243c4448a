//! `POST /v1/chat/completions`.

use std::time::Instant;

use axum::extract::State;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use sluice_engine::{FinishEvent, FinishReason, TokenEvent};

use super::tokenize_blocking;
use crate::chat_output::{ChoiceOutput, Delta, OutputFormat};
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
use crate::structured;
use crate::tool_calls::{self, ToolPlan};
use sluice_tokenizer::tool_parser::ToolCallFormat;
use sluice_tokenizer::ChatTemplate;

const ROLE: &str = "assistant";

pub async fn handler(
    State(state): State<AppState>,
    ApiJson(mut req): ApiJson<ChatRequest>,
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
    let (n, sampling, mut stop) = request_fields::sampling(&req.sampling(), logprobs)?;
    let names = ParamNames::chat(req.max_completion_tokens.is_some());
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    let stream = req.stream.unwrap_or(false);
    let include_usage = stream
        && req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);

    structured::check_extra_fields(&req.extra)?;
    let requested = structured::requested_grammar(req.constraint_fields())?;
    let plan = match model.chat_template.as_ref() {
        Some(template) => tool_calls::plan(
            req.tools.take(),
            req.tool_choice.take(),
            req.parallel_tool_calls,
            template,
            model.tool_call_format,
        )?,
        // Rendering refuses the request below, naming `messages`.
        None => ToolPlan::default(),
    };
    let grammar = match (plan.grammar.clone(), requested) {
        (Some(_), Some(r)) => {
            return Err(ApiError::invalid(
                r.param,
                "the output cannot follow a format and the tools' call grammar at once (a \
                 forced call, or strict tools); drop one of them.",
            ))
        }
        (Some(forced), None) => Some((forced, "tools")),
        (None, Some(r)) => Some((r.grammar, r.param)),
        (None, None) => None,
    };
    if matches!(
        plan.format,
        Some(ToolCallFormat::Llama3Json | ToolCallFormat::Mistral)
    ) {
        // These formats open calls with control tokens (`<|python_tag|>`, `[TOOL_CALLS]`),
        // which the parser must see.
        stop.skip_special_tokens = false;
    }
    let kwargs = req.chat_template_kwargs.take();
    let thinks = model.chat_template.as_ref().is_some_and(|t| t.thinks());

    let render_model = model.clone();
    let messages = req.messages;
    let template_tools = plan.template_tools.clone();
    let (prompt, opens_thinking, constraint) = tokenize_blocking(move || {
        let text = request_fields::render_chat(
            render_model.chat_template.as_ref(),
            &messages,
            true,
            template_tools.as_deref(),
            kwargs.as_ref(),
        )?;
        let opens_thinking = ChatTemplate::prompt_opens_thinking(&text);
        let constraint = grammar
            .map(|(g, param)| render_model.compile_constraint(g, param))
            .transpose()?;
        // The template writes any BOS the model wants itself.
        let prompt = render_model
            .tokenizer()
            .encode(&text)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        Ok((prompt, opens_thinking, constraint))
    })
    .await?;
    let output = OutputFormat {
        reasoning: thinks.then_some(opens_thinking),
        tools: plan.format,
        single_call: plan.single_call,
    };
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
            constraint,
            names,
        },
    )?;
    if stream {
        Ok(sse::response(stream_chunks(
            generation,
            output,
            want_logprobs,
            include_usage,
        )))
    } else {
        Ok(collect(generation, output, want_logprobs)
            .await?
            .into_response())
    }
}

fn token_logprobs(generation: &Generation, event: &TokenEvent) -> Option<ChatLogprobs> {
    let lp = event.logprobs.as_ref()?;
    Some(ChatLogprobs {
        content: vec![logprobs::chat_entry(generation.model.tokenizer(), lp)],
    })
}

async fn collect(
    mut generation: Generation,
    output: OutputFormat,
    want_logprobs: bool,
) -> Result<axum::Json<ChatResponse>, ApiError> {
    struct ChoiceState {
        parsed: ChoiceOutput,
        content: String,
        reasoning: String,
        logprobs: Option<ChatLogprobs>,
        finish: Option<FinishEvent>,
    }
    let mut choices: Vec<ChoiceState> = (0..generation.num_choices())
        .map(|_| ChoiceState {
            parsed: ChoiceOutput::new(output),
            content: String::new(),
            reasoning: String::new(),
            logprobs: want_logprobs.then(ChatLogprobs::default),
            finish: None,
        })
        .collect();
    let absorb = |state: &mut ChoiceState, delta: Delta| {
        state.content.push_str(&delta.content);
        state.reasoning.push_str(&delta.reasoning);
    };
    while let Some(item) = generation.next().await {
        match item {
            Item::Token { choice, event } => {
                let Some(state) = choices.get_mut(choice) else {
                    continue;
                };
                let delta = state.parsed.push(&event.text);
                absorb(state, delta);
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
                    let delta = state.parsed.finish();
                    absorb(state, delta);
                    state.finish = Some(event);
                }
            }
            Item::Lost => return Err(engine_request::engine_lost()),
        }
    }
    let reasoning_tokens: usize = choices.iter().map(|c| c.parsed.reasoning_tokens()).sum();
    let mut usage = generation.usage();
    if output.reasoning.is_some() {
        usage = usage.with_reasoning_tokens(reasoning_tokens);
    }
    Ok(axum::Json(ChatResponse {
        id: generation.id.clone(),
        object: "chat.completion",
        created: generation.created,
        model: generation.model.name.clone(),
        choices: choices
            .into_iter()
            .enumerate()
            .map(|(index, c)| {
                let calls = c.parsed.calls();
                ChatChoice {
                    index,
                    finish_reason: c
                        .finish
                        .as_ref()
                        .map(|f| finish_reason(f.reason, !calls.is_empty())),
                    message: ChatMessageOut {
                        role: ROLE,
                        // OpenAI's message of only calls has null content.
                        content: (!c.content.is_empty() || calls.is_empty()).then_some(c.content),
                        // Null, as vLLM's, when the model did not think.
                        reasoning_content: Some(c.reasoning).filter(|r| !r.is_empty()),
                        tool_calls: calls,
                    },
                    logprobs: c.logprobs,
                    stop_reason: c.finish.as_ref().and_then(engine_request::stop_reason),
                }
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
        engine_request::finish_reason(reason)
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
        model: generation.model.name.clone(),
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
            .map(|_| ChoiceOutput::new(output))
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
                    yield sse::error(&engine_request::engine_failure(&event));
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
