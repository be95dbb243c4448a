//! `POST /v1/responses` and `GET /v1/responses/{response_id}`: OpenAI's Responses API, run
//! through the chat pipeline ([`crate::chat::pipeline`]) and answered as a response object or
//! its event stream. With `store` (the default, as OpenAI's) the response is kept in the
//! bounded in-memory [`ResponseStore`], so `previous_response_id` can continue it and GET
//! can read it back.

use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Value};
use sluice_engine::FinishReason;

use crate::chat::blocks::{BlockEvent, BlockKind, BlockStream};
use crate::chat::output::ChoiceOutput;
use crate::chat::pipeline::{self, ChatJob, ChatRun};
use crate::chat::thinking;
use crate::chat::tools;
use crate::edge::error::{ApiError, ParamNames, Wording};
use crate::edge::field_policy;
use crate::edge::sse;
use crate::engine::fields;
use crate::engine::generation::{self, Item};
use crate::engine::state::AppState;
use crate::openai::chat::{ChatMessageIn, MessageContent};
use crate::openai::SamplingFields;
use crate::responses::store::{ResponseStore, StoredResponse};
use crate::responses::translate::{self, ItemKind, ItemStyle};
use crate::responses::types::{
    ContentPart, Echo, InputTokensDetails, OutputItem, OutputTokensDetails, ResponseError,
    ResponseObject, ResponseUsage, ResponsesRequest, StreamEvent,
};
use crate::routes::json::ApiJson;

const NAMES: ParamNames = ParamNames {
    prompt: "input",
    max_tokens: "max_output_tokens",
    logprobs: "top_logprobs",
    wording: Wording::OpenAi,
};

/// OpenAI's bounds on `metadata`, which a stored response keeps.
const MAX_METADATA_KEYS: usize = 16;
const MAX_METADATA_KEY_LEN: usize = 64;
const MAX_METADATA_VALUE_LEN: usize = 512;

/// What a response is, apart from its output: its id, the settings it echoes, and the
/// conversation it continues (kept with its answer when it is stored).
struct Context {
    id: String,
    created_at: u64,
    model: String,
    echo: Echo,
    conversation: Vec<ChatMessageIn>,
    store: Option<ResponseStore>,
    /// How its output items are written.
    style: ItemStyle,
}

impl Context {
    fn response(&self, status: &'static str, output: Vec<OutputItem>) -> ResponseObject {
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: self.created_at,
            status,
            model: self.model.clone(),
            output,
            error: None,
            incomplete_details: None,
            usage: None,
            echo: self.echo.clone(),
        }
    }

    fn failed(&self, output: Vec<OutputItem>, e: &ApiError) -> ResponseObject {
        ResponseObject {
            error: Some(ResponseError {
                code: "server_error",
                message: e.message.clone(),
            }),
            ..self.response("failed", output)
        }
    }

    /// Keeps a finished response, when asked to.
    fn keep(self, response: &ResponseObject) {
        let Some(store) = self.store else {
            return;
        };
        let mut conversation = self.conversation;
        conversation.extend(translate::conversation_turn(&response.output));
        store.insert(StoredResponse {
            conversation: conversation.into(),
            response: response.clone().into(),
        });
    }
}

fn check_metadata(metadata: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::invalid("metadata", m));
    if metadata.len() > MAX_METADATA_KEYS {
        return bad(format!("at most {MAX_METADATA_KEYS} keys are allowed."));
    }
    for (key, value) in metadata {
        if key.len() > MAX_METADATA_KEY_LEN {
            return bad(format!(
                "keys are at most {MAX_METADATA_KEY_LEN} characters."
            ));
        }
        match value {
            Value::String(s) if s.len() <= MAX_METADATA_VALUE_LEN => {}
            _ => {
                return bad(format!(
                    "values are strings of at most {MAX_METADATA_VALUE_LEN} characters."
                ))
            }
        }
    }
    Ok(())
}

