//! What sluice does with the request fields of its generation APIs that no typed field takes,
//! in one place (`docs/api-fields.md` is the same policy for readers, and a test keeps the two
//! in step). A field is either
//! - implemented: a typed field of the request, handled where the request is translated;
//! - accepted with a stated local meaning ([`Policy::Local`]): a hint or option that a model
//!   or server without that ability honours by doing nothing, or whose meaning here is
//!   well defined (said in the table);
//! - refused with a 400 that names it ([`Policy::Refused`]), when honouring it would change
//!   what a correct answer is and sluice cannot.
//!
//! A field on none of the lists is a 400 on `/v1/messages` and `/v1/responses`, as Anthropic's
//! and OpenAI's own servers answer it. On `/v1/chat/completions` and `/v1/completions` it is
//! named in a debug log line instead: frameworks send other servers' extensions there (vLLM's,
//! llama.cpp's), and those endpoints have always taken them so.

use serde_json::{Map, Value};

use crate::edge::error::ApiError;

/// A request's fields that no typed field took.
pub type ExtraFields = Map<String, Value>;

/// What a field not taken by a typed field means here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Accepted; the text says what it does here.
    Local(&'static str),
    /// A 400 with this message, unless the value asks for nothing ([`asks_for_nothing`]).
    Refused(&'static str),
}

/// The fields of one API that no typed field takes.
pub struct Api {
    pub name: &'static str,
    /// Whether a field on no list is refused.
    pub refuse_unknown: bool,
    pub fields: &'static [(&'static str, Policy)],
}

use Policy::{Local, Refused};

/// `/v1/messages` (Anthropic). Typed there: `model`, `max_tokens`, `messages`, `system`,
/// `stop_sequences`, `temperature`, `top_p`, `top_k`, `tools`, `tool_choice`, `stream`,
/// `thinking`, `output_config`, `context_management`.
pub const MESSAGES: Api = Api {
    name: "/v1/messages",
    refuse_unknown: true,
    fields: &[
        (
            "metadata",
            Local("tags the request (`user_id`); not used for generation."),
        ),
        (
            "service_tier",
            Local("one tier here: every request is served alike."),
        ),
        (
            "inference_geo",
            Local("the request runs on this server, wherever it is."),
        ),
        ("speed", Local("one speed here: the server's.")),
        (
            "cache_control",
            Local("the prefix cache keeps every prompt's blocks unasked; markers change nothing."),
        ),
        (
            "mcp_servers",
            Refused("MCP servers are not supported by this server."),
        ),
        (
            "container",
            Refused("containers are not supported by this server."),
        ),
        (
            "diagnostics",
            Refused("prompt-cache diagnostics are not reported by this server."),
        ),
    ],
};

/// `/v1/responses` (OpenAI). Typed there: `model`, `input`, `instructions`,
/// `max_output_tokens`, `temperature`, `top_p`, `tools`, `tool_choice`, `parallel_tool_calls`,
/// `text`, `stream`, `store`, `previous_response_id`, `metadata`, `user`, `truncation`,
/// `reasoning`, `include`.
pub const RESPONSES: Api = Api {
    name: "/v1/responses",
    refuse_unknown: true,
    fields: &[
        (
            "service_tier",
            Local("one tier here: every request is served alike."),
        ),
        (
            "safety_identifier",
            Local("tags the request; not used for generation."),
        ),
        (
            "prompt_cache_key",
            Local("the prefix cache finds shared prompt prefixes by their tokens; no key needed."),
        ),
        (
            "prompt_cache_retention",
            Local("cached blocks stay until the cache needs their room, whatever is asked."),
        ),
        (
            "client_metadata",
            Local("tags the request (Codex's thread and turn); not used for generation."),
        ),
        (
            "stream_options",
            Local("`include_obfuscation` only pads events; sluice sends none."),
        ),
        (
            "top_logprobs",
            Refused("logprobs are not supported on this API; use /v1/chat/completions."),
        ),
        (
            "background",
            Refused("background responses are not supported by this server."),
        ),
        (
            "conversation",
            Refused("conversations are not supported; use previous_response_id."),
        ),
        (
            "prompt",
            Refused("prompt templates are not supported by this server."),
        ),
        (
            "max_tool_calls",
            Refused("max_tool_calls is not supported; use parallel_tool_calls."),
        ),
    ],
};

/// `/v1/chat/completions` and `/v1/completions` (OpenAI, with vLLM's extensions typed).
pub const CHAT: Api = Api {
    name: "/v1/chat/completions",
    refuse_unknown: false,
    fields: &[
        (
            "audio",
            Refused("audio output is not supported; this server generates text."),
        ),
        (
            "prediction",
            Refused("predicted outputs are not supported by this server."),
        ),
        (
            "web_search_options",
            Refused("web search is not supported by this server."),
        ),
        (
            "functions",
            Refused("the deprecated `functions` field is not supported; send `tools` instead."),
        ),
        (
            "function_call",
            Refused(
                "the deprecated `function_call` field is not supported; send `tool_choice` \
                 instead.",
            ),
        ),
    ],
};

