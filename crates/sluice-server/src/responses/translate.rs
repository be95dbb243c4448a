//! A Responses request as the chat pipeline runs it, and a finished choice as output items:
//! `instructions` and `input` items to chat messages (a `function_call` item becomes an
//! assistant's tool call, a `function_call_output` a `tool` message), flat function tools and
//! `tool_choice` to chat completions' (checked by [`crate::tool_calls::plan`]), `text.format`
//! to the structured-output grammar, and the engine's finish to the response's status.

use serde_json::{json, Map, Value};
use sluice_engine::FinishReason;

use super::types::{
    ContentPart, IncompleteDetails, OutputItem, ResponseInput, TextConfig, TextFormat,
};
use crate::engine_request::random_id;
use crate::error::ApiError;
use crate::openai::chat::{ChatMessageIn, MessageContent};
use crate::openai::structured::{
    ExtraFields, FunctionCallIn, JsonSchemaFormat, ResponseFormat, ToolCallIn, ToolCallOut,
    ToolChoice,
};
use crate::structured::{self, ConstraintFields, RequestedGrammar};

/// Fields that ask for what sluice cannot do: refused by name, unless null (or empty/false,
/// which asks for nothing).
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "reasoning",
        "reasoning effort and summaries are not supported; a model that thinks does so as its \
         chat template says, and its thinking comes back as a reasoning item.",
    ),
    (
        "include",
        "extra output (logprobs, encrypted reasoning, search results) is not supported.",
    ),
    (
        "top_logprobs",
        "logprobs are not supported on this API; use /v1/chat/completions.",
    ),
    (
        "background",
        "background responses are not supported by this server.",
    ),
    (
        "conversation",
        "conversations are not supported; use previous_response_id.",
    ),
    (
        "prompt",
        "prompt templates are not supported by this server.",
    ),
    (
        "max_tool_calls",
        "max_tool_calls is not supported; use parallel_tool_calls.",
    ),
];

fn asks_for_nothing(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(Value::is_null),
        Value::Number(n) => n.as_u64() == Some(0),
        Value::String(_) | Value::Bool(true) => false,
    }
}

/// Refuses the fields sluice cannot serve; names the others in a debug log line
/// (`service_tier`, `safety_identifier`, `prompt_cache_key`, `stream_options`: they route,
/// tag or pad a request, and sluice's prefix cache needs no key).
pub fn check_extra_fields(extra: &ExtraFields) -> Result<(), ApiError> {
    for (name, value) in extra {
        if asks_for_nothing(value) {
            continue;
        }
        if let Some((field, message)) = UNSUPPORTED.iter().find(|(f, _)| f == name) {
            return Err(ApiError::invalid(*field, *message));
        }
        tracing::debug!(field = %name, "request field not used by this server; ignored");
    }
    Ok(())
}

fn message(role: &str, content: String) -> ChatMessageIn {
    ChatMessageIn {
        role: role.into(),
        content: MessageContent(content),
        name: None,
        tool_calls: None,
        tool_call_id: None,
    }
}

fn string_field(item: &Map<String, Value>, key: &str, at: &str) -> Result<String, ApiError> {
    match item.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(ApiError::invalid(
            format!("{at}.{key}"),
            format!("`{key}` must be a string."),
        )),
    }
}

