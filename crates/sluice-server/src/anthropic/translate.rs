//! A Messages request as the chat pipeline runs it, and a finished choice as Anthropic's
//! content blocks: system and messages to chat messages (`tool_use` blocks become the
//! assistant's tool calls, `tool_result` blocks `tool` messages), Anthropic's tools and
//! `tool_choice` to chat completions' (checked by [`crate::chat::tools::plan`]), and the
//! engine's finish to `stop_reason`.

use serde_json::{json, Map, Value};
use sluice_engine::{FinishEvent, FinishReason, Grammar, StopReason};
use sluice_tokenizer::ChatTemplate;

use super::types::{
    ContentBlockIn, ContentBlockOut, ContextManagementIn, ImageSourceIn, MessageContentIn,
    MessageIn, OutputConfig, OutputFormat, TextContent, ThinkingIn, ToolChoiceIn, ToolIn,
    ToolResultBlock, ToolResultContent,
};
use crate::chat::grammar::RequestedGrammar;
use crate::chat::thinking::{self, Effort, ThinkingRequest};
use crate::edge::error::ApiError;
use crate::edge::field_policy;
use crate::media::{Detail, ImageInput, ImageSource};
use crate::openai::chat::{ChatMessageIn, MessageContent};
use crate::openai::structured::{ExtraFields, FunctionCallIn, ToolCallIn, ToolCallOut, ToolChoice};

/// Checks what Anthropic's API checks of `thinking` (a budget of at least 1024 tokens, below
/// `max_tokens` when given), and the fields no typed field took
/// ([`field_policy::MESSAGES`]).
fn check_fields(
    extra: &ExtraFields,
    thinking: Option<&ThinkingIn>,
    max_tokens: Option<usize>,
) -> Result<(), ApiError> {
    if let Some(ThinkingIn::Enabled { budget_tokens, .. }) = thinking {
        if *budget_tokens < MIN_THINKING_BUDGET {
            return Err(ApiError::invalid(
                "thinking.budget_tokens",
                format!(
                    "thinking.budget_tokens: Input should be greater than or equal to \
                     {MIN_THINKING_BUDGET}"
                ),
            ));
        }
        if let Some(max_tokens) = max_tokens.filter(|m| m <= budget_tokens) {
            return Err(ApiError::invalid(
                "max_tokens",
                format!(
                    "`max_tokens` must be greater than `thinking.budget_tokens` ({max_tokens} \
                     <= {budget_tokens})."
                ),
            ));
        }
    }
    field_policy::MESSAGES.check(extra)
}

/// Anthropic's least thinking budget.
const MIN_THINKING_BUDGET: usize = 1024;

/// What both Messages routes (`/v1/messages`, `count_tokens`) check beyond the conversation
/// (`thinking` against `max_tokens` when there is one, `context_management`, the fields no
/// typed field took), and the chat template's thinking switches that `thinking` and
/// `output_config.effort` set ([`crate::chat::thinking`]).
pub fn template_switches(
    template: Option<&ChatTemplate>,
    extra: &ExtraFields,
    thinking: Option<&ThinkingIn>,
    output_config: Option<&OutputConfig>,
    context_management: Option<&ContextManagementIn>,
    max_tokens: Option<usize>,
) -> Result<Option<Map<String, Value>>, ApiError> {
    check_fields(extra, thinking, max_tokens)?;
    context_edits(context_management)?;
    let effort = output_config.and_then(|c| c.effort);
    Ok(thinking::template_kwargs(
        template,
        thinking_request(thinking, effort),
    ))
}

/// What `thinking` and `output_config.effort` ask of the template ([`crate::chat::thinking`]).
fn thinking_request(thinking: Option<&ThinkingIn>, effort: Option<Effort>) -> ThinkingRequest {
    ThinkingRequest {
        enabled: thinking.map(|t| !matches!(t, ThinkingIn::Disabled)),
        effort,
    }
}

