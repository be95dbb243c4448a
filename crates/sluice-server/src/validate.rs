//! Turns OpenAI request fields into the engine's [`SamplingParams`] and [`StopParams`],
//! checking OpenAI's ranges (a 400 naming the parameter for anything out of them). The engine
//! validates again on submission; checking here first gives OpenAI's exact ranges and
//! messages, and refuses a multi-prompt request before any of its prompts is queued.

use sluice_engine::params::{MAX_LOGPROBS, MAX_N, MAX_STOP_STRINGS};
use sluice_engine::{SamplingParams, StopParams};
use sluice_tokenizer::{ChatMessage, ChatTemplate};

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

fn in_range(
    param: &'static str,
    value: Option<f64>,
    ok: impl Fn(f64) -> bool,
    range: &str,
) -> Result<Option<f32>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v.is_finite() && ok(v) => Ok(Some(v as f32)),
        Some(v) => Err(ApiError::invalid(
            param,
            format!("{v} is not a valid value for `{param}`: it must be in {range}."),
        )),
    }
}

/// How many sequences per prompt, and how each is sampled and stopped. `logprobs` is the
/// number of alternatives asked for, already checked by the caller against its own parameter
/// name.
pub fn sampling(
    f: &SamplingFields,
    logprobs: Option<usize>,
) -> Result<(usize, SamplingParams, StopParams), ApiError> {
    let n = f.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("n = {n} is out of range: it must be between 1 and {MAX_N}."),
        ));
    }
    let defaults = SamplingParams::default();
    let temperature = in_range(
        "temperature",
        f.temperature,
        |v| (0.0..=2.0).contains(&v),
        "[0, 2]",
    )?;
    let top_p = in_range("top_p", f.top_p, |v| v > 0.0 && v <= 1.0, "(0, 1]")?;
    let min_p = in_range("min_p", f.min_p, |v| (0.0..=1.0).contains(&v), "[0, 1]")?;
    let presence_penalty = in_range(
        "presence_penalty",
        f.presence_penalty,
        |v| (-2.0..=2.0).contains(&v),
        "[-2, 2]",
    )?;
    let frequency_penalty = in_range(
        "frequency_penalty",
        f.frequency_penalty,
        |v| (-2.0..=2.0).contains(&v),
        "[-2, 2]",
    )?;
    let repetition_penalty = in_range(
        "repetition_penalty",
        f.repetition_penalty,
        |v| v > 0.0 && v <= 2.0,
        "(0, 2]",
    )?;
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
    let mut logit_bias = Vec::new();
    for (key, &bias) in f.logit_bias.iter().flatten() {
        let token: u32 = key.trim().parse().map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                format!("logit_bias keys must be token ids, got `{key}`."),
            )
        })?;
        if !(bias.is_finite() && (-100.0..=100.0).contains(&bias)) {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("the bias {bias} of token {token} is not in [-100, 100]."),
            ));
        }
        logit_bias.push((token, bias as f32));
    }
    logit_bias.sort_unstable_by_key(|&(t, _)| t);

    let stop = f.stop.clone().unwrap_or_default().0;
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "{} stop strings were given; at most {MAX_STOP_STRINGS} are allowed.",
                stop.len()
            ),
        ));
    }
    let sampling = SamplingParams {
        temperature: temperature.unwrap_or(defaults.temperature),
        top_p: top_p.unwrap_or(defaults.top_p),
        top_k,
        min_p: min_p.unwrap_or(defaults.min_p),
        presence_penalty: presence_penalty.unwrap_or(defaults.presence_penalty),
        frequency_penalty: frequency_penalty.unwrap_or(defaults.frequency_penalty),
        repetition_penalty: repetition_penalty.unwrap_or(defaults.repetition_penalty),
        logit_bias,
        seed: f.seed.map(|s| s.0),
        logprobs,
    };
    let stop_defaults = StopParams::default();
    let stop = StopParams {
        stop,
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
    Ok((n, sampling, stop))
}

/// `logprobs` / `top_logprobs` as the engine's count of alternatives.
pub fn logprobs_count(param: &'static str, k: usize) -> Result<usize, ApiError> {
    if k > MAX_LOGPROBS {
        return Err(ApiError::invalid(
            param,
            format!("{param} = {k} is more than the maximum of {MAX_LOGPROBS}."),
        ));
    }
    Ok(k)
}

/// `max_tokens` must be at least 1 when given.
pub fn max_tokens(value: Option<usize>, param: &'static str) -> Result<Option<usize>, ApiError> {
    match value {
        Some(0) => Err(ApiError::invalid(
            param,
            format!("{param} must be at least 1."),
        )),
        v => Ok(v),
    }
}

/// What the prompt is called in an endpoint's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptKind {
    Prompt,
    Messages,
}

impl PromptKind {
    pub fn param(self) -> &'static str {
        match self {
            Self::Prompt => "prompt",
            Self::Messages => "messages",
        }
    }
}

