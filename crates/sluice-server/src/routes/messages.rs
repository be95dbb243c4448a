//! `POST /v1/messages`: Anthropic's Messages API, run through the chat pipeline
//! ([`crate::chat::pipeline`]) and answered as Anthropic's message or its event stream. Errors
//! take Anthropic's shape at the edge ([`crate::anthropic::errors::reshape`]).

use std::time::Instant;

use axum::extract::State;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use sluice_engine::FinishReason;

use crate::anthropic::errors::stream_error;
use crate::anthropic::translate;
use crate::anthropic::types::{
    BlockDelta, ContentBlockOut, CountTokensRequest, CountTokensResponse, MessageDeltaBody,
    MessagesRequest, MessagesResponse, MessagesUsage, OutputUsage, StreamEvent,
};
use crate::chat::blocks::{BlockEvent, BlockKind, BlockStream};
use crate::chat::output::ChoiceOutput;
use crate::chat::pipeline::{self, ChatJob, ChatRun};
use crate::chat::tools;
use crate::edge::error::{ApiError, ParamNames, Wording};
use crate::edge::sse;
use crate::engine::fields;
use crate::engine::generation::{self, Item};
use crate::engine::state::AppState;
use crate::openai::{SamplingFields, StopList};
use crate::routes::json::ApiJson;

const NAMES: ParamNames = ParamNames {
    prompt: "messages",
    max_tokens: "max_tokens",
    logprobs: "logprobs",
    wording: Wording::Anthropic,
};

