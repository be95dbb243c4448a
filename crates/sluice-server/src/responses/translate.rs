//! A Responses request as the chat pipeline runs it, and a finished choice as output items:
//! `instructions` and `input` items to chat messages (a `function_call` item becomes an
//! assistant's tool call, a `function_call_output` a `tool` message), flat function tools and
//! `tool_choice` to chat completions' (checked by [`crate::chat::tools::plan`]), `text.format`
//! to the structured-output grammar, and the engine's finish to the response's status.

use serde::Deserialize;
use serde_json::{json, Map, Value};
use sluice_engine::FinishReason;

use super::types::{
    ContentPart, IncompleteDetails, OutputItem, ReasoningConfig, ResponseInput, TextConfig,
    TextFormat,
};
use crate::chat::grammar::{self, ConstraintFields, RequestedGrammar};
use crate::chat::thinking::ThinkingRequest;
use crate::edge::error::ApiError;
use crate::edge::ids::random_id;
use crate::media::{Detail, ImageInput, ImageSource};
use crate::openai::chat::{ChatMessageIn, MessageContent};
use crate::openai::structured::{
    FunctionCallIn, JsonSchemaFormat, ResponseFormat, ToolCallIn, ToolCallOut, ToolChoice,
};

/// `include`'s extra output: `reasoning.encrypted_content` is served (reasoning items carry an
/// opaque token of themselves); the rest asks for output sluice does not make, refused by
/// name. Returns whether reasoning tokens are asked for.
pub fn check_include(include: Option<&[String]>) -> Result<bool, ApiError> {
    let mut encrypted = false;
    for (i, what) in include.unwrap_or_default().iter().enumerate() {
        match what.as_str() {
            "reasoning.encrypted_content" => encrypted = true,
            "message.output_text.logprobs" => {
                return Err(ApiError::invalid(
                    format!("include[{i}]"),
                    "logprobs are not supported on this API; use /v1/chat/completions.",
                ))
            }
            other => {
                return Err(ApiError::invalid(
                    format!("include[{i}]"),
                    format!(
                        "`{other}` is output of a hosted tool or input this server does not \
                         keep; only `reasoning.encrypted_content` can be included."
                    ),
                ))
            }
        }
    }
    Ok(encrypted)
}

/// What `reasoning` asks of the template ([`crate::chat::thinking`]): its `effort`. A summary is
/// not written: a thinking model's reasoning comes back whole as the item's content.
pub fn thinking_request(reasoning: Option<&ReasoningConfig>) -> ThinkingRequest {
    ThinkingRequest {
        enabled: None,
        effort: reasoning.and_then(|r| r.effort),
    }
}

/// Tools the Responses API runs on OpenAI's side (search, code, images, computers, remote
/// MCP): sluice cannot run them, so they are left out of the prompt and named in the
/// response's `x-sluice-omitted-tools` header.
const HOSTED_TOOLS: &[&str] = &[
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "computer",
    "mcp",
    "tool_search",
    "local_shell",
];

/// The response header that names the hosted tools left out.
pub const OMITTED_TOOLS_HEADER: &str = "x-sluice-omitted-tools";

/// How the model sees a function of a `namespace` tool: one flat function, `{namespace}__{name}`
/// (the names allowed in a function name have no other separator).
pub fn flat_name(namespace: &str, name: &str) -> String {
    format!("{namespace}__{name}")
}

/// The functions that came in `namespace` tools, by the flat name the model calls them by.
#[derive(Debug, Clone, Default)]
pub struct ToolNames {
    namespaced: Vec<(String, String, String)>,
}

impl ToolNames {
    /// The namespace and name of the function the model called `flat`, if it was namespaced.
    pub fn split(&self, flat: &str) -> Option<(&str, &str)> {
        self.namespaced
            .iter()
            .find(|(f, _, _)| f == flat)
            .map(|(_, ns, name)| (ns.as_str(), name.as_str()))
    }
}

/// How output items are written for a request: with reasoning tokens (`include`), and with
/// namespaced calls split back.
#[derive(Debug, Clone, Default)]
pub struct ItemStyle {
    pub encrypted_reasoning: bool,
    pub names: ToolNames,
}