/// The prompt plus what may be generated must fit the context (OpenAI's message, so clients
/// that parse it keep working). `capacity` is the context length, or the KV cache's size when
/// that is smaller.
pub fn check_context(
    prompt_tokens: usize,
    max_tokens: Option<usize>,
    capacity: usize,
    kind: PromptKind,
) -> Result<(), ApiError> {
    let noun = kind.param();
    let err = |message: String| {
        Err(ApiError::invalid(noun, message).with_code("context_length_exceeded"))
    };
    match max_tokens {
        None if prompt_tokens >= capacity => err(format!(
            "This model's maximum context length is {capacity} tokens. However, your {noun} \
             resulted in {prompt_tokens} tokens, which leaves no room for the completion. \
             Please reduce the length of the {noun}."
        )),
        Some(m) if prompt_tokens.saturating_add(m) > capacity => err(format!(
            "This model's maximum context length is {capacity} tokens. However, you requested \
             {} tokens ({prompt_tokens} in the {noun}, {m} in the completion). Please reduce \
             the length of the {noun} or completion.",
            prompt_tokens.saturating_add(m)
        )),
        _ => Ok(()),
    }
}

/// The conversation as the chat template sees it.
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
                "system" | "user" | "assistant" => m.role.as_str(),
                // OpenAI's newer name for the system role.
                "developer" => "system",
                other => {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].role"),
                        format!(
                            "the role `{other}` is not supported; use system, user or assistant."
                        ),
                    ))
                }
            };
            Ok(ChatMessage::new(role, m.content.0.clone()))
        })
        .collect()
}

/// Renders the conversation with the model's template, ending with the assistant's turn.
pub fn render_chat(
    template: Option<&ChatTemplate>,
    messages: &[ChatMessageIn],
    add_generation_prompt: bool,
) -> Result<String, ApiError> {
    let template = template.ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "This model has no chat template; use /v1/completions instead.",
        )
    })?;
    let messages = chat_messages(messages)?;
    template
        .render(&messages, add_generation_prompt)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use std::collections::HashMap;

    fn param(r: Result<(usize, SamplingParams, StopParams), ApiError>) -> Option<String> {
        r.err().and_then(|e| e.param)
    }

    #[test]
    fn out_of_range_fields_name_their_parameter() {
        let f = |edit: &dyn Fn(&mut SamplingFields)| {
            let mut f = SamplingFields::default();
            edit(&mut f);
            param(sampling(&f, None))
        };
        assert_eq!(f(&|_| ()), None);
        assert_eq!(f(&|f| f.n = Some(0)).as_deref(), Some("n"));
        assert_eq!(f(&|f| f.n = Some(10_000)).as_deref(), Some("n"));
        assert_eq!(
            f(&|f| f.temperature = Some(2.5)).as_deref(),
            Some("temperature")
        );
        assert_eq!(
            f(&|f| f.temperature = Some(-0.1)).as_deref(),
            Some("temperature")
        );
        assert_eq!(f(&|f| f.top_p = Some(0.0)).as_deref(), Some("top_p"));
        assert_eq!(f(&|f| f.top_p = Some(1e300)).as_deref(), Some("top_p"));
        assert_eq!(f(&|f| f.top_k = Some(-2)).as_deref(), Some("top_k"));
        assert_eq!(f(&|f| f.min_p = Some(1.5)).as_deref(), Some("min_p"));
        assert_eq!(
            f(&|f| f.presence_penalty = Some(3.0)).as_deref(),
            Some("presence_penalty")
        );
        assert_eq!(
            f(&|f| f.repetition_penalty = Some(0.0)).as_deref(),
            Some("repetition_penalty")
        );
        assert_eq!(
            f(&|f| f.logit_bias = Some(HashMap::from([("abc".into(), 1.0)]))).as_deref(),
            Some("logit_bias")
        );
        assert_eq!(
            f(&|f| f.logit_bias = Some(HashMap::from([("5".into(), 101.0)]))).as_deref(),
            Some("logit_bias")
        );
        assert_eq!(
            f(&|f| f.stop = Some(crate::openai::StopList(vec!["x".into(); 17]))).as_deref(),
            Some("stop")
        );
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
        let (n, s, stop) = sampling(&f, Some(2)).unwrap();
        assert_eq!(n, 3);
        assert!(s.is_greedy());
        assert_eq!(s.top_k, 0);
        assert_eq!(s.logit_bias, vec![(7, -100.0)]);
        assert_eq!((s.seed, s.logprobs), (Some(42), Some(2)));
        assert!(stop.ignore_eos);
    }

    #[test]
    fn context_overflow_uses_openais_message() {
        let e = check_context(10, Some(20), 25, PromptKind::Messages).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert!(
            e.message.starts_with(
                "This model's maximum context length is 25 tokens. However, you requested 30 \
                 tokens (10 in the messages, 20 in the completion). Please reduce"
            ),
            "{}",
            e.message
        );
        assert!(check_context(10, Some(15), 25, PromptKind::Prompt).is_ok());
        assert!(check_context(24, None, 25, PromptKind::Prompt).is_ok());
        assert!(check_context(25, None, 25, PromptKind::Prompt).is_err());
        assert!(check_context(1, Some(usize::MAX), 25, PromptKind::Prompt).is_err());
    }

    #[test]
    fn roles_are_checked() {
        let msg = |role: &str| ChatMessageIn {
            role: role.into(),
            content: crate::openai::chat::MessageContent("x".into()),
            name: None,
        };
        assert!(chat_messages(&[msg("system"), msg("user"), msg("assistant")]).is_ok());
        assert_eq!(
            chat_messages(&[msg("developer")]).unwrap()[0].role,
            "system"
        );
        let e = chat_messages(&[msg("user"), msg("wizard")]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].role"));
        assert_eq!(
            chat_messages(&[]).unwrap_err().param.as_deref(),
            Some("messages")
        );
    }
}
