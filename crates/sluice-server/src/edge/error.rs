//! Every error a client sees, in OpenAI's shape: `{"error": {"message", "type", "param",
//! "code"}}` with the HTTP status OpenAI (or vLLM, where OpenAI has no equivalent) uses, so
//! the official SDKs raise their typed exceptions (`BadRequestError`, `AuthenticationError`,
//! `NotFoundError`, `RateLimitError`, ...).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sluice_engine::{InvalidRequest, SubmitError};

/// Seconds a client is told to wait after a 429.
pub const RETRY_AFTER_SECS: u64 = 1;

/// What an endpoint calls the request fields that the engine's errors name: the engine says
/// `prompt`, `max_tokens` and `logprobs`; chat says `messages`, and may say
/// `max_completion_tokens` and `top_logprobs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamNames {
    pub prompt: &'static str,
    pub max_tokens: &'static str,
    pub logprobs: &'static str,
    /// Whose words a prompt that does not fit is told in.
    pub wording: Wording,
}

/// Whose words an endpoint's context-overflow errors use: clients recover from them by
/// reading them (Claude Code retries with a smaller `max_tokens` only on Anthropic's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wording {
    OpenAi,
    Anthropic,
}

impl ParamNames {
    pub const COMPLETIONS: Self = Self {
        prompt: "prompt",
        max_tokens: "max_tokens",
        logprobs: "logprobs",
        wording: Wording::OpenAi,
    };

    /// `/v1/embeddings`, whose prompts are its `input` (it has no other field the engine
    /// names).
    pub const EMBEDDINGS: Self = Self {
        prompt: "input",
        max_tokens: "input",
        logprobs: "input",
        wording: Wording::OpenAi,
    };