/// A value that asks for nothing (null, false, an empty list, zero, an object of nulls): never
/// refused. An empty object asks for something: the feature with its defaults
/// (`web_search_options: {}` turns search on).
pub fn asks_for_nothing(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => !o.is_empty() && o.values().all(Value::is_null),
        Value::Number(n) => n.as_u64() == Some(0),
        Value::String(_) | Value::Bool(true) => false,
    }
}

impl Api {
    /// The policy of `field`, if it has one.
    pub fn policy(&self, field: &str) -> Option<Policy> {
        self.fields
            .iter()
            .find(|(name, _)| *name == field)
            .map(|(_, p)| *p)
    }

    /// Checks the fields no typed field took: refused ones (asking for something) and, where
    /// the API refuses them, unknown ones are a 400 naming the field; accepted ones are named
    /// in a debug log line with their meaning here.
    pub fn check(&self, extra: &ExtraFields) -> Result<(), ApiError> {
        for (name, value) in extra {
            match self.policy(name) {
                Some(Policy::Refused(_)) | None if asks_for_nothing(value) => {}
                Some(Policy::Refused(message)) => return Err(ApiError::invalid(name, message)),
                Some(Policy::Local(meaning)) => {
                    tracing::debug!(field = %name, meaning, "request field accepted");
                }
                None if self.refuse_unknown => {
                    return Err(ApiError::invalid(
                        name,
                        format!(
                            "`{name}` is not a field of {} that this server knows.",
                            self.name
                        ),
                    ))
                }
                None => {
                    tracing::debug!(field = %name, "request field not used by this server; ignored")
                }
            }
        }
        Ok(())
    }
}

/// Checks the fields no typed field took ([`CHAT`]); `modalities` may only ask
/// for text.
pub fn check_extra_fields(extra: &ExtraFields) -> Result<(), ApiError> {
    if let Some(modalities) = extra.get("modalities").filter(|m| !m.is_null()) {
        let text_only = modalities
            .as_array()
            .is_some_and(|m| m.iter().all(|v| v.as_str() == Some("text")));
        if !text_only {
            return Err(ApiError::invalid(
                "modalities",
                "only the `text` modality is supported.",
            ));
        }
    }
    CHAT.check(extra)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn extra(v: Value) -> ExtraFields {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn fields_are_accepted_refused_or_unknown_by_the_table() {
        assert!(MESSAGES
            .check(&extra(
                json!({"metadata": {"user_id": "u"}, "cache_control": {}})
            ))
            .is_ok());
        let e = MESSAGES
            .check(&extra(json!({"mcp_servers": [{"url": "x"}]})))
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("mcp_servers"));
        // Asking for nothing is never refused; an empty object asks for the defaults.
        assert!(MESSAGES.check(&extra(json!({"mcp_servers": []}))).is_ok());
        assert!(CHAT
            .check(&extra(json!({"web_search_options": {}})))
            .is_err());
        let e = MESSAGES
            .check(&extra(json!({"frobnicate": 1})))
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("frobnicate"));
        assert!(e.message.contains("/v1/messages"));
        let e = RESPONSES
            .check(&extra(json!({"background": true})))
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("background"));
        assert!(RESPONSES
            .check(&extra(
                json!({"prompt_cache_key": "k", "client_metadata": {"a": "b"}})
            ))
            .is_ok());
        // Chat completions takes other servers' extensions.
        assert!(CHAT.check(&extra(json!({"frobnicate": 1}))).is_ok());
        assert!(CHAT.check(&extra(json!({"functions": [{}]}))).is_err());
    }

    /// docs/api-fields.md lists every field of the tables with its policy's word.
    #[test]
    fn the_docs_list_every_field() {
        let doc = include_str!("../../../../docs/api-fields.md");
        for api in [&MESSAGES, &RESPONSES, &CHAT] {
            for (name, policy) in api.fields {
                let word = match policy {
                    Policy::Local(_) => "accepted",
                    Policy::Refused(_) => "refused",
                };
                let row = format!("| `{name}` | {word}");
                assert!(
                    doc.contains(&row),
                    "docs/api-fields.md lacks the row `{row}` ({})",
                    api.name
                );
            }
        }
    }

    #[test]
    fn unsupported_openai_fields_are_refused_by_name() {
        let extra = |v: Value| v.as_object().unwrap().clone();
        for field in ["audio", "prediction", "web_search_options", "functions"] {
            let e = check_extra_fields(&extra(json!({ field: {} }))).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field));
        }
        let e = check_extra_fields(&extra(json!({"modalities": ["text", "audio"]}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("modalities"));
        check_extra_fields(&extra(
            json!({"modalities": ["text"], "store": false, "metadata": {},
            "service_tier": "auto", "some_other_server_field": 1, "audio": null}),
        ))
        .unwrap();
    }
}
