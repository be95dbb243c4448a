//! `POST /tokenize` and `POST /detokenize`, as vLLM's: a prompt (or chat messages, rendered
//! with the template) to token ids, and ids back to text.

use axum::extract::State;
use axum::Json;

use crate::chat::template;
use crate::edge::error::ApiError;
use crate::engine::blocking::tokenize_blocking;
use crate::engine::fields;
use crate::engine::state::AppState;
use crate::openai::tokenize::{
    DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
};
use crate::routes::json::ApiJson;

pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let model = state.model_for(req.model.as_deref()).await?;
    fields::check_model(req.model.as_deref(), &model)?;
    let max_model_len = model.capacity();
    let tokens = tokenize_blocking(move || {
        let tokenizer = model.tokenizer();
        match (req.prompt, req.messages) {
            (Some(prompt), None) => {
                let ids = if req.add_special_tokens.unwrap_or(true) {
                    tokenizer.encode_prompt(&prompt)
                } else {
                    tokenizer.encode(&prompt)
                };
                ids.map_err(|e| ApiError::invalid("prompt", e.to_string()))
            }
            (None, Some(messages)) => {
                let text = template::render_chat(
                    model.chat_template.as_ref(),
                    &messages,
                    req.add_generation_prompt.unwrap_or(true),
                    req.tools.as_deref(),
                    req.chat_template_kwargs.as_ref(),
                )?;
                tokenizer
                    .encode(&text)
                    .map_err(|e| ApiError::invalid("messages", e.to_string()))
            }
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "messages",
                "Give either `prompt` or `messages`, not both.",
            )),
            (None, None) => Err(ApiError::invalid(
                "prompt",
                "Give a `prompt` or chat `messages` to tokenize.",
            )),
        }
    })
    .await?;
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        tokens,
        max_model_len,
    }))
}

pub async fn detokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let model = state.model_for(req.model.as_deref()).await?;
    fields::check_model(req.model.as_deref(), &model)?;
    let vocab = model.limits().vocab_size;
    if let Some((i, bad)) = req
        .tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        return Err(ApiError::invalid(
            format!("tokens[{i}]"),
            format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
        ));
    }
    let prompt =
        tokenize_blocking(move || Ok(model.tokenizer().decode(&req.tokens, false))).await?;
    Ok(Json(DetokenizeResponse { prompt }))
}