/// A message's `content`: a string, or text parts (`input_text`, `output_text`) joined with
/// newlines. Images, files and audio are refused: the model reads text.
fn content_text(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{at}.content[{j}]");
                let kind = part.get("type").and_then(Value::as_str);
                match kind {
                    Some("input_text" | "output_text" | "text") => match part.get("text") {
                        Some(Value::String(t)) => texts.push(t.clone()),
                        _ => {
                            return Err(ApiError::invalid(
                                format!("{at}.text"),
                                "a text part needs a string `text`.",
                            ))
                        }
                    },
                    Some("refusal") => {
                        texts.push(string_field(part.as_object().unwrap_or(&Map::new()), "refusal", &at)?)
                    }
                    Some(other) => {
                        return Err(ApiError::invalid(
                            format!("{at}.type"),
                            format!("content parts of type `{other}` are not supported; this model reads text only."),
                        ))
                    }
                    None => {
                        return Err(ApiError::invalid(
                            format!("{at}.type"),
                            "each content part needs a `type`.",
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(ApiError::invalid(
            format!("{at}.content"),
            "content must be a string or a list of parts.",
        )),
    }
}

/// The `input` as chat messages (without `instructions`).
pub fn input_messages(input: ResponseInput) -> Result<Vec<ChatMessageIn>, ApiError> {
    let items = match input {
        ResponseInput::Text(text) => return Ok(vec![message("user", text)]),
        ResponseInput::Items(items) => items,
    };
    let mut out: Vec<ChatMessageIn> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let Value::Object(item) = item else {
            return Err(ApiError::invalid(at, "each input item must be an object."));
        };
        // A message may leave its `type` out.
        let kind = match item.get("type").and_then(Value::as_str) {
            Some(kind) => kind,
            None if item.contains_key("role") => "message",
            None => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    "each input item needs a `type` (or a `role`, for a message).",
                ))
            }
        };
        match kind {
            "message" => {
                let role = string_field(item, "role", &at)?;
                let role = match role.as_str() {
                    "user" | "assistant" | "system" => role,
                    "developer" => "system".into(),
                    other => {
                        return Err(ApiError::invalid(
                            format!("{at}.role"),
                            format!("the role `{other}` is not supported; use user, assistant, system or developer."),
                        ))
                    }
                };
                out.push(message(&role, content_text(item.get("content"), &at)?));
            }
            "function_call" => {
                let call = ToolCallIn {
                    id: Some(string_field(item, "call_id", &at)?),
                    kind: Some("function".into()),
                    function: FunctionCallIn {
                        name: string_field(item, "name", &at)?,
                        arguments: Value::String(string_field(item, "arguments", &at)?),
                    },
                };
                // Calls of one turn join the assistant message before them.
                match out.last_mut() {
                    Some(last) if last.role == "assistant" => {
                        last.tool_calls.get_or_insert_with(Vec::new).push(call)
                    }
                    _ => {
                        let mut turn = message("assistant", String::new());
                        turn.tool_calls = Some(vec![call]);
                        out.push(turn);
                    }
                }
            }
            "function_call_output" => {
                let call_id = string_field(item, "call_id", &at)?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(parts @ Value::Array(_)) => content_text(Some(parts), &at)?,
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{at}.output"),
                            "`output` must be a string or a list of text parts.",
                        ))
                    }
                };
                let mut result = message("tool", output);
                result.tool_call_id = Some(call_id);
                out.push(result);
            }
            // Earlier reasoning is not shown to the model again (thinking models' chat
            // templates drop it from the history too).
            "reasoning" => {}
            other => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!("input items of type `{other}` are not supported; use message, function_call, function_call_output or reasoning."),
                ))
            }
        }
    }
    Ok(out)
}

/// The Responses API's flat function tools as chat completions' `tools`.
pub fn tools(tools: Option<Vec<Value>>) -> Result<Option<Vec<Value>>, ApiError> {
    let Some(tools) = tools else {
        return Ok(None);
    };
    tools
        .into_iter()
        .enumerate()
        .map(|(i, tool)| {
            let Value::Object(mut tool) = tool else {
                return Err(ApiError::invalid(
                    format!("tools[{i}]"),
                    "a tool must be an object.",
                ));
            };
            match tool.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        format!("tools[{i}].type"),
                        format!("tools of type `{other}` are not supported; only `function`."),
                    ))
                }
                None => {
                    return Err(ApiError::invalid(
                        format!("tools[{i}].type"),
                        "each tool needs a `type`.",
                    ))
                }
            }
            tool.remove("type");
            Ok(json!({"type": "function", "function": tool}))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or `{"type": "function", "name"}`.
pub fn tool_choice(choice: Option<Value>) -> Result<Option<ToolChoice>, ApiError> {
    let invalid = || {
        ApiError::invalid(
            "tool_choice",
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}.",
        )
    };
    match choice {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(Some(ToolChoice::None)),
            "auto" => Ok(Some(ToolChoice::Auto)),
            "required" => Ok(Some(ToolChoice::Required)),
            _ => Err(invalid()),
        },
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            match o.get("name").and_then(Value::as_str) {
                Some(name) => Ok(Some(ToolChoice::Function(name.into()))),
                None => Err(invalid()),
            }
        }
        Some(_) => Err(invalid()),
    }
}