/// Applies `context_management`'s edits. `clear_thinking_20251015` asks to drop earlier
/// turns' thinking from the context: sluice never shows earlier thinking to the model (see
/// [`messages`]), so it holds whatever its `keep` says. Other edits are refused by name.
fn context_edits(management: Option<&ContextManagementIn>) -> Result<(), ApiError> {
    let Some(management) = management else {
        return Ok(());
    };
    for (i, edit) in management.edits.iter().enumerate() {
        match edit.get("type").and_then(Value::as_str) {
            Some("clear_thinking_20251015") => {}
            Some(other) => {
                return Err(ApiError::invalid(
                    format!("context_management.edits[{i}].type"),
                    format!(
                        "context edits of type `{other}` are not supported; only \
                         clear_thinking_20251015."
                    ),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    format!("context_management.edits[{i}].type"),
                    "each context edit needs a `type`.",
                ))
            }
        }
    }
    Ok(())
}

/// The grammar `output_config` asks for, if any.
pub fn output_grammar(config: Option<OutputConfig>) -> Result<Option<RequestedGrammar>, ApiError> {
    let Some(config) = config else {
        return Ok(None);
    };
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

fn chat_message(role: &str, content: MessageContent) -> ChatMessageIn {
    ChatMessageIn {
        role: role.into(),
        content,
        name: None,
        tool_calls: None,
        tool_call_id: None,
        reasoning_content: None,
    }
}

/// The media types Anthropic's API takes for an image.
const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// An image block's source as the image it names; `field` is the block's `source`
/// (`messages[1].content[0].source`), which its errors name.
fn image(source: ImageSourceIn, field: String) -> Result<ImageInput, ApiError> {
    let source = match source {
        ImageSourceIn::Base64 { media_type, data } => {
            if !IMAGE_TYPES.contains(&media_type.as_str()) {
                return Err(ApiError::invalid(
                    format!("{field}.media_type"),
                    format!(
                        "media_type `{media_type}` is not one of {}.",
                        IMAGE_TYPES.join(", ")
                    ),
                ));
            }
            ImageSource::from_base64(&media_type, &data)
        }
        ImageSourceIn::Url { url } => match ImageSource::parse(&url) {
            Ok(ImageSource::Data { .. }) => Err(crate::media::MediaError::NotAUrl(
                "a data URI (send it as a base64 source)".into(),
            )),
            other => other,
        },
    }
    .map_err(|e| e.at(field.clone()))?;
    Ok(ImageInput {
        source,
        detail: Detail::Auto,
        field,
    })
}

/// A `tool_result` block's content; `at` names the block (`messages[1].content[0]`).
fn tool_result_content(
    content: Option<ToolResultContent>,
    at: &str,
) -> Result<MessageContent, ApiError> {
    let mut out = MessageContent::default();
    match content {
        None => {}
        Some(ToolResultContent::Text(text)) => out.push_text(text),
        Some(ToolResultContent::Blocks(blocks)) => {
            for (k, block) in blocks.into_iter().enumerate() {
                match block {
                    ToolResultBlock::Text { text } => out.push_text(text),
                    ToolResultBlock::Image { source } => {
                        out.push_image(image(source, format!("{at}.content[{k}].source"))?)
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The text of a `system` message inside `messages`: text blocks only.
fn system_text(content: MessageContentIn, i: usize) -> Result<String, ApiError> {
    match content {
        MessageContentIn::Text(text) => Ok(text),
        MessageContentIn::Blocks(blocks) => blocks
            .into_iter()
            .enumerate()
            .map(|(j, block)| match block {
                ContentBlockIn::Text { text } => Ok(text),
                _ => Err(ApiError::invalid(
                    format!("messages[{i}].content[{j}]"),
                    "a system message holds text blocks only.",
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.join("\n")),
    }
}

/// The conversation in chat completions' terms. `system` messages inside `messages` (Claude
/// Code sends its environment so) are merged into the system prompt, after `system`, in their
/// order: chat templates take one system message, first.
pub fn messages(
    system: Option<TextContent>,
    messages: Vec<MessageIn>,
) -> Result<Vec<ChatMessageIn>, ApiError> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut system: Vec<String> = system.map(TextContent::into_text).into_iter().collect();
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must contain at least one message.",
        ));
    }
    // The last message that is not a system message: an assistant one would be a prefill.
    let last = messages.iter().rposition(|m| m.role != "system");
    for (i, m) in messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" => {
                system.push(system_text(m.content, i)?);
                continue;
            }
            "user" => "user",
            "assistant" if Some(i) == last => {
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
                    format!("the role `{other}` is not supported; use user, assistant or system."),
                ))
            }
        };
        let blocks = match m.content {
            MessageContentIn::Text(text) => {
                out.push(chat_message(role, MessageContent::text(text)));
                continue;
            }
            MessageContentIn::Blocks(blocks) => blocks,
        };
        let mut content = MessageContent::default();
        let mut calls: Vec<ToolCallIn> = Vec::new();
        for (j, block) in blocks.into_iter().enumerate() {
            let field = || format!("messages[{i}].content[{j}]");
            match block {
                ContentBlockIn::Text { text } => content.push_text(text),
                ContentBlockIn::Image { source } => {
                    if role != "user" {
                        return Err(ApiError::invalid(
                            field(),
                            "image blocks belong in user messages.",
                        ));
                    }
                    content.push_image(image(source, format!("{}.source", field()))?);
                }
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
                    let mut result = tool_result_content(content, &field())?;
                    // Chat templates have no field for a failed call: the result says so.
                    if is_error == Some(true) {
                        result.prefix_text("Error: ");
                    }
                    let mut message = chat_message("tool", result);
                    message.tool_call_id = Some(tool_use_id);
                    out.push(message);
                }
                // Earlier reasoning is not shown to the model again (thinking models' chat
                // templates drop it from the history too).
                ContentBlockIn::Thinking { .. } | ContentBlockIn::RedactedThinking { .. } => {}
            }
        }
        if !content.parts().is_empty() || !calls.is_empty() {
            let mut message = chat_message(role, content);
            if !calls.is_empty() {
                message.tool_calls = Some(calls);
            }
            out.push(message);
        }
    }
    if out.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must contain a user message, not only system ones.",
        ));
    }
    if !system.is_empty() {
        out.insert(
            0,
            chat_message("system", MessageContent::text(system.join("\n\n"))),
        );
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
        .filter(|(_, t)| t.defer_loading != Some(true))
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
            if let Some(strict) = t.strict {
                function["strict"] = Value::Bool(strict);
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

/// The content blocks of a finished answer: its thinking (empty with `omit_thinking`, as
/// Anthropic's `display: "omitted"` returns it), its text, its calls.
pub fn content_blocks(
    reasoning: String,
    text: String,
    calls: Vec<ToolCallOut>,
    omit_thinking: bool,
) -> Vec<ContentBlockOut> {
    let mut blocks = Vec::with_capacity(2 + calls.len());
    if !reasoning.is_empty() {
        blocks.push(ContentBlockOut::Thinking {
            thinking: if omit_thinking {
                String::new()
            } else {
                reasoning
            },
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
        assert_eq!(m[2].content.template_text(), "Checking.");
        let call = &m[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.function.arguments, json!({"city": "Paris"}));
        assert_eq!(m[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(m[3].content.template_text(), "sunny");
    }

    #[test]
    fn bad_conversations_name_the_field() {
        let e = messages(None, parse(json!([{"role": "system", "content": "x"}]))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = messages(None, parse(json!([{"role": "tool", "content": "x"}]))).unwrap_err();
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

    /// Image blocks keep their place among the text in user turns and tool results, each
    /// named by its `source`; the bad ones are refused naming it.
    #[test]
    fn images_are_blocks_in_order() {
        let m = messages(
            None,
            parse(json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "is_error": true, "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "aGk="}},
                        {"type": "text", "text": "blurry"}]}]}
            ])),
        )
        .unwrap();
        let marker = crate::media::marker::marker();
        assert_eq!(
            m[0].content.template_text(),
            format!("Look:{marker}{marker}")
        );
        let fields: Vec<&str> = m[0].content.images().map(|i| i.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "messages[0].content[1].source",
                "messages[0].content[2].source"
            ]
        );
        assert_eq!(m[2].role, "tool");
        assert_eq!(
            m[2].content.template_text(),
            format!("Error: {marker}blurry")
        );
        assert_eq!(
            m[2].content.images().next().unwrap().field,
            "messages[2].content[0].content[0].source"
        );

        let param = |content: Value, role: &str| {
            let mut conversation = vec![json!({"role": role, "content": content})];
            if role == "assistant" {
                conversation.push(json!({"role": "user", "content": "and?"}));
            }
            messages(None, parse(Value::Array(conversation)))
                .unwrap_err()
                .param
                .unwrap()
        };
        let png = json!({"type": "base64", "media_type": "image/png", "data": "aGk="});
        assert_eq!(
            param(json!([{"type": "image", "source": png}]), "assistant"),
            "messages[0].content[0]"
        );
        assert_eq!(
            param(
                json!([{"type": "text", "text": "x"}, {"type": "image", "source":
                    {"type": "base64", "media_type": "image/bmp", "data": "aGk="}}]),
                "user"
            ),
            "messages[0].content[1].source.media_type"
        );
        assert_eq!(
            param(
                json!([{"type": "image", "source":
                    {"type": "base64", "media_type": "image/png", "data": "!!"}}]),
                "user"
            ),
            "messages[0].content[0].source"
        );
        assert_eq!(
            param(
                json!([{"type": "image", "source":
                    {"type": "url", "url": "data:image/png;base64,aGk="}}]),
                "user"
            ),
            "messages[0].content[0].source"
        );
        assert_eq!(
            param(
                json!([{"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}]),
                "user"
            ),
            "messages[0].content[0].source"
        );
    }

    /// Claude Code's shape: a system message after the user's, merged into the system prompt.
    #[test]
    fn system_messages_join_the_system_prompt() {
        let m = messages(
            Some(TextContent::Text("Be brief.".into())),
            parse(json!([
                {"role": "user", "content": [{"type": "text", "text": "Say hi"}]},
                {"role": "system", "content": [{"type": "text", "text": "# Environment"}]}
            ])),
        )
        .unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user"]);
        assert_eq!(m[0].content.template_text(), "Be brief.\n\n# Environment");
        let e = messages(
            None,
            parse(json!([{"role": "user", "content": "x"},
                {"role": "system", "content": [{"type": "tool_use", "id": "a", "name": "f",
                    "input": {}}]}])),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].content[0]"));
    }

    #[test]
    fn thinking_and_context_edits_are_checked_as_anthropic_does() {
        let t: ThinkingIn =
            serde_json::from_value(json!({"type": "enabled", "budget_tokens": 512})).unwrap();
        let e = check_fields(&ExtraFields::new(), Some(&t), Some(4096)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("thinking.budget_tokens"));
        let t: ThinkingIn =
            serde_json::from_value(json!({"type": "enabled", "budget_tokens": 2048})).unwrap();
        let e = check_fields(&ExtraFields::new(), Some(&t), Some(2048)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(check_fields(&ExtraFields::new(), Some(&t), Some(4096)).is_ok());
        let t: ThinkingIn =
            serde_json::from_value(json!({"type": "adaptive", "display": "omitted"})).unwrap();
        assert!(t.omits_text());
        assert_eq!(
            thinking_request(Some(&t), Some(Effort::Medium)),
            ThinkingRequest {
                enabled: Some(true),
                effort: Some(Effort::Medium)
            }
        );
        let cm: ContextManagementIn = serde_json::from_value(
            json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}),
        )
        .unwrap();
        assert!(context_edits(Some(&cm)).is_ok());
        let cm: ContextManagementIn =
            serde_json::from_value(json!({"edits": [{"type": "clear_tool_uses_20250919"}]}))
                .unwrap();
        assert_eq!(
            context_edits(Some(&cm)).unwrap_err().param.as_deref(),
            Some("context_management.edits[0].type")
        );
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
        let deferred: Vec<ToolIn> = serde_json::from_value(json!([{"name": "w"},
            {"name": "later", "defer_loading": true}]))
        .unwrap();
        assert_eq!(tools(Some(deferred)).unwrap().unwrap().len(), 1);
        let strict: Vec<ToolIn> =
            serde_json::from_value(json!([{"name": "w", "strict": true}])).unwrap();
        assert_eq!(
            tools(Some(strict)).unwrap().unwrap()[0]["function"]["strict"],
            json!(true)
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
        let b = content_blocks(String::new(), String::new(), calls, false);
        assert_eq!(
            b,
            vec![ContentBlockOut::ToolUse {
                id: "toolu_abc".into(),
                name: "w".into(),
                input: json!({"city": "Paris"})
            }]
        );
        assert_eq!(
            content_blocks(String::new(), String::new(), vec![], false),
            vec![ContentBlockOut::Text {
                text: String::new()
            }]
        );
    }
}