    /// `max_completion_tokens`: whether the client sent that field (it wins over
    /// `max_tokens`).
    pub fn chat(max_completion_tokens: bool) -> Self {
        Self {
            prompt: "messages",
            max_tokens: if max_completion_tokens {
                "max_completion_tokens"
            } else {
                "max_tokens"
            },
            logprobs: "top_logprobs",
            wording: Wording::OpenAi,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: ErrorObject<'a>,
}

/// The `error` object, alone: also what an SSE stream sends when the engine fails mid-stream.
#[derive(Serialize)]
pub struct ErrorObject<'a> {
    pub message: &'a str,
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub param: Option<&'a str>,
    pub code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 400: the request is malformed or out of range; `param` names the field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.into()),
            ..Self::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                message.into(),
            )
        }
    }

    /// 400 without a parameter: the body is not JSON at all.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 404, as OpenAI answers a model it does not serve.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model `{model}` does not exist."),
            )
        }
    }

    /// 404 naming what is served, when several models are: a client can correct its `model`.
    pub fn model_not_served(model: &str, served: &[&str]) -> Self {
        Self {
            message: format!(
                "The model `{model}` does not exist. Served here: {}.",
                served
                    .iter()
                    .map(|m| format!("`{m}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            ..Self::model_not_found(model)
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "Incorrect or missing API key. Send it as `Authorization: Bearer KEY` (or `x-api-key: KEY`).",
            )
        }
    }

    pub fn payload_too_large(limit: Option<u64>) -> Self {
        let message = match limit {
            Some(l) => format!("The request body is larger than the limit of {l} bytes."),
            None => "The request body is larger than the server accepts.".into(),
        };
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            message,
        )
    }

    pub fn body_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "The request body was not received in time.",
        )
    }

    /// 429: the waiting queue is full; sent with `Retry-After`.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
        }
    }

    /// 503: loading, draining for shutdown, or the engine is gone.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable_error",
            message,
        )
    }

    /// 500: the engine failed the request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// Any other status (404 for an unknown route, 405, ...), with the status's own text.
    pub fn from_status(status: StatusCode, message: impl Into<String>) -> Self {
        let kind = if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        Self::new(status, kind, message)
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The engine's verdict on a request ([`sluice_engine::ValidRequest::new`], where every
    /// range is checked), worded as OpenAI does and naming the field as this endpoint calls it.
    pub fn from_invalid(e: InvalidRequest, names: &ParamNames) -> Self {
        match e {
            InvalidRequest::EmptyPrompt => Self::invalid(names.prompt, e.to_string()),
            InvalidRequest::ZeroMaxTokens => Self::invalid(
                names.max_tokens,
                format!("{} must be at least 1.", names.max_tokens),
            ),
            InvalidRequest::TooManyLogprobs { requested, max } => Self::invalid(
                names.logprobs,
                format!(
                    "{} = {requested} is more than the maximum of {max}.",
                    names.logprobs
                ),
            ),
            InvalidRequest::TokenOutOfVocab {
                param: "prompt",
                token,
                vocab_size,
            } => Self::invalid(
                names.prompt,
                format!("token id {token} is outside the vocabulary of {vocab_size} tokens"),
            ),
            // Anthropic's words, which its clients parse.
            InvalidRequest::PromptTooLong {
                prompt_tokens,
                capacity,
            } if names.wording == Wording::Anthropic => Self::invalid(
                names.prompt,
                format!("prompt is too long: {prompt_tokens} tokens > {capacity} maximum"),
            ),
            InvalidRequest::TooManyTokens {
                prompt_tokens,
                max_tokens,
                capacity,
            } if names.wording == Wording::Anthropic => Self::invalid(
                names.max_tokens,
                format!(
                    "input length and `max_tokens` exceed context limit: {prompt_tokens} + \
                     {max_tokens} > {capacity}, decrease input length or `max_tokens` and try \
                     again"
                ),
            ),
            InvalidRequest::PromptTooLong {
                prompt_tokens,
                capacity,
            } => Self::too_long(
                names.prompt,
                prompt_tokens,
                capacity,
                ", which leaves no room for the completion",
            ),
            // An embedding needs no room past its input.
            InvalidRequest::InputTooLong {
                input_tokens,
                capacity,
            } => Self::too_long(names.prompt, input_tokens, capacity, ""),
            InvalidRequest::TooManyTokens {
                prompt_tokens,
                max_tokens,
                capacity,
            } => {
                let noun = names.prompt;
                Self::context_length_exceeded(
                    noun,
                    format!(
                        "This model's maximum context length is {capacity} tokens. However, you \
                         requested {} tokens ({prompt_tokens} in the {noun}, {max_tokens} in the \
                         completion). Please reduce the length of the {noun} or completion.",
                        prompt_tokens.saturating_add(max_tokens)
                    ),
                )
            }
            InvalidRequest::InvalidN { .. }
            | InvalidRequest::TokenOutOfVocab { .. }
            | InvalidRequest::OutOfRange { .. }
            | InvalidRequest::Param { .. } => Self::invalid(e.param(), e.to_string()),
        }
    }

    /// OpenAI's message for a prompt (`noun`) of `tokens` past the `capacity`; `why` says what
    /// that leaves out.
    fn too_long(noun: &str, tokens: usize, capacity: usize, why: &str) -> Self {
        Self::context_length_exceeded(
            noun,
            format!(
                "This model's maximum context length is {capacity} tokens. However, your {noun} \
                 resulted in {tokens} tokens{why}. Please reduce the length of the {noun}."
            ),
        )
    }

    /// OpenAI's code for a prompt that does not fit, so clients that look for it keep working.
    fn context_length_exceeded(param: &str, message: String) -> Self {
        Self::invalid(param, message).with_code("context_length_exceeded")
    }

    pub fn from_submit(e: SubmitError) -> Self {
        match e {
            SubmitError::Overloaded { .. } => Self::overloaded(format!(
                "The server is overloaded ({e}). Please retry after {RETRY_AFTER_SECS}s."
            )),
            SubmitError::ShuttingDown => Self::unavailable("The server is shutting down."),
            SubmitError::ForeignLimits => Self::internal(e.to_string()),
        }
    }

    pub fn object(&self) -> ErrorObject<'_> {
        ErrorObject {
            message: &self.message,
            kind: self.kind,
            param: self.param.as_deref(),
            code: self.code,
        }
    }

    /// The JSON body, as text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&Body {
            error: self.object(),
        })
        .unwrap_or_else(|_| {
            r#"{"error":{"message":"error","type":"server_error","param":null,"code":null}}"#.into()
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.to_json(),
        )
            .into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_serialize_in_openai_shape_with_every_key() {
        let e = ApiError::invalid("temperature", "too hot");
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"message": "too hot", "type": "invalid_request_error",
                "param": "temperature", "code": null}})
        );
        let r = ApiError::overloaded("busy").into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn engine_errors_map_to_statuses_and_params() {
        let e = ApiError::from_submit(SubmitError::Overloaded {
            waiting: 3,
            max_waiting: 3,
        });
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        let e = ApiError::from_submit(SubmitError::ShuttingDown);
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        let e = ApiError::from_invalid(
            InvalidRequest::TokenOutOfVocab {
                param: "prompt",
                token: 9,
                vocab_size: 5,
            },
            &ParamNames::chat(false),
        );
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = ApiError::from_invalid(InvalidRequest::ZeroMaxTokens, &ParamNames::chat(true));
        assert_eq!(e.param.as_deref(), Some("max_completion_tokens"));
        assert_eq!(e.message, "max_completion_tokens must be at least 1.");
        let e = ApiError::from_invalid(
            InvalidRequest::TooManyLogprobs {
                requested: 21,
                max: 20,
            },
            &ParamNames::chat(false),
        );
        assert_eq!(
            e.message,
            "top_logprobs = 21 is more than the maximum of 20."
        );
        let e = ApiError::from_invalid(
            InvalidRequest::OutOfRange {
                param: "top_p",
                value: 1.5,
                range: "(0, 1]",
            },
            &ParamNames::COMPLETIONS,
        );
        assert_eq!(
            (e.status, e.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("top_p"))
        );
        assert_eq!(
            e.message,
            "1.5 is not a valid value for `top_p`: it must be in (0, 1]."
        );
    }

    #[test]
    fn context_overflow_uses_openais_message() {
        let e = ApiError::from_invalid(
            InvalidRequest::TooManyTokens {
                prompt_tokens: 10,
                max_tokens: 20,
                capacity: 25,
            },
            &ParamNames::chat(false),
        );
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
        let e = ApiError::from_invalid(
            InvalidRequest::PromptTooLong {
                prompt_tokens: 25,
                capacity: 25,
            },
            &ParamNames::COMPLETIONS,
        );
        assert_eq!(e.param.as_deref(), Some("prompt"));
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert!(e.message.contains("your prompt resulted in 25 tokens"));
    }

    /// Claude Code reads these numbers back and retries with a `max_tokens` that fits.
    #[test]
    fn context_overflow_on_messages_uses_anthropics_message() {
        let names = ParamNames {
            prompt: "messages",
            max_tokens: "max_tokens",
            logprobs: "logprobs",
            wording: Wording::Anthropic,
        };
        let e = ApiError::from_invalid(
            InvalidRequest::TooManyTokens {
                prompt_tokens: 11723,
                max_tokens: 32000,
                capacity: 16384,
            },
            &names,
        );
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert_eq!(
            e.message,
            "input length and `max_tokens` exceed context limit: 11723 + 32000 > 16384, \
             decrease input length or `max_tokens` and try again"
        );
        let e = ApiError::from_invalid(
            InvalidRequest::PromptTooLong {
                prompt_tokens: 20000,
                capacity: 16384,
            },
            &names,
        );
        assert_eq!(
            e.message,
            "prompt is too long: 20000 tokens > 16384 maximum"
        );
    }
}