/// The grammar `text.format` asks for, through the same path as chat's `response_format`.
pub fn text_grammar(text: Option<&TextConfig>) -> Result<Option<RequestedGrammar>, ApiError> {
    let format = match text.and_then(|t| t.format.clone()) {
        None => return Ok(None),
        Some(TextFormat::Text) => ResponseFormat::Text,
        Some(TextFormat::JsonObject) => ResponseFormat::JsonObject,
        Some(TextFormat::JsonSchema {
            name,
            description,
            schema,
            strict,
        }) => ResponseFormat::JsonSchema {
            json_schema: JsonSchemaFormat {
                name,
                description,
                schema,
                strict,
            },
        },
    };
    let rename = |mut e: ApiError| {
        if let Some(p) = e.param.as_mut() {
            *p = p
                .replace("response_format.json_schema", "text.format")
                .replace("response_format", "text.format");
        }
        e
    };
    let requested = structured::requested_grammar(ConstraintFields {
        response_format: Some(format),
        ..ConstraintFields::default()
    })
    .map_err(rename)?;
    Ok(requested.map(|r| RequestedGrammar {
        param: "text.format",
        ..r
    }))
}

fn item_id(prefix: &str) -> String {
    random_id(prefix, '_')
}

pub fn reasoning_item(id: String, text: String, status: &'static str) -> OutputItem {
    OutputItem::Reasoning {
        id,
        summary: Vec::new(),
        content: vec![ContentPart::ReasoningText { text }],
        status,
    }
}

pub fn message_item(id: String, text: String, status: &'static str) -> OutputItem {
    OutputItem::Message {
        id,
        status,
        role: "assistant",
        content: vec![ContentPart::OutputText {
            text,
            annotations: Vec::new(),
        }],
    }
}

pub fn call_item(
    id: String,
    call_id: String,
    name: String,
    arguments: String,
    status: &'static str,
) -> OutputItem {
    OutputItem::FunctionCall {
        id,
        call_id,
        name,
        arguments,
        status,
    }
}

