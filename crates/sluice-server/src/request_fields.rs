//! Turns OpenAI request fields into the engine's [`Request`], the one record a request is
//! from here to the sampler, and checks what only the wire format can get wrong (the `model`
//! name, `top_k`'s spelling of "no limit", `logit_bias` keys, chat roles). Ranges are not
//! checked here: the engine's [`sluice_engine::ValidRequest::new`] checks every one, once,
//! when [`crate::engine_request::validate`] is given the request with its prompt.

use serde_json::{Map, Value};
use sluice_engine::{Request, SamplingParams, StopParams};
use sluice_tokenizer::{ChatMessage, ChatTemplate, ChatToolCall, RenderOptions};

use crate::error::ApiError;
use crate::openai::chat::ChatMessageIn;
use crate::openai::SamplingFields;
use crate::state::ServedModel;

/// The `model` field names the served model (or is left out, as vLLM allows).
pub fn check_model(requested: Option<&str>, served: &ServedModel) -> Result<(), ApiError> {
    match requested {
        Some(name) if name != served.name => Err(ApiError::model_not_found(name)),
        _ => Ok(()),
    }
}

/// The engine's request as the endpoint's fields set it: how many sequences, how many tokens
/// each may generate (`None`: the rest of the context, which [`sluice_engine::ValidRequest`]
/// resolves once the prompt is known), how each is sampled and stopped. `logprobs` is the
/// number of alternatives asked for (under the endpoint's own field name). Its prompt is
/// empty, and its constraint unset, until the endpoint has tokenized and compiled them.
pub fn request(
    f: &SamplingFields,
    max_tokens: Option<usize>,
    logprobs: Option<usize>,
) -> Result<Request, ApiError> {
    let defaults = SamplingParams::default();
    // JSON numbers are f64; the engine samples in f32. A value out of f32's range becomes
    // infinite, which no range accepts.
    let narrow = |v: Option<f64>, default: f32| v.map_or(default, |v| v as f32);
    // vLLM spells "no top-k" as -1; 0 means the same to the engine.
    let top_k = match f.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k = {k} is invalid: use -1 (or 0) for no limit, or a positive count."),
            ))
        }
    };
    // llama.cpp spells "no top-n-sigma" as -1; 0 means the same to the engine.
    let top_n_sigma = match f.top_n_sigma {
        Some(-1.0) => 0.0,
        v => narrow(v, defaults.top_n_sigma),
    };
    let mut logit_bias = Vec::new();
    for (key, &bias) in f.logit_bias.iter().flatten() {
        let token: u32 = key.trim().parse().map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                format!("logit_bias keys must be token ids, got `{key}`."),
            )
        })?;
        logit_bias.push((token, bias as f32));
    }
    logit_bias.sort_unstable_by_key(|&(t, _)| t);
    let sampling = SamplingParams {
        temperature: narrow(f.temperature, defaults.temperature),
        top_p: narrow(f.top_p, defaults.top_p),
        top_k,
        min_p: narrow(f.min_p, defaults.min_p),
        top_n_sigma,
        presence_penalty: narrow(f.presence_penalty, defaults.presence_penalty),
        frequency_penalty: narrow(f.frequency_penalty, defaults.frequency_penalty),
        repetition_penalty: narrow(f.repetition_penalty, defaults.repetition_penalty),
        logit_bias,
        seed: f.seed.map(|s| s.0),
        logprobs,
    };
    let stop_defaults = StopParams::default();
    let stop = StopParams {
        stop: f.stop.clone().unwrap_or_default().0,
        stop_token_ids: f.stop_token_ids.clone().unwrap_or_default(),
        ignore_eos: f.ignore_eos.unwrap_or(stop_defaults.ignore_eos),
        min_tokens: f.min_tokens.unwrap_or(stop_defaults.min_tokens),
        include_stop_str_in_output: f
            .include_stop_str_in_output
            .unwrap_or(stop_defaults.include_stop_str_in_output),
        skip_special_tokens: f
            .skip_special_tokens
            .unwrap_or(stop_defaults.skip_special_tokens),
    };
    Ok(Request {
        prompt: Vec::new(),
        n: f.n.unwrap_or(1),
        max_tokens,
        sampling,
        stop,
        constraint: None,
    })
}

