//! A Messages request as the chat pipeline runs it, and a finished choice as Anthropic's
//! content blocks: system and messages to chat messages (`tool_use` blocks become the
//! assistant's tool calls, `tool_result` blocks `tool` messages), Anthropic's tools and
//! `tool_choice` to chat completions' (checked by [`crate::tool_calls::plan`]), and the
//! engine's finish to `stop_reason`.

use serde_json::{json, Value};
use sluice_engine::{FinishEvent, FinishReason, Grammar, StopReason};

use super::types::{
    ContentBlockIn, ContentBlockOut, MessageContentIn, MessageIn, OutputConfig, OutputFormat,
    TextContent, ToolChoiceIn, ToolIn,
};
use crate::error::ApiError;
use crate::openai::chat::{ChatMessageIn, MessageContent};
use crate::openai::structured::{ExtraFields, FunctionCallIn, ToolCallIn, ToolCallOut, ToolChoice};
use crate::structured::RequestedGrammar;

/// Fields of Anthropic's API that ask for what sluice cannot do: refused by name.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "thinking",
        "extended thinking budgets are not supported; a model that thinks does so as its chat \
         template says.",
    ),
    (
        "mcp_servers",
        "MCP servers are not supported by this server.",
    ),
    ("container", "containers are not supported by this server."),
    (
        "diagnostics",
        "prompt-cache diagnostics are not reported by this server.",
    ),
    (
        "context_management",
        "context management is not supported by this server.",
    ),
];

/// Refuses the fields sluice cannot serve; names the others in a debug log line: `metadata`,
/// `service_tier`, `inference_geo`, `speed`, `user_profile_id`, `workspace_id` only tag or route
/// a request, and `cache_control` marks what to cache, which sluice's prefix cache does for
/// every prompt unasked.
pub fn check_extra_fields(extra: &ExtraFields) -> Result<(), ApiError> {
    for (name, value) in extra {
        if value.is_null() {
            continue;
        }
        if name == "thinking" && value.get("type").and_then(Value::as_str) == Some("disabled") {
            continue;
        }
        if let Some((field, message)) = UNSUPPORTED.iter().find(|(f, _)| f == name) {
            return Err(ApiError::invalid(*field, *message));
        }
        tracing::debug!(field = %name, "request field not used by this server; ignored");
    }
    Ok(())
}

/// The grammar `output_config` asks for, if any.
pub fn output_grammar(config: Option<OutputConfig>) -> Result<Option<RequestedGrammar>, ApiError> {
    let Some(config) = config else {
        return Ok(None);
    };
    if config.effort.is_some() {
        return Err(ApiError::invalid(
            "output_config.effort",
            "effort levels are not supported; a model that thinks does so as its chat template \
             says.",
        ));
    }
    Ok(config
        .format
        .map(|OutputFormat::JsonSchema { schema }| RequestedGrammar {
            grammar: Grammar::Json {
                schema: Value::Object(schema),
                // Anthropic's structured outputs are always enforced.
                strict: true,
            },
            param: "output_config.format",
        }))
}

fn chat_message(role: &str, content: String) -> ChatMessageIn {
    ChatMessageIn {
        role: role.into(),
        content: MessageContent(content),
        name: None,
        tool_calls: None,
        tool_call_id: None,
    }
}

