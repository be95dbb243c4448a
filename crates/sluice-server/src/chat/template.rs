//! A conversation as the model's chat template renders it: roles checked, a `tool` message's
//! call id and an assistant turn's calls carried (their JSON arguments parsed), each image a
//! marker in its message's text ([`crate::media::marker`]) or refused, and the text the
//! template makes of it.

use serde_json::{Map, Value};
use sluice_tokenizer::{ChatMessage, ChatTemplate, ChatToolCall, RenderOptions, ToolCallFormat};

use crate::edge::error::ApiError;
use crate::openai::chat::ChatMessageIn;

/// What becomes of a conversation's images on the way to the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Images {
    /// Each is its marker in its message's text: the chat pipeline has checked that the
    /// model takes them and decoded them.
    Marked,
    /// Each is a 400 naming it: a route that renders text only (`/tokenize`).
    Refused,
}

/// The conversation as the chat template sees it: roles checked, a `tool` message's call id
/// and an assistant turn's calls carried, each call's arguments parsed from the JSON text
/// OpenAI clients send (templates print them with `tojson`). Images may be in user and tool
/// messages only (OpenAI's rule: a model is not shown images it or the system sent).
pub fn chat_messages(
    messages: &[ChatMessageIn],
    images: Images,
) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must contain at least one message.",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "user" | "assistant" | "tool" => m.role.as_str(),
                // OpenAI's newer name for the system role.
                "developer" => "system",
                other => {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].role"),
                        format!(
                            "the role `{other}` is not supported; use system, user, assistant \
                             or tool."
                        ),
                    ))
                }
            };
            if role == "tool" && m.tool_call_id.is_none() {
                // OpenAI's rule: a tool result answers one call of the turn before.
                return Err(ApiError::invalid(
                    format!("messages[{i}].tool_call_id"),
                    "a tool message needs the tool_call_id of the call it answers.",
                ));
            }
            if let Some(image) = m.content.images().next() {
                if images == Images::Refused {
                    return Err(ApiError::invalid(
                        image.field.clone(),
                        "this route renders text only; images are taken by /v1/chat/completions, \
                         /v1/messages and /v1/responses, for a model that reads them.",
                    ));
                }
                if !matches!(role, "user" | "tool") {
                    return Err(ApiError::invalid(
                        image.field.clone(),
                        format!("images go in user messages (or tool results), not {role} ones."),
                    ));
                }
            }
            let mut message = ChatMessage::new(role, m.content.template_text());
            message.name = m.name.clone();
            message.tool_call_id = m.tool_call_id.clone();
            if role == "assistant" {
                let reasoning = m.reasoning_content.clone().filter(|r| !r.is_empty());
                message.reasoning_content = reasoning.clone();
                message.thinking = reasoning;
            }
            if let Some(calls) = &m.tool_calls {
                if role != "assistant" && !calls.is_empty() {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].tool_calls"),
                        "only assistant messages carry tool calls.",
                    ));
                }
                for (j, call) in calls.iter().enumerate() {
                    let arguments = match &call.function.arguments {
                        Value::String(text) => serde_json::from_str(text).map_err(|e| {
                            ApiError::invalid(
                                format!("messages[{i}].tool_calls[{j}].function.arguments"),
                                format!("the arguments are not valid JSON: {e}"),
                            )
                        })?,
                        other => other.clone(),
                    };
                    let id = call.id.clone().unwrap_or_else(|| format!("call_{i}_{j}"));
                    message.tool_calls.push(ChatToolCall::function(
                        id,
                        call.function.name.clone(),
                        arguments,
                    ));
                }
            }
            Ok(message)
        })
        .collect()
}

/// Renders the conversation with the model's template (shown the request's tools and
/// `chat_template_kwargs`); with `add_generation_prompt` it ends with the assistant's turn.
/// Images are refused ([`Images::Refused`]); the chat pipeline renders them with
/// [`render_chat_with_images`].
pub fn render_chat(
    template: Option<&ChatTemplate>,
    messages: &[ChatMessageIn],
    add_generation_prompt: bool,
    tools: Option<&[Value]>,
    kwargs: Option<&Map<String, Value>>,
) -> Result<String, ApiError> {
    render(
        template,
        messages,
        add_generation_prompt,
        tools,
        kwargs,
        Images::Refused,
    )
}

/// [`render_chat`], each image its marker in the text ([`Images::Marked`]).
pub fn render_chat_with_images(
    template: Option<&ChatTemplate>,
    messages: &[ChatMessageIn],
    add_generation_prompt: bool,
    tools: Option<&[Value]>,
    kwargs: Option<&Map<String, Value>>,
) -> Result<String, ApiError> {
    render(
        template,
        messages,
        add_generation_prompt,
        tools,
        kwargs,
        Images::Marked,
    )
}