pub async fn create(
    State(state): State<AppState>,
    Extension(responses): Extension<ResponseStore>,
    ApiJson(req): ApiJson<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let model = state.model_for(req.model.as_deref()).await?;
    let lora = fields::check_model(req.model.as_deref(), &model)?;
    let lora_named = lora.is_some();
    field_policy::RESPONSES.check(&req.extra)?;
    let encrypted_reasoning = translate::check_include(req.include.as_deref())?;
    let chat_template_kwargs = thinking::template_kwargs(
        model.chat_template.as_ref(),
        translate::thinking_request(req.reasoning.as_ref()),
    );
    if let Some(t) = req.truncation.as_deref().filter(|t| *t != "disabled") {
        return Err(ApiError::invalid(
            "truncation",
            format!("truncation `{t}` is not supported: sluice never drops input to fit the context (use `disabled`)."),
        ));
    }
    let metadata = req.metadata.clone().unwrap_or_default();
    check_metadata(&metadata)?;
    let store = req.store.unwrap_or(true);
    let previous = match &req.previous_response_id {
        Some(id) => Some(responses.get(id).ok_or_else(|| ApiError {
            param: Some("previous_response_id".into()),
            ..ApiError::from_status(
                StatusCode::NOT_FOUND,
                format!(
                    "No stored response has the id `{id}`: responses are kept in memory (the \
                         latest {} at most) and only with `store: true`.",
                    crate::responses::store::MAX_RESPONSES
                ),
            )
        })?),
        None => None,
    };
    let input = match req.input {
        Some(input) => translate::input_messages(input)?,
        None => Vec::new(),
    };
    if input.is_empty() && previous.is_none() {
        return Err(ApiError::invalid(
            "input",
            "input is empty: give a string or at least one item.",
        ));
    }
    let mut conversation: Vec<ChatMessageIn> = previous
        .map(|p| p.conversation.as_ref().clone())
        .unwrap_or_default();
    conversation.extend(input);
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(instructions) = &req.instructions {
        messages.push(ChatMessageIn {
            role: "system".into(),
            content: MessageContent::text(instructions.clone()),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
        });
    }
    messages.extend(conversation.iter().cloned());

    let fields = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        ..SamplingFields::default()
    };
    let mut request = fields::request(&fields, req.max_output_tokens, None)?;
    request.lora = lora;
    let echo = Echo {
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        temperature: req.temperature.unwrap_or(1.0),
        top_p: req.top_p.unwrap_or(1.0),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        tools: req.tools.clone().unwrap_or_default(),
        text: req
            .text
            .as_ref()
            .and_then(|t| serde_json::to_value(t).ok())
            .filter(|t| !t["format"].is_null())
            .unwrap_or_else(|| json!({"format": {"type": "text"}})),
        previous_response_id: req.previous_response_id.clone(),
        store,
        metadata,
        user: req.user.clone(),
        truncation: "disabled",
    };
    let tools = translate::tools(req.tools)?;
    let style = ItemStyle {
        encrypted_reasoning,
        names: tools.names,
    };
    let job = ChatJob {
        messages,
        tools: tools.tools,
        tool_choice: translate::tool_choice(req.tool_choice)?,
        parallel_tool_calls: req.parallel_tool_calls,
        requested: translate::text_grammar(req.text.as_ref())?,
        chat_template_kwargs,
        request,
        names: NAMES,
    };
    let id = crate::edge::ids::random_id("resp", '_');
    let context = Context {
        id: id.clone(),
        created_at: crate::engine::state::unix_now(),
        model: req
            .model
            .clone()
            .filter(|_| lora_named)
            .unwrap_or_else(|| model.name.clone()),
        echo,
        conversation,
        store: store.then(|| responses.clone()),
        style,
    };
    let run = pipeline::start(&state, model, job, id, "responses", started)
        .await
        .map_err(|e| tools::flat_tool_param(e, "parameters"))?;
    let mut response = if req.stream.unwrap_or(false) {
        sse::response(stream_events(run, context))
    } else {
        axum::Json(collect(run, context).await?).into_response()
    };
    if !tools.omitted.is_empty() {
        // Hosted tools are left out of the prompt; the client is told which, never led to
        // think they ran.
        if let Ok(value) = HeaderValue::from_str(&tools.omitted.join(", ")) {
            response
                .headers_mut()
                .insert(translate::OMITTED_TOOLS_HEADER, value);
        }
    }
    Ok(response)
}

/// A stored response, as it was answered.
pub async fn retrieve(
    Extension(responses): Extension<ResponseStore>,
    Path(response_id): Path<String>,
) -> Result<axum::Json<ResponseObject>, ApiError> {
    match responses.get(&response_id) {
        Some(stored) => Ok(axum::Json(stored.response.as_ref().clone())),
        None => Err(ApiError::from_status(
            StatusCode::NOT_FOUND,
            format!("No stored response has the id `{response_id}`."),
        )),
    }
}

fn usage(run: &ChatRun, reasoning_tokens: usize) -> ResponseUsage {
    let usage = run.generation.usage();
    ResponseUsage {
        input_tokens: usage.prompt_tokens,
        input_tokens_details: InputTokensDetails {
            cached_tokens: run.generation.cached_tokens(),
        },
        output_tokens: usage.completion_tokens,
        output_tokens_details: OutputTokensDetails { reasoning_tokens },
        total_tokens: usage.total_tokens,
    }
}