/// The conversation in chat completions' terms.
pub fn messages(
    system: Option<TextContent>,
    messages: Vec<MessageIn>,
) -> Result<Vec<ChatMessageIn>, ApiError> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system {
        out.push(chat_message("system", system.into_text()));
    }
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must contain at least one message.",
        ));
    }
    let last = messages.len() - 1;
    for (i, m) in messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "user" => "user",
            "assistant" if i == last => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    "continuing a final assistant message (prefill) is not supported; end \
                     the conversation with a user message.",
                ))
            }
            "assistant" => "assistant",
            other => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!("the role `{other}` is not supported; use user or assistant."),
                ))
            }
        };
        let blocks = match m.content {
            MessageContentIn::Text(text) => {
                out.push(chat_message(role, text));
                continue;
            }
            MessageContentIn::Blocks(blocks) => blocks,
        };
        let mut texts: Vec<String> = Vec::new();
        let mut calls: Vec<ToolCallIn> = Vec::new();
        for (j, block) in blocks.into_iter().enumerate() {
            let field = || format!("messages[{i}].content[{j}]");
            match block {
                ContentBlockIn::Text { text } => texts.push(text),
                ContentBlockIn::ToolUse { id, name, input } => {
                    if role != "assistant" {
                        return Err(ApiError::invalid(
                            field(),
                            "tool_use blocks belong in assistant messages.",
                        ));
                    }
                    calls.push(ToolCallIn {
                        id: Some(id),
                        kind: Some("function".into()),
                        function: FunctionCallIn {
                            name,
                            arguments: input,
                        },
                    });
                }
                ContentBlockIn::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                } => {
                    if role != "user" {
                        return Err(ApiError::invalid(
                            field(),
                            "tool_result blocks belong in user messages.",
                        ));
                    }
                    let text = content.map(TextContent::into_text).unwrap_or_default();
                    // Chat templates have no field for a failed call: the result says so.
                    let text = if is_error == Some(true) {
                        format!("Error: {text}")
                    } else {
                        text
                    };
                    let mut message = chat_message("tool", text);
                    message.tool_call_id = Some(tool_use_id);
                    out.push(message);
                }
                // Earlier reasoning is not shown to the model again (thinking models' chat
                // templates drop it from the history too).
                ContentBlockIn::Thinking { .. } | ContentBlockIn::RedactedThinking { .. } => {}
            }
        }
        if !texts.is_empty() || !calls.is_empty() {
            let mut message = chat_message(role, texts.join("\n"));
            if !calls.is_empty() {
                message.tool_calls = Some(calls);
            }
            out.push(message);
        }
    }
    Ok(out)
}

/// Anthropic's tools as chat completions' `tools`; `None` for none.
pub fn tools(tools: Option<Vec<ToolIn>>) -> Result<Option<Vec<Value>>, ApiError> {
    let Some(tools) = tools else {
        return Ok(None);
    };
    tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
                return Err(ApiError::invalid(
                    format!("tools[{i}].type"),
                    format!("server tools (`{kind}`) are not supported; only client tools."),
                ));
            }
            let mut function = json!({"name": t.name});
            if let Some(d) = t.description {
                function["description"] = Value::String(d);
            }
            if let Some(schema) = t.input_schema {
                function["parameters"] = schema;
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// `tool_choice` in chat completions' terms, and `parallel_tool_calls`.
pub fn tool_choice(choice: Option<ToolChoiceIn>) -> (Option<ToolChoice>, Option<bool>) {
    let parallel = |disable: Option<bool>| disable.map(|d| !d);
    match choice {
        None => (None, None),
        Some(ToolChoiceIn::Auto {
            disable_parallel_tool_use,
        }) => (Some(ToolChoice::Auto), parallel(disable_parallel_tool_use)),
        Some(ToolChoiceIn::Any {
            disable_parallel_tool_use,
        }) => (
            Some(ToolChoice::Required),
            parallel(disable_parallel_tool_use),
        ),
        Some(ToolChoiceIn::Tool {
            name,
            disable_parallel_tool_use,
        }) => (
            Some(ToolChoice::Function(name)),
            parallel(disable_parallel_tool_use),
        ),
        Some(ToolChoiceIn::None) => (Some(ToolChoice::None), None),
    }
}

/// Anthropic's ids look like `toolu_...`; the pipeline's `call_...`.
pub fn tool_use_id(call_id: &str) -> String {
    match call_id.strip_prefix("call_") {
        Some(rest) => format!("toolu_{rest}"),
        None => call_id.to_string(),
    }
}

/// A call's arguments as the `input` object. A call the model wrote with arguments that are
/// no JSON (it chose freely, `tool_choice` auto) keeps its text, so nothing it wrote is lost.
pub fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
}

/// The content blocks of a finished answer: its thinking, its text, its calls.
pub fn content_blocks(
    reasoning: String,
    text: String,
    calls: Vec<ToolCallOut>,
) -> Vec<ContentBlockOut> {
    let mut blocks = Vec::with_capacity(2 + calls.len());
    if !reasoning.is_empty() {
        blocks.push(ContentBlockOut::Thinking {
            thinking: reasoning,
            signature: String::new(),
        });
    }
    if !text.is_empty() || calls.is_empty() {
        blocks.push(ContentBlockOut::Text { text });
    }
    blocks.extend(calls.into_iter().map(|c| ContentBlockOut::ToolUse {
        id: tool_use_id(&c.id),
        name: c.function.name,
        input: tool_input(&c.function.arguments),
    }));
    blocks
}