/// The conversation as the chat template sees it: roles checked, a `tool` message's call id
/// and an assistant turn's calls carried, each call's arguments parsed from the JSON text
/// OpenAI clients send (templates print them with `tojson`).
pub fn chat_messages(messages: &[ChatMessageIn]) -> Result<Vec<ChatMessage>, ApiError> {
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
            let mut message = ChatMessage::new(role, m.content.0.clone());
            message.name = m.name.clone();
            message.tool_call_id = m.tool_call_id.clone();
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
pub fn render_chat(
    template: Option<&ChatTemplate>,
    messages: &[ChatMessageIn],
    add_generation_prompt: bool,
    tools: Option<&[Value]>,
    kwargs: Option<&Map<String, Value>>,
) -> Result<String, ApiError> {
    let template = template.ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "This model has no chat template; use /v1/completions instead.",
        )
    })?;
    let messages = chat_messages(messages)?;
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
    use std::collections::HashMap;

    fn param(r: Result<Request, ApiError>) -> Option<String> {
        r.err().and_then(|e| e.param)
    }

    /// Only what the wire format can get wrong is refused here; ranges are the engine's.
    #[test]
    fn malformed_fields_name_their_parameter() {
        let f = |edit: &dyn Fn(&mut SamplingFields)| {
            let mut f = SamplingFields::default();
            edit(&mut f);
            param(request(&f, None, None))
        };
        assert_eq!(f(&|_| ()), None);
        assert_eq!(f(&|f| f.top_k = Some(-2)).as_deref(), Some("top_k"));
        assert_eq!(
            f(&|f| f.logit_bias = Some(HashMap::from([("abc".into(), 1.0)]))).as_deref(),
            Some("logit_bias")
        );
        assert_eq!(f(&|f| f.temperature = Some(2.5)), None);
    }

    #[test]
    fn fields_map_onto_engine_params() {
        let f = SamplingFields {
            n: Some(3),
            temperature: Some(0.0),
            top_k: Some(-1),
            logit_bias: Some(HashMap::from([("7".into(), -100.0)])),
            seed: Some(crate::openai::Seed(42)),
            ignore_eos: Some(true),
            ..SamplingFields::default()
        };
        let r = request(&f, Some(9), Some(2)).unwrap();
        let (s, stop) = (&r.sampling, &r.stop);
        assert_eq!((r.n, r.max_tokens), (3, Some(9)));
        assert!(s.is_greedy());
        assert_eq!(s.top_k, 0);
        assert_eq!(s.logit_bias, vec![(7, -100.0)]);
        assert_eq!((s.seed, s.logprobs), (Some(42), Some(2)));
        assert!(stop.ignore_eos);
    }

    #[test]
    fn tool_history_is_carried_with_parsed_arguments() {
        let messages: Vec<ChatMessageIn> = serde_json::from_value(serde_json::json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
        ]))
        .unwrap();
        let m = chat_messages(&messages).unwrap();
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
            chat_messages(&bad).unwrap_err().param.as_deref(),
            Some("messages[0].tool_calls[0].function.arguments")
        );
    }

    #[test]
    fn roles_are_checked() {
        let msg = |role: &str| ChatMessageIn {
            role: role.into(),
            content: crate::openai::chat::MessageContent("x".into()),
            name: None,
            tool_calls: None,
            tool_call_id: None,
        };
        assert!(chat_messages(&[msg("system"), msg("user"), msg("assistant")]).is_ok());
        assert_eq!(
            chat_messages(&[msg("developer")]).unwrap()[0].role,
            "system"
        );
        let e = chat_messages(&[msg("user"), msg("wizard")]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].role"));
        let e = chat_messages(&[msg("tool")]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_call_id"));
        assert_eq!(
            chat_messages(&[]).unwrap_err().param.as_deref(),
            Some("messages")
        );
    }
}