async fn collect(mut run: ChatRun, context: Context) -> Result<ResponseObject, ApiError> {
    let mut choices = pipeline::collect(&mut run, |_, _| {}).await?;
    let choice = choices.pop().ok_or_else(generation::engine_lost)?;
    let reason = choice.reason().ok_or_else(generation::engine_lost)?;
    let (status, incomplete) = translate::status(reason).ok_or_else(translate::aborted)?;
    let output = translate::output_items(
        choice.reasoning,
        choice.content,
        choice.calls,
        status,
        &context.style,
    );
    let response = ResponseObject {
        incomplete_details: incomplete,
        usage: Some(usage(&run, choice.reasoning_tokens)),
        ..context.response(status, output)
    };
    context.keep(&response);
    Ok(response)
}

/// The open output item of a stream.
struct OpenItem {
    kind: BlockKind,
    id: String,
    text: String,
    /// A call's id and name.
    call: Option<(String, String)>,
}

/// Turns block events into the Responses API's events, keeping the finished items.
struct ItemWriter {
    open: Option<OpenItem>,
    output: Vec<OutputItem>,
    style: ItemStyle,
}

impl ItemWriter {
    fn new(style: ItemStyle) -> Self {
        Self {
            open: None,
            output: Vec::new(),
            style,
        }
    }

    /// `status`: what a block that stops now is (`incomplete` for the last one of an answer
    /// cut at `max_output_tokens`).
    fn write(&mut self, event: BlockEvent, status: &'static str, out: &mut Vec<StreamEvent>) {
        match event {
            BlockEvent::Start { index, kind, call } => {
                let item_kind = match kind {
                    BlockKind::Reasoning => ItemKind::Reasoning,
                    BlockKind::Text => ItemKind::Message,
                    BlockKind::ToolCall => ItemKind::FunctionCall,
                };
                let open = OpenItem {
                    kind,
                    id: translate::new_item_id(item_kind),
                    text: String::new(),
                    call,
                };
                out.push(StreamEvent::OutputItemAdded {
                    output_index: index,
                    item: open.item("in_progress", false, &self.style),
                });
                if let Some(part) = open.part(String::new()) {
                    out.push(StreamEvent::ContentPartAdded {
                        item_id: open.id.clone(),
                        output_index: index,
                        content_index: 0,
                        part,
                    });
                }
                self.open = Some(open);
            }
            BlockEvent::Delta { index, text, .. } => {
                let Some(open) = self.open.as_mut() else {
                    return;
                };
                open.text.push_str(&text);
                let item_id = open.id.clone();
                out.push(match open.kind {
                    BlockKind::Reasoning => StreamEvent::ReasoningTextDelta {
                        item_id,
                        output_index: index,
                        content_index: 0,
                        delta: text,
                    },
                    BlockKind::Text => StreamEvent::OutputTextDelta {
                        item_id,
                        output_index: index,
                        content_index: 0,
                        delta: text,
                    },
                    BlockKind::ToolCall => StreamEvent::FunctionCallArgumentsDelta {
                        item_id,
                        output_index: index,
                        delta: text,
                    },
                });
            }
            BlockEvent::Stop { index } => {
                let Some(open) = self.open.take() else {
                    return;
                };
                let item_id = open.id.clone();
                match open.part(open.text.clone()) {
                    Some(part) => {
                        let (id, text) = (item_id.clone(), open.text.clone());
                        out.push(if open.kind == BlockKind::Reasoning {
                            StreamEvent::ReasoningTextDone {
                                item_id: id,
                                output_index: index,
                                content_index: 0,
                                text,
                            }
                        } else {
                            StreamEvent::OutputTextDone {
                                item_id: id,
                                output_index: index,
                                content_index: 0,
                                text,
                            }
                        });
                        out.push(StreamEvent::ContentPartDone {
                            item_id,
                            output_index: index,
                            content_index: 0,
                            part,
                        });
                    }
                    None => out.push(StreamEvent::FunctionCallArgumentsDone {
                        item_id,
                        output_index: index,
                        name: open
                            .call
                            .as_ref()
                            .map(|(_, n)| n.clone())
                            .unwrap_or_default(),
                        arguments: open.text.clone(),
                    }),
                }
                let item = open.item(status, true, &self.style);
                out.push(StreamEvent::OutputItemDone {
                    output_index: index,
                    item: item.clone(),
                });
                self.output.push(item);
            }
        }
    }
}