fn message(role: &str, content: MessageContent) -> ChatMessageIn {
    ChatMessageIn {
        role: role.into(),
        content,
        name: None,
        tool_calls: None,
        tool_call_id: None,
        reasoning_content: None,
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

/// An `input_image` part (`at` names it): `image_url` (a data URI or an http(s) URL) and
/// `detail`; `file_id` is refused, there being no files API here.
fn input_image(part: &Value, at: &str) -> Result<ImageInput, ApiError> {
    if part.get("file_id").is_some_and(|f| !f.is_null()) {
        return Err(ApiError::invalid(
            format!("{at}.file_id"),
            "`file_id` names an uploaded file, and this server has no files API; send the \
             image as `image_url` (a data URI or an http(s) URL).",
        ));
    }
    let field = format!("{at}.image_url");
    let url =
        match part.get("image_url") {
            Some(Value::String(url)) => url,
            _ => return Err(ApiError::invalid(
                field,
                "an input_image part needs an `image_url` string (a data URI or an http(s) URL).",
            )),
        };
    let detail = match part.get("detail") {
        None | Some(Value::Null) => Detail::Auto,
        Some(d) => Detail::deserialize(d).map_err(|_| {
            ApiError::invalid(
                format!("{at}.detail"),
                "`detail` must be one of auto, low or high.",
            )
        })?,
    };
    let source = ImageSource::parse(url).map_err(|e| e.at(field.clone()))?;
    Ok(ImageInput {
        source,
        detail,
        field,
    })
}

/// A message's `content` (or a call output's `output`; `at` names that field): a string, or
/// text parts (`input_text`, `output_text`) and `input_image` parts, in order. Files and
/// audio are refused.
fn content_parts(content: Option<&Value>, at: &str) -> Result<MessageContent, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(MessageContent::default()),
        Some(Value::String(s)) => Ok(MessageContent::text(s.clone())),
        Some(Value::Array(parts)) => {
            let mut out = MessageContent::default();
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{at}[{j}]");
                let kind = part.get("type").and_then(Value::as_str);
                match kind {
                    Some("input_text" | "output_text" | "text") => match part.get("text") {
                        Some(Value::String(t)) => out.push_text(t.clone()),
                        _ => {
                            return Err(ApiError::invalid(
                                format!("{at}.text"),
                                "a text part needs a string `text`.",
                            ))
                        }
                    },
                    Some("refusal") => out.push_text(string_field(
                        part.as_object().unwrap_or(&Map::new()),
                        "refusal",
                        &at,
                    )?),
                    Some("input_image") => out.push_image(input_image(part, &at)?),
                    Some(other) => {
                        return Err(ApiError::invalid(
                            format!("{at}.type"),
                            format!(
                                "content parts of type `{other}` are not supported; send \
                                 input_text and input_image parts."
                            ),
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
            Ok(out)
        }
        Some(_) => Err(ApiError::invalid(
            at,
            "content must be a string or a list of parts.",
        )),
    }
}

/// The `input` as chat messages (without `instructions`).
pub fn input_messages(input: ResponseInput) -> Result<Vec<ChatMessageIn>, ApiError> {
    let items = match input {
        ResponseInput::Text(text) => return Ok(vec![message("user", MessageContent::text(text))]),
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
                let content = content_parts(item.get("content"), &format!("{at}.content"))?;
                out.push(message(&role, content));
            }
            "function_call" => {
                let name = string_field(item, "name", &at)?;
                let name = match item.get("namespace").and_then(Value::as_str) {
                    Some(namespace) => flat_name(namespace, &name),
                    None => name,
                };
                let call = ToolCallIn {
                    id: Some(string_field(item, "call_id", &at)?),
                    kind: Some("function".into()),
                    function: FunctionCallIn {
                        name,
                        arguments: Value::String(string_field(item, "arguments", &at)?),
                    },
                };
                // Calls of one turn join the assistant message before them.
                match out.last_mut() {
                    Some(last) if last.role == "assistant" => {
                        last.tool_calls.get_or_insert_with(Vec::new).push(call)
                    }
                    _ => {
                        let mut turn = message("assistant", MessageContent::default());
                        turn.tool_calls = Some(vec![call]);
                        out.push(turn);
                    }
                }
            }
            "function_call_output" => {
                let call_id = string_field(item, "call_id", &at)?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => MessageContent::text(s.clone()),
                    Some(parts @ Value::Array(_)) => {
                        content_parts(Some(parts), &format!("{at}.output"))?
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{at}.output"),
                            "`output` must be a string or a list of text and image parts.",
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

/// The tools of a request, as the model is shown them.
#[derive(Debug, Default)]
pub struct Tools {
    /// Chat completions' `tools`; `None` for none.
    pub tools: Option<Vec<Value>>,
    pub names: ToolNames,
    /// Hosted tools left out ([`HOSTED_TOOLS`]), by type.
    pub omitted: Vec<String>,
}

/// One function tool (`{"type": "function", "name", ...}`) as chat completions' tool.
fn function_tool(mut tool: Map<String, Value>) -> Value {
    tool.remove("type");
    json!({"type": "function", "function": tool})
}

/// The Responses API's tools as chat completions' `tools`: function tools as they are,
/// `namespace` tools (Codex's groups of functions) as flat functions ([`flat_name`], the
/// group's description before each function's), hosted tools left out.
pub fn tools(tools: Option<Vec<Value>>) -> Result<Tools, ApiError> {
    let Some(tools) = tools else {
        return Ok(Tools::default());
    };
    let mut out = Tools::default();
    let mut flat = Vec::with_capacity(tools.len());
    for (i, tool) in tools.into_iter().enumerate() {
        let Value::Object(tool) = tool else {
            return Err(ApiError::invalid(
                format!("tools[{i}]"),
                "a tool must be an object.",
            ));
        };
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => flat.push(function_tool(tool)),
            Some("namespace") => {
                let namespace = string_field(&tool, "name", &format!("tools[{i}]"))?;
                let about = tool
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let Some(Value::Array(members)) = tool.get("tools") else {
                    return Err(ApiError::invalid(
                        format!("tools[{i}].tools"),
                        "a namespace tool needs a list of `tools`.",
                    ));
                };
                for (j, member) in members.iter().enumerate() {
                    let at = format!("tools[{i}].tools[{j}]");
                    let Some(mut member) = member.as_object().cloned() else {
                        return Err(ApiError::invalid(at, "a tool must be an object."));
                    };
                    if member.get("type").and_then(Value::as_str) != Some("function") {
                        return Err(ApiError::invalid(
                            format!("{at}.type"),
                            "a namespace holds function tools only here.",
                        ));
                    }
                    let name = string_field(&member, "name", &at)?;
                    let flat_name = flat_name(&namespace, &name);
                    let own = member
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    let description = match (about.is_empty(), own.is_empty()) {
                        (true, _) => own.to_string(),
                        (false, true) => about.to_string(),
                        (false, false) => format!("{about}\n\n{own}"),
                    };
                    member.insert("name".into(), Value::String(flat_name.clone()));
                    member.insert("description".into(), Value::String(description));
                    out.names
                        .namespaced
                        .push((flat_name, namespace.clone(), name));
                    flat.push(function_tool(member));
                }
            }
            Some(hosted) if HOSTED_TOOLS.contains(&hosted) => out.omitted.push(hosted.into()),
            Some(other) => {
                return Err(ApiError::invalid(
                    format!("tools[{i}].type"),
                    format!(
                        "tools of type `{other}` are not supported; use `function` or \
                         `namespace` (hosted tools are left out)."
                    ),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    format!("tools[{i}].type"),
                    "each tool needs a `type`.",
                ))
            }
        }
    }
    out.tools = (!flat.is_empty()).then_some(flat);
    Ok(out)
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
    let requested = grammar::requested_grammar(ConstraintFields {
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

/// The opaque token of a reasoning item's text (`include: ["reasoning.encrypted_content"]`):
/// sluice keeps no secret from the client whose model wrote it, so it is the text in base64.
pub fn reasoning_token(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

pub fn reasoning_item(
    id: String,
    text: String,
    status: &'static str,
    style: &ItemStyle,
) -> OutputItem {
    OutputItem::Reasoning {
        id,
        summary: Vec::new(),
        encrypted_content: style.encrypted_reasoning.then(|| reasoning_token(&text)),
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

/// A call item; a call of a namespaced function names its namespace and its own name.
pub fn call_item(
    id: String,
    call_id: String,
    name: String,
    arguments: String,
    status: &'static str,
    style: &ItemStyle,
) -> OutputItem {
    let (namespace, name) = match style.names.split(&name) {
        Some((namespace, own)) => (Some(namespace.to_string()), own.to_string()),
        None => (None, name),
    };
    OutputItem::FunctionCall {
        id,
        call_id,
        namespace,
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
    style: &ItemStyle,
) -> Vec<OutputItem> {
    let mut items = Vec::with_capacity(2 + calls.len());
    if !reasoning.is_empty() {
        items.push(reasoning_item(
            new_item_id(ItemKind::Reasoning),
            reasoning,
            status,
            style,
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
            style,
        )
    }));
    items
}

/// The assistant's turn that `items` make, for a response that continues this one.
pub fn conversation_turn(items: &[OutputItem]) -> Option<ChatMessageIn> {
    let mut turn = message("assistant", MessageContent::default());
    let mut text = String::new();
    let mut any = false;
    for item in items {
        match item {
            OutputItem::Reasoning { .. } => {}
            OutputItem::Message { content, .. } => {
                for part in content {
                    if let ContentPart::OutputText {
                        text: part_text, ..
                    } = part
                    {
                        text.push_str(part_text);
                        any = true;
                    }
                }
            }
            OutputItem::FunctionCall {
                call_id,
                namespace,
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
                            name: match namespace {
                                Some(namespace) => flat_name(namespace, name),
                                None => name.clone(),
                            },
                            arguments: Value::String(arguments.clone()),
                        },
                    });
                any = true;
            }
        }
    }
    turn.content = MessageContent::text(text);
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
    use crate::edge::field_policy;

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
        assert_eq!(m[1].content.template_text(), "Weather?");
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
            param(json!([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}])),
            "input[0].content[0].type"
        );
        assert_eq!(
            param(json!([{"type": "function_call", "name": "w", "arguments": "{}"}])),
            "input[0].call_id"
        );
        assert_eq!(param(json!([{"type": "web_search_call"}])), "input[0].type");
        assert_eq!(param(json!([5])), "input[0]");
    }

    /// `input_image` parts keep their place among the text, in messages and in a call's
    /// output; each bad one is refused naming its field.
    #[test]
    fn images_are_parts_in_order() {
        let m = input_messages(items(json!([
            {"role": "user", "content": [
                {"type": "input_text", "text": "Compare"},
                {"type": "input_image", "image_url": "data:image/png;base64,aGk=", "detail": "high"},
                {"type": "input_image", "image_url": "https://example.com/b.png"}]},
            {"type": "function_call", "call_id": "c", "name": "shot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": [
                {"type": "input_image", "image_url": "data:image/png;base64,aGk="}]}
        ])))
        .unwrap();
        let images: Vec<_> = m[0].content.images().collect();
        assert_eq!(images.len(), 2);
        assert_eq!(images[0].field, "input[0].content[1].image_url");
        assert_eq!(images[0].detail, crate::media::Detail::High);
        assert_eq!(images[1].field, "input[0].content[2].image_url");
        let marker = crate::media::marker::marker();
        assert_eq!(
            m[0].content.template_text(),
            format!("Compare{marker}{marker}")
        );
        assert_eq!(
            m[2].content.images().next().unwrap().field,
            "input[2].output[0].image_url"
        );

        let param = |part: Value| {
            input_messages(items(json!([{"role": "user", "content": [part]}])))
                .unwrap_err()
                .param
                .unwrap()
        };
        assert_eq!(
            param(json!({"type": "input_image", "file_id": "file-1"})),
            "input[0].content[0].file_id"
        );
        assert_eq!(
            param(json!({"type": "input_image", "image_url": "x"})),
            "input[0].content[0].image_url"
        );
        assert_eq!(
            param(json!({"type": "input_image"})),
            "input[0].content[0].image_url"
        );
        assert_eq!(
            param(
                json!({"type": "input_image", "image_url": "data:image/png;base64,aGk=",
                         "detail": "ultra"})
            ),
            "input[0].content[0].detail"
        );
    }

    #[test]
    fn tools_choices_and_formats_translate() {
        let t = tools(Some(vec![json!({"type": "function", "name": "w", "parameters": {"type": "object"}, "strict": true})]))
            .unwrap()
            .tools
            .unwrap();
        assert_eq!(
            t[0],
            json!({"type": "function", "function": {"name": "w", "parameters": {"type": "object"}, "strict": true}})
        );
        // Hosted tools are left out and named; unknown kinds are refused.
        let t = tools(Some(vec![
            json!({"type": "web_search", "external_web_access": false}),
        ]))
        .unwrap();
        assert!(t.tools.is_none());
        assert_eq!(t.omitted, ["web_search"]);
        let e = tools(Some(vec![json!({"type": "custom", "name": "x"})])).unwrap_err();
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

    /// Codex's namespace tools: flat functions for the model, split back in its calls.
    #[test]
    fn namespace_tools_are_flat_for_the_model_and_split_in_calls() {
        let t = tools(Some(vec![
            json!({"type": "namespace", "name": "multi_agent_v1",
            "description": "Sub-agents.", "tools": [{"type": "function", "name": "close_agent",
            "description": "Close one.", "parameters": {"type": "object"}}]}),
        ]))
        .unwrap();
        let f = &t.tools.as_ref().unwrap()[0]["function"];
        assert_eq!(f["name"], "multi_agent_v1__close_agent");
        assert_eq!(f["description"], "Sub-agents.\n\nClose one.");
        let style = ItemStyle {
            encrypted_reasoning: false,
            names: t.names,
        };
        let item = call_item(
            "fc_1".into(),
            "call_1".into(),
            "multi_agent_v1__close_agent".into(),
            "{}".into(),
            "completed",
            &style,
        );
        let v = serde_json::to_value(&item).unwrap();
        assert_eq!(v["namespace"], "multi_agent_v1");
        assert_eq!(v["name"], "close_agent");
        // The call comes back in a later request's input, and in a stored turn, flat again.
        let turn = conversation_turn(&[item]).unwrap();
        assert_eq!(
            turn.tool_calls.unwrap()[0].function.name,
            "multi_agent_v1__close_agent"
        );
        let m = input_messages(ResponseInput::Items(vec![json!({"type": "function_call",
            "call_id": "c", "namespace": "multi_agent_v1", "name": "close_agent",
            "arguments": "{}"})]))
        .unwrap();
        assert_eq!(
            m[0].tool_calls.as_ref().unwrap()[0].function.name,
            "multi_agent_v1__close_agent"
        );
    }

    #[test]
    fn include_is_served_or_refused_by_name() {
        assert!(!check_include(None).unwrap());
        assert!(check_include(Some(&["reasoning.encrypted_content".to_string()])).unwrap());
        let e = check_include(Some(&[
            "reasoning.encrypted_content".to_string(),
            "file_search_call.results".to_string(),
        ]))
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("include[1]"));
        let style = ItemStyle {
            encrypted_reasoning: true,
            names: ToolNames::default(),
        };
        let item = reasoning_item("rs_1".into(), "hm".into(), "completed", &style);
        let v = serde_json::to_value(&item).unwrap();
        assert_eq!(v["encrypted_content"], reasoning_token("hm"));
        // Sent back as input, it is accepted (and not shown to the model again).
        let m = input_messages(ResponseInput::Items(vec![v])).unwrap();
        assert!(m.is_empty());
    }

    #[test]
    fn unsupported_fields_are_refused_and_empty_ones_allowed() {
        let extra = |v: Value| v.as_object().unwrap().clone();
        field_policy::RESPONSES
            .check(&extra(
                json!({"top_logprobs": 0, "background": false, "service_tier": "auto",
            "prompt_cache_key": "k", "client_metadata": {"thread_id": "t"}}),
            ))
            .unwrap();
        for field in ["top_logprobs", "background", "frobnicate"] {
            let value = match field {
                "top_logprobs" => json!(2),
                _ => json!(true),
            };
            let e = field_policy::RESPONSES
                .check(&extra(json!({ field: value })))
                .unwrap_err();
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
        let items = output_items(
            "hm".into(),
            "Checking.".into(),
            calls,
            "completed",
            &ItemStyle::default(),
        );
        assert_eq!(items.len(), 3);
        assert!(
            matches!(&items[2], OutputItem::FunctionCall { call_id, .. } if call_id == "call_1")
        );
        let turn = conversation_turn(&items).unwrap();
        assert_eq!(turn.content.template_text(), "Checking.");
        assert_eq!(turn.tool_calls.unwrap()[0].function.name, "w");
    }
}