/// New ids of output items, by kind.
pub fn new_item_id(item: ItemKind) -> String {
    match item {
        ItemKind::Reasoning => item_id("rs"),
        ItemKind::Message => item_id("msg"),
        ItemKind::FunctionCall => item_id("fc"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemKind {
    Reasoning,
    Message,
    FunctionCall,
}

/// The output items of a finished answer: its reasoning, its text, its calls. `status` is
/// that of the items (`incomplete` when the answer was cut at `max_output_tokens`).
pub fn output_items(
    reasoning: String,
    text: String,
    calls: Vec<ToolCallOut>,
    status: &'static str,
) -> Vec<OutputItem> {
    let mut items = Vec::with_capacity(2 + calls.len());
    if !reasoning.is_empty() {
        items.push(reasoning_item(
            new_item_id(ItemKind::Reasoning),
            reasoning,
            status,
        ));
    }
    if !text.is_empty() || calls.is_empty() {
        items.push(message_item(new_item_id(ItemKind::Message), text, status));
    }
    items.extend(calls.into_iter().map(|c| {
        call_item(
            new_item_id(ItemKind::FunctionCall),
            c.id,
            c.function.name,
            c.function.arguments,
            status,
        )
    }));
    items
}

/// The assistant's turn that `items` make, for a response that continues this one.
pub fn conversation_turn(items: &[OutputItem]) -> Option<ChatMessageIn> {
    let mut turn = message("assistant", String::new());
    let mut any = false;
    for item in items {
        match item {
            OutputItem::Reasoning { .. } => {}
            OutputItem::Message { content, .. } => {
                for part in content {
                    if let ContentPart::OutputText { text, .. } = part {
                        turn.content.0.push_str(text);
                        any = true;
                    }
                }
            }
            OutputItem::FunctionCall {
                call_id,
                name,
                arguments,
                ..
            } => {
                turn.tool_calls
                    .get_or_insert_with(Vec::new)
                    .push(ToolCallIn {
                        id: Some(call_id.clone()),
                        kind: Some("function".into()),
                        function: FunctionCallIn {
                            name: name.clone(),
                            arguments: Value::String(arguments.clone()),
                        },
                    });
                any = true;
            }
        }
    }
    any.then_some(turn)
}

/// A response's status for the engine's finish, and why it is incomplete; `None` for an
/// abort (the server shutting down) or a failure, which are answered as errors.
pub fn status(reason: FinishReason) -> Option<(&'static str, Option<IncompleteDetails>)> {
    match reason {
        FinishReason::Stop => Some(("completed", None)),
        FinishReason::Length => Some((
            "incomplete",
            Some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
        )),
        FinishReason::Abort | FinishReason::Error => None,
    }
}

/// The error an aborted response gets.
pub fn aborted() -> ApiError {
    ApiError::unavailable("The server stopped the response before it finished (shutting down).")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(v: Value) -> ResponseInput {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn input_items_become_a_conversation() {
        let m = input_messages(items(json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "call_1", "name": "w", "arguments": "{\"city\": \"Rome\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ])))
        .unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(m[1].content.0, "Weather?");
        assert_eq!(m[2].tool_calls.as_ref().unwrap().len(), 2);
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(
            input_messages(ResponseInput::Text("hi".into())).unwrap()[0].role,
            "user"
        );
    }

    #[test]
    fn bad_input_names_the_field() {
        let param = |v: Value| input_messages(items(v)).unwrap_err().param.unwrap();
        assert_eq!(
            param(json!([{"role": "wizard", "content": "x"}])),
            "input[0].role"
        );
        assert_eq!(
            param(
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
            ),
            "input[0].content[0].type"
        );
        assert_eq!(
            param(json!([{"type": "function_call", "name": "w", "arguments": "{}"}])),
            "input[0].call_id"
        );
        assert_eq!(param(json!([{"type": "web_search_call"}])), "input[0].type");
        assert_eq!(param(json!([5])), "input[0]");
    }

    #[test]
    fn tools_choices_and_formats_translate() {
        let t = tools(Some(vec![json!({"type": "function", "name": "w", "parameters": {"type": "object"}, "strict": true})]))
            .unwrap()
            .unwrap();
        assert_eq!(
            t[0],
            json!({"type": "function", "function": {"name": "w", "parameters": {"type": "object"}, "strict": true}})
        );
        let e = tools(Some(vec![json!({"type": "web_search"})])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        assert_eq!(
            tool_choice(Some(json!("required"))).unwrap(),
            Some(ToolChoice::Required)
        );
        assert_eq!(
            tool_choice(Some(json!({"type": "function", "name": "w"}))).unwrap(),
            Some(ToolChoice::Function("w".into()))
        );
        assert!(tool_choice(Some(json!({"type": "file_search"}))).is_err());
        let text: TextConfig =
            serde_json::from_value(json!({"format": {"type": "json_schema", "name": "x",
            "schema": {"type": "object"}, "strict": true}}))
            .unwrap();
        let g = text_grammar(Some(&text)).unwrap().unwrap();
        assert_eq!(g.param, "text.format");
        let text: TextConfig =
            serde_json::from_value(json!({"format": {"type": "json_schema", "schema": "{oops"}}))
                .unwrap();
        assert_eq!(
            text_grammar(Some(&text)).unwrap_err().param.as_deref(),
            Some("text.format.schema")
        );
        let text: TextConfig = serde_json::from_value(json!({"format": {"type": "text"}})).unwrap();
        assert!(text_grammar(Some(&text)).unwrap().is_none());
    }

    #[test]
    fn unsupported_fields_are_refused_and_empty_ones_allowed() {
        let extra = |v: Value| v.as_object().unwrap().clone();
        check_extra_fields(&extra(
            json!({"include": [], "reasoning": null, "top_logprobs": 0,
            "background": false, "service_tier": "auto", "prompt_cache_key": "k"}),
        ))
        .unwrap();
        for field in ["include", "reasoning", "top_logprobs", "background"] {
            let value = match field {
                "include" => json!(["message.output_text.logprobs"]),
                "reasoning" => json!({"effort": "low"}),
                "top_logprobs" => json!(2),
                _ => json!(true),
            };
            let e = check_extra_fields(&extra(json!({ field: value }))).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field));
        }
    }

    #[test]
    fn output_items_and_the_turn_they_make() {
        let calls = vec![ToolCallOut {
            id: "call_1".into(),
            kind: "function",
            function: crate::openai::structured::FunctionCallOut {
                name: "w".into(),
                arguments: "{}".into(),
            },
        }];
        let items = output_items("hm".into(), "Checking.".into(), calls, "completed");
        assert_eq!(items.len(), 3);
        assert!(
            matches!(&items[2], OutputItem::FunctionCall { call_id, .. } if call_id == "call_1")
        );
        let turn = conversation_turn(&items).unwrap();
        assert_eq!(turn.content.0, "Checking.");
        assert_eq!(turn.tool_calls.unwrap()[0].function.name, "w");
    }
}