impl OpenItem {
    /// The content part holding `text`, for an item that has one (not a call).
    fn part(&self, text: String) -> Option<ContentPart> {
        match self.kind {
            BlockKind::Reasoning => Some(ContentPart::ReasoningText { text }),
            BlockKind::Text => Some(ContentPart::OutputText {
                text,
                annotations: Vec::new(),
            }),
            BlockKind::ToolCall => None,
        }
    }

    /// The item as it stands: with its content when `whole`, empty when just added.
    fn item(&self, status: &'static str, whole: bool, style: &ItemStyle) -> OutputItem {
        let text = if whole {
            self.text.clone()
        } else {
            String::new()
        };
        let content: Vec<ContentPart> = if whole {
            self.part(text.clone()).into_iter().collect()
        } else {
            Vec::new()
        };
        match self.kind {
            BlockKind::Reasoning => OutputItem::Reasoning {
                id: self.id.clone(),
                summary: Vec::new(),
                // The token of the whole text, once there is one.
                encrypted_content: (whole && style.encrypted_reasoning)
                    .then(|| translate::reasoning_token(&text)),
                content,
                status,
            },
            BlockKind::Text => OutputItem::Message {
                id: self.id.clone(),
                status,
                role: "assistant",
                content,
            },
            BlockKind::ToolCall => {
                let (call_id, name) = self.call.clone().unwrap_or_default();
                translate::call_item(self.id.clone(), call_id, name, text, status, style)
            }
        }
    }
}

/// An event as sent: its JSON with the stream's `sequence_number`, named by its `type`.
fn sse_event(event: &StreamEvent, sequence: &mut u64) -> SseEvent {
    let mut value = match serde_json::to_value(event) {
        Ok(v) => v,
        Err(e) => {
            return sse::error(&ApiError::internal(format!(
                "cannot serialize an event: {e}"
            )))
        }
    };
    let name = value["type"].as_str().unwrap_or("error").to_string();
    value["sequence_number"] = json!(*sequence);
    *sequence += 1;
    SseEvent::default().event(name).data(value.to_string())
}

/// The Responses API's event sequence for one answer: `response.created`,
/// `response.in_progress`, each output item added, filled and done, then
/// `response.completed` (its status `incomplete` when cut at `max_output_tokens`); a
/// failure ends it with `response.failed`.
fn stream_events(
    run: ChatRun,
    context: Context,
) -> impl futures_util::Stream<Item = SseEvent> + Send {
    async_stream::stream! {
        let mut run = run;
        let mut sequence = 0u64;
        let mut parser = ChoiceOutput::new(&run.output);
        let mut blocks = BlockStream::default();
        let mut items = ItemWriter::new(context.style.clone());
        let mut block_events: Vec<BlockEvent> = Vec::new();
        let mut events: Vec<StreamEvent> = Vec::new();
        yield sse_event(&StreamEvent::Created { response: context.response("in_progress", Vec::new()) }, &mut sequence);
        yield sse_event(&StreamEvent::InProgress { response: context.response("in_progress", Vec::new()) }, &mut sequence);
        while let Some(item) = run.generation.next().await {
            let failure = match item {
                Item::Token { event, .. } => {
                    blocks.push(parser.push(&event.text), &mut block_events);
                    for e in block_events.drain(..) {
                        items.write(e, "completed", &mut events);
                    }
                    None
                }
                Item::Finished { event, .. } if event.reason == FinishReason::Error => {
                    Some(generation::engine_failure(&event))
                }
                Item::Finished { event, .. } => match translate::status(event.reason) {
                    None => Some(translate::aborted()),
                    Some((status, incomplete)) => {
                        blocks.push(parser.finish(), &mut block_events);
                        blocks.finish(&mut block_events);
                        // Blocks stopped by the end of the answer carry its status.
                        for e in block_events.drain(..) {
                            items.write(e, status, &mut events);
                        }
                        let response = ResponseObject {
                            incomplete_details: incomplete.clone(),
                            usage: Some(usage(&run, parser.reasoning_tokens())),
                            ..context.response(status, std::mem::take(&mut items.output))
                        };
                        // `response.completed` whatever the status (as vLLM sends): the
                        // official SDK's stream helper ends only on it, and the response says
                        // whether it is `incomplete`.
                        events.push(StreamEvent::Completed { response: response.clone() });
                        for e in events.drain(..) {
                            yield sse_event(&e, &mut sequence);
                        }
                        context.keep(&response);
                        return;
                    }
                },
                Item::Lost => Some(generation::engine_lost()),
            };
            for e in events.drain(..) {
                yield sse_event(&e, &mut sequence);
            }
            if let Some(e) = failure {
                let response = context.failed(std::mem::take(&mut items.output), &e);
                yield sse_event(&StreamEvent::Failed { response }, &mut sequence);
                return;
            }
        }
    }
}