fn render(
    template: Option<&ChatTemplate>,
    messages: &[ChatMessageIn],
    add_generation_prompt: bool,
    tools: Option<&[Value]>,
    kwargs: Option<&Map<String, Value>>,
    images: Images,
) -> Result<String, ApiError> {
    let template = template.ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "This model has no chat template; use /v1/completions instead.",
        )
    })?;
    let mut messages = chat_messages(messages, images)?;
    if template.tool_call_format() == ToolCallFormat::Harmony {
        for m in &mut messages {
            // gpt-oss's template refuses a call turn with both an answer and its reasoning
            // (it shows one of them as the analysis before the call): the reasoning is kept,
            // as llama.cpp keeps it.
            if !m.tool_calls.is_empty() && m.thinking.is_some() {
                m.content.clear();
            }
        }
    }
    template
        .render_with(
            &messages,
            &RenderOptions {
                add_generation_prompt,
                tools,
                kwargs,
            },
        )
        .map_err(|e| ApiError::invalid("messages", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_history_is_carried_with_parsed_arguments() {
        let messages: Vec<ChatMessageIn> = serde_json::from_value(serde_json::json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
        ]))
        .unwrap();
        let m = chat_messages(&messages, Images::Marked).unwrap();
        assert_eq!(m[1].tool_calls[0].function.name, "w");
        assert_eq!(
            m[1].tool_calls[0].function.arguments,
            serde_json::json!({"city": "Paris"})
        );
        assert_eq!(m[2].tool_call_id.as_deref(), Some("call_1"));
        let bad: Vec<ChatMessageIn> = serde_json::from_value(serde_json::json!([
            {"role": "assistant", "tool_calls": [{"function": {"name": "w", "arguments": "{oops"}}]}
        ]))
        .unwrap();
        assert_eq!(
            chat_messages(&bad, Images::Marked)
                .unwrap_err()
                .param
                .as_deref(),
            Some("messages[0].tool_calls[0].function.arguments")
        );
    }

    #[test]
    fn roles_are_checked() {
        let msg = |role: &str| ChatMessageIn {
            role: role.into(),
            content: crate::openai::chat::MessageContent::text("x"),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
        };
        assert!(chat_messages(
            &[msg("system"), msg("user"), msg("assistant")],
            Images::Marked
        )
        .is_ok());
        assert_eq!(
            chat_messages(&[msg("developer")], Images::Marked).unwrap()[0].role,
            "system"
        );
        let e = chat_messages(&[msg("user"), msg("wizard")], Images::Marked).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].role"));
        let e = chat_messages(&[msg("tool")], Images::Marked).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_call_id"));
        assert_eq!(
            chat_messages(&[], Images::Marked)
                .unwrap_err()
                .param
                .as_deref(),
            Some("messages")
        );
    }

    /// Images reach the template as markers in user and tool messages, joined as llama.cpp
    /// joins parts; elsewhere, or on a text-only route, each is refused naming it.
    #[test]
    fn images_are_markers_where_they_may_be() {
        let template = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}",
            None,
            None,
        )
        .unwrap();
        let messages: Vec<ChatMessageIn> = serde_json::from_value(serde_json::json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "text", "text": "What is"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}},
                {"type": "text", "text": "?"},
                {"type": "text", "text": "Short answer."}]}
        ]))
        .unwrap();
        let marker = crate::media::marker::marker();
        let text = render_chat_with_images(Some(&template), &messages, false, None, None).unwrap();
        assert_eq!(
            text,
            format!("<system>Be brief.</system><user>What is{marker}?\nShort answer.</user>")
        );
        // Parsed alone, a message names its image from its content; the request names the
        // message (`openai::chat::messages_naming_images`).
        let e = render_chat(Some(&template), &messages, false, None, None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("content[1].image_url"));
        assert!(e.message.contains("text only"), "{}", e.message);
        for role in ["system", "assistant"] {
            let m: Vec<ChatMessageIn> = serde_json::from_value(serde_json::json!([
                {"role": role, "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}]}
            ]))
            .unwrap();
            let e = chat_messages(&m, Images::Marked).unwrap_err();
            assert!(e.message.contains("user messages"), "{role}: {}", e.message);
        }
    }

    /// An assistant turn's reasoning sent back (`reasoning_content`, or `reasoning`) reaches
    /// the template under both names templates read; gpt-oss's renders it as the analysis
    /// before the call, and a call turn with an answer beside its reasoning keeps the
    /// reasoning rather than failing the template.
    #[test]
    fn reasoning_in_the_history_reaches_the_template() {
        let source = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures/templates/openai-gpt-oss-120b.jinja"),
        )
        .unwrap();
        let template = ChatTemplate::new(&source, None, None).unwrap();
        let history = |content: &str| -> Vec<ChatMessageIn> {
            serde_json::from_value(serde_json::json!([
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": content, "reasoning": "Need the weather tool.",
                 "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ]))
            .unwrap()
        };
        let m = chat_messages(&history(""), Images::Marked).unwrap();
        assert_eq!(
            m[1].reasoning_content.as_deref(),
            Some("Need the weather tool.")
        );
        assert_eq!(m[1].thinking, m[1].reasoning_content);
        assert_eq!(m[0].thinking, None);
        let text = render_chat(Some(&template), &history(""), true, None, None).unwrap();
        assert!(
            text.contains(
                "<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>\
                 <|start|>assistant to=functions.get_weather"
            ),
            "{text}"
        );
        let with_answer =
            render_chat(Some(&template), &history("Let me check."), true, None, None).unwrap();
        assert_eq!(with_answer, text);
    }
}