/// `stop_reason` and `stop_sequence` of a finished answer; `None` for an abort (the server
/// shutting down), which Anthropic's API has no reason for and is answered as an error.
pub fn stop_reason(event: &FinishEvent, called: bool) -> Option<(&'static str, Option<String>)> {
    match event.reason {
        FinishReason::Stop if called => Some(("tool_use", None)),
        FinishReason::Stop => match &event.stop_reason {
            Some(StopReason::String(s)) => Some(("stop_sequence", Some(s.clone()))),
            _ => Some(("end_turn", None)),
        },
        FinishReason::Length => Some(("max_tokens", None)),
        FinishReason::Abort | FinishReason::Error => None,
    }
}

/// The error an aborted answer gets.
pub fn aborted() -> ApiError {
    ApiError::unavailable("The server stopped the request before it finished (shutting down).")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Vec<MessageIn> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn tool_use_and_results_become_calls_and_tool_messages() {
        let m = messages(
            Some(TextContent::Text("Be brief.".into())),
            parse(json!([
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "text", "text": "And?"}]}
            ])),
        )
        .unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(m[2].content.0, "Checking.");
        let call = &m[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.function.arguments, json!({"city": "Paris"}));
        assert_eq!(m[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(m[3].content.0, "sunny");
    }

    #[test]
    fn bad_conversations_name_the_field() {
        let e = messages(None, parse(json!([{"role": "system", "content": "x"}]))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = messages(
            None,
            parse(json!([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].role"));
        assert_eq!(
            messages(None, vec![]).unwrap_err().param.as_deref(),
            Some("messages")
        );
        let e = messages(
            None,
            parse(json!([{"role": "user", "content": [
                {"type": "tool_use", "id": "a", "name": "f", "input": {}}]}])),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0]"));
        let bad: Result<Vec<MessageIn>, _> = serde_json::from_value(json!([{"role": "user",
            "content": [{"type": "image", "source": {}}]}]));
        assert!(bad.is_err());
    }

    #[test]
    fn tools_and_choices_translate() {
        let t: Vec<ToolIn> = serde_json::from_value(json!([{"name": "w", "description": "d",
            "input_schema": {"type": "object"}}]))
        .unwrap();
        let t = tools(Some(t)).unwrap().unwrap();
        assert_eq!(
            t[0],
            json!({"type": "function", "function": {"name": "w", "description": "d",
                "parameters": {"type": "object"}}})
        );
        let server: Vec<ToolIn> =
            serde_json::from_value(json!([{"type": "web_search_20250305", "name": "web_search"}]))
                .unwrap();
        assert_eq!(
            tools(Some(server)).unwrap_err().param.as_deref(),
            Some("tools[0].type")
        );
        let c: ToolChoiceIn =
            serde_json::from_value(json!({"type": "any", "disable_parallel_tool_use": true}))
                .unwrap();
        assert_eq!(
            tool_choice(Some(c)),
            (Some(ToolChoice::Required), Some(false))
        );
        let c: ToolChoiceIn = serde_json::from_value(json!({"type": "tool", "name": "w"})).unwrap();
        assert_eq!(
            tool_choice(Some(c)),
            (Some(ToolChoice::Function("w".into())), None)
        );
    }

    #[test]
    fn answers_become_blocks() {
        let calls = vec![ToolCallOut {
            id: "call_abc".into(),
            kind: "function",
            function: crate::openai::structured::FunctionCallOut {
                name: "w".into(),
                arguments: "{\"city\": \"Paris\"}".into(),
            },
        }];
        let b = content_blocks(String::new(), String::new(), calls);
        assert_eq!(
            b,
            vec![ContentBlockOut::ToolUse {
                id: "toolu_abc".into(),
                name: "w".into(),
                input: json!({"city": "Paris"})
            }]
        );
        assert_eq!(
            content_blocks(String::new(), String::new(), vec![]),
            vec![ContentBlockOut::Text {
                text: String::new()
            }]
        );
    }
}
