//! `POST /v1/completions/render` and `POST /v1/chat/completions/render`, as vLLM's: the bodies
//! of `/v1/completions` and `/v1/chat/completions`, checked by the very code those routes run
//! (so a bad body is the same 400 naming the same field), answered with the prompt the engine
//! would be given (its token ids and text) and the parameters it would run with, without
//! generating. Routers that score servers by the tokens they have cached (llm-d) tokenize
//! requests through these routes.

use axum::extract::State;
use axum::Json;
use sluice_engine::ValidRequest;

use crate::chat::pipeline;
use crate::edge::error::{ApiError, ParamNames};
use crate::engine::generation;
use crate::engine::state::{AppState, ServedModel};
use crate::openai::chat::ChatRequest;
use crate::openai::completions::CompletionRequest;
use crate::openai::render::{RenderedRequest, RenderedSampling, RenderedStreamOptions};
use crate::routes::json::ApiJson;
use crate::routes::{chat, completions};

/// One rendered request per prompt, in the order given.
pub async fn completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Json<Vec<RenderedRequest>>, ApiError> {
    let model = state.model_for(req.model.as_deref()).await?;
    let prepared = completions::prepare(&model, req).await?;
    let options = stream_options(prepared.stream, prepared.include_usage);
    let requests = generation::validate(&model, prepared.requests, &ParamNames::COMPLETIONS)?;
    Ok(Json(
        requests
            .iter()
            .zip(prepared.texts)
            .map(|(request, text)| rendered(&model, "cmpl", request, text, options))
            .collect(),
    ))
}

/// The conversation rendered with the chat template, as one request.
pub async fn chat(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Json<RenderedRequest>, ApiError> {
    let model = state.model_for(req.model.as_deref()).await?;
    let (job, delivery) = chat::job(&model, req)?;
    let prepared = pipeline::prepare(&model, state.media(), job).await?;
    let options = stream_options(delivery.stream, delivery.include_usage);
    let request = generation::validate(&model, vec![prepared.request], &prepared.names)?
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::internal("A conversation rendered to no request."))?;
    Ok(Json(rendered(
        &model,
        "chatcmpl",
        &request,
        prepared.text,
        options,
    )))
}

fn stream_options(stream: bool, include_usage: bool) -> (bool, Option<RenderedStreamOptions>) {
    (
        stream,
        stream.then_some(RenderedStreamOptions { include_usage }),
    )
}

/// The engine's request as the answer states it: the prompt and every parameter as validated,
/// defaults filled in.
fn rendered(
    model: &ServedModel,
    id_prefix: &str,
    request: &ValidRequest,
    text: String,
    (stream, stream_options): (bool, Option<RenderedStreamOptions>),
) -> RenderedRequest {
    let r = request.request();
    let s = &r.sampling;
    RenderedRequest {
        request_id: generation::request_id(id_prefix),
        token_ids: r.prompt.clone(),
        prompt: text,
        features: None,
        sampling_params: RenderedSampling {
            n: request.n(),
            max_tokens: request.max_tokens(),
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k,
            min_p: s.min_p,
            top_n_sigma: s.top_n_sigma,
            presence_penalty: s.presence_penalty,
            frequency_penalty: s.frequency_penalty,
            repetition_penalty: s.repetition_penalty,
            seed: s.seed,
            logprobs: s.logprobs,
            logit_bias: (!s.logit_bias.is_empty()).then(|| {
                s.logit_bias
                    .iter()
                    .map(|&(token, bias)| (token.to_string(), bias))
                    .collect()
            }),
            stop: r.stop.stop.clone(),
            stop_token_ids: r.stop.stop_token_ids.clone(),
            ignore_eos: r.stop.ignore_eos,
            min_tokens: r.stop.min_tokens,
            skip_special_tokens: r.stop.skip_special_tokens,
            include_stop_str_in_output: r.stop.include_stop_str_in_output,
        },
        model: model.name.clone(),
        stream,
        stream_options,
    }
}