pub async fn handler(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<MessagesRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let model = state.model_for(Some(&req.model)).await?;
    let lora = fields::check_model(Some(&req.model), &model)?;
    let chat_template_kwargs = translate::template_switches(
        model.chat_template.as_ref(),
        &req.extra,
        req.thinking.as_ref(),
        req.output_config.as_ref(),
        req.context_management.as_ref(),
        Some(req.max_tokens),
    )?;
    let omit_thinking = req.thinking.as_ref().is_some_and(|t| t.omits_text());
    // Anthropic's range, narrower than OpenAI's.
    if let Some(t) = req.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature = {t} is out of range: it must be in [0, 1]."),
        ));
    }
    let fields = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stop: req.stop_sequences.map(StopList),
        ..SamplingFields::default()
    };
    let mut request = fields::request(&fields, Some(req.max_tokens), None)?;
    request.lora = lora;
    let (tool_choice, parallel_tool_calls) = translate::tool_choice(req.tool_choice);
    let job = ChatJob {
        messages: translate::messages(req.system, req.messages)?,
        tools: translate::tools(req.tools)?,
        tool_choice,
        parallel_tool_calls,
        requested: translate::output_grammar(req.output_config)?,
        chat_template_kwargs,
        request,
        names: NAMES,
    };
    let id = crate::edge::ids::random_id("msg", '_');
    let run = pipeline::start(&state, model, job, id, "messages", started)
        .await
        .map_err(|e| tools::flat_tool_param(e, "input_schema"))?;
    if req.stream.unwrap_or(false) {
        Ok(sse::response(stream_events(run, omit_thinking)))
    } else {
        Ok(axum::Json(collect(run, omit_thinking).await?).into_response())
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would render the
/// same request (system, messages, tools and the template's thinking switch), without
/// generating.
pub async fn count_tokens(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CountTokensRequest>,
) -> Result<axum::Json<CountTokensResponse>, ApiError> {
    let model = state.model_for(Some(&req.model)).await?;
    fields::check_model(Some(&req.model), &model)?;
    let chat_template_kwargs = translate::template_switches(
        model.chat_template.as_ref(),
        &req.extra,
        req.thinking.as_ref(),
        req.output_config.as_ref(),
        req.context_management.as_ref(),
        None,
    )?;
    let (tool_choice, parallel_tool_calls) = translate::tool_choice(req.tool_choice);
    let input_tokens = pipeline::count_prompt_tokens(
        model,
        translate::messages(req.system, req.messages)?,
        translate::tools(req.tools)?,
        tool_choice,
        parallel_tool_calls,
        chat_template_kwargs,
    )
    .await
    .map_err(|e| tools::flat_tool_param(e, "input_schema"))?;
    Ok(axum::Json(CountTokensResponse { input_tokens }))
}

fn message(run: &ChatRun, content: Vec<ContentBlockOut>) -> MessagesResponse {
    let usage = run.generation.usage();
    MessagesResponse {
        id: run.generation.id.clone(),
        kind: "message",
        role: "assistant",
        model: run.generation.served_as.clone(),
        content,
        stop_reason: None,
        stop_sequence: None,
        usage: MessagesUsage {
            input_tokens: usage.prompt_tokens,
            output_tokens: usage.completion_tokens,
        },
    }
}

async fn collect(mut run: ChatRun, omit_thinking: bool) -> Result<MessagesResponse, ApiError> {
    let mut choices = pipeline::collect(&mut run, |_, _| {}).await?;
    let choice = choices.pop().ok_or_else(generation::engine_lost)?;
    let finish = choice.finish.as_ref().ok_or_else(generation::engine_lost)?;
    let (reason, sequence) =
        translate::stop_reason(finish, !choice.calls.is_empty()).ok_or_else(translate::aborted)?;
    let content = translate::content_blocks(
        choice.reasoning,
        choice.content,
        choice.calls,
        omit_thinking,
    );
    Ok(MessagesResponse {
        stop_reason: Some(reason),
        stop_sequence: sequence,
        ..message(&run, content)
    })
}

fn sse_event(event: &StreamEvent) -> SseEvent {
    match serde_json::to_string(event) {
        Ok(text) => SseEvent::default().event(event.name()).data(text),
        Err(e) => stream_error(&ApiError::internal(format!(
            "cannot serialize an event: {e}"
        ))),
    }
}

/// Anthropic's event for a block event.
fn block_event(event: BlockEvent) -> StreamEvent {
    match event {
        BlockEvent::Start { index, kind, call } => StreamEvent::ContentBlockStart {
            index,
            content_block: match (kind, call) {
                (BlockKind::Reasoning, _) => ContentBlockOut::Thinking {
                    thinking: String::new(),
                    signature: String::new(),
                },
                (BlockKind::ToolCall, Some((id, name))) => ContentBlockOut::ToolUse {
                    id: translate::tool_use_id(&id),
                    name,
                    input: serde_json::Value::Object(Default::default()),
                },
                (BlockKind::Text | BlockKind::ToolCall, _) => ContentBlockOut::Text {
                    text: String::new(),
                },
            },
        },
        BlockEvent::Delta { index, kind, text } => StreamEvent::ContentBlockDelta {
            index,
            delta: match kind {
                BlockKind::Reasoning => BlockDelta::ThinkingDelta { thinking: text },
                BlockKind::Text => BlockDelta::TextDelta { text },
                BlockKind::ToolCall => BlockDelta::InputJsonDelta { partial_json: text },
            },
        },
        BlockEvent::Stop { index } => StreamEvent::ContentBlockStop { index },
    }
}

/// Whether `event` is sent: thinking text is not, when the request asked to omit it (its
/// block still opens and closes, empty, as Anthropic's `display: "omitted"`).
fn sent(event: &BlockEvent, omit_thinking: bool) -> bool {
    !(omit_thinking
        && matches!(
            event,
            BlockEvent::Delta {
                kind: BlockKind::Reasoning,
                ..
            }
        ))
}

/// Anthropic's event sequence for one answer; an engine failure ends it with an `error`
/// event.
fn stream_events(
    run: ChatRun,
    omit_thinking: bool,
) -> impl futures_util::Stream<Item = SseEvent> + Send {
    async_stream::stream! {
        let mut run = run;
        let mut parser = ChoiceOutput::new(&run.output);
        let mut blocks = BlockStream::default();
        let mut block_events: Vec<BlockEvent> = Vec::new();
        let mut events: Vec<StreamEvent> = Vec::new();
        yield sse_event(&StreamEvent::MessageStart { message: message(&run, Vec::new()) });
        yield sse_event(&StreamEvent::Ping);
        while let Some(item) = run.generation.next().await {
            match item {
                Item::Token { event, .. } => {
                    blocks.push(parser.push(&event.text), &mut block_events);
                }
                Item::Finished { event, .. } if event.reason == FinishReason::Error => {
                    yield stream_error(&generation::engine_failure(&event));
                    return;
                }
                Item::Finished { event, .. } => {
                    blocks.push(parser.finish(), &mut block_events);
                    let Some((reason, sequence)) =
                        translate::stop_reason(&event, parser.has_calls())
                    else {
                        yield stream_error(&translate::aborted());
                        return;
                    };
                    blocks.finish(&mut block_events);
                    events.extend(
                        block_events.drain(..).filter(|e| sent(e, omit_thinking)).map(block_event),
                    );
                    events.push(StreamEvent::MessageDelta {
                        delta: MessageDeltaBody {
                            stop_reason: reason,
                            stop_sequence: sequence,
                        },
                        usage: OutputUsage {
                            output_tokens: run.generation.usage().completion_tokens,
                        },
                    });
                    events.push(StreamEvent::MessageStop);
                }
                Item::Lost => {
                    yield stream_error(&generation::engine_lost());
                    return;
                }
            }
            events.extend(
                block_events.drain(..).filter(|e| sent(e, omit_thinking)).map(block_event),
            );
            for event in events.drain(..) {
                yield sse_event(&event);
            }
        }
    }
}
