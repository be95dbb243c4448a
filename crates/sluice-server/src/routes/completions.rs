//! `POST /v1/completions`.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use sluice_engine::{FinishEvent, Request};

use crate::chat::grammar;
use crate::edge::error::{ApiError, ParamNames};
use crate::edge::field_policy;
use crate::edge::sse;
use crate::engine::blocking::tokenize_blocking;
use crate::engine::fields;
use crate::engine::generation::{self, Generation, Item};
use crate::engine::logprobs;
use crate::engine::state::{AppState, ServedModel};
use crate::openai::completions::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
};
use crate::openai::Prompt;
use crate::routes::json::ApiJson;

/// OpenAI's default for this endpoint.
const DEFAULT_MAX_TOKENS: usize = 16;
const OBJECT: &str = "text_completion";

pub async fn handler(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let model = state.model_for(req.model.as_deref()).await?;
    let PreparedCompletion {
        texts,
        requests,
        stream,
        include_usage,
        echo,
        with_logprobs,
    } = prepare(&model, req).await?;
    let echoes: Vec<String> = if echo { texts } else { Vec::new() };
    let generation = Generation::start(
        &state,
        model,
        generation::request_id("cmpl"),
        "completions",
        started,
        requests,
        &ParamNames::COMPLETIONS,
    )?;
    if stream {
        Ok(sse::response(stream_chunks(
            generation,
            echoes,
            with_logprobs,
            include_usage,
        )))
    } else {
        Ok(collect(generation, echoes, with_logprobs)
            .await?
            .into_response())
    }
}

/// A completions request checked and tokenized, not yet validated against the engine's limits
/// ([`generation::validate`] does that): what [`handler`] submits, and what
/// `POST /v1/completions/render` shows.
pub struct PreparedCompletion {
    /// Each prompt's text (as given, or the given ids decoded).
    pub texts: Vec<String>,
    /// The engine's request for each prompt, in order.
    pub requests: Vec<Request>,
    pub stream: bool,
    /// `stream_options.include_usage` (only with `stream`).
    pub include_usage: bool,
    pub echo: bool,
    pub with_logprobs: bool,
}

/// Every check of a completions request that needs no engine, its grammar compiled and its
/// prompts tokenized (off the async workers). A 400 names the field at fault.
pub async fn prepare(
    model: &Arc<ServedModel>,
    mut req: CompletionRequest,
) -> Result<PreparedCompletion, ApiError> {
    let lora = fields::check_model(req.model.as_deref(), model)?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid(
            "suffix",
            "suffix (insertion) is not supported by this server.",
        ));
    }
    let logprobs = req.logprobs;
    let echo = req.echo.unwrap_or(false);
    if echo && logprobs.is_some() {
        return Err(ApiError::invalid(
            "echo",
            "echo together with logprobs needs the prompt's log-probabilities, which this \
             server does not compute; drop one of them.",
        ));
    }
    let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let mut request = fields::request(&req.sampling(), Some(max_tokens), logprobs)?;
    request.lora = lora;
    if let Some(best_of) = req.best_of.filter(|&b| b != request.n) {
        return Err(ApiError::invalid(
            "best_of",
            format!("best_of = {best_of} is not supported; only best_of = n."),
        ));
    }
    let stream = req.stream.unwrap_or(false);
    let include_usage = stream
        && req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);

    field_policy::check_extra_fields(&req.extra)?;
    let requested = grammar::requested_grammar(req.constraint_fields())?;

    let tokenize_model = model.clone();
    let prompt = req.prompt;
    let (prompts, constraint) = tokenize_blocking(move || {
        let constraint = requested
            .map(|g| tokenize_model.compile_constraint(g.grammar, g.param))
            .transpose()?;
        Ok((prompt_tokens(&tokenize_model, prompt)?, constraint))
    })
    .await?;
    request.constraint = constraint;
    let (requests, texts) = prompts
        .into_iter()
        .map(|(prompt, text)| {
            let request = Request {
                prompt,
                ..request.clone()
            };
            (request, text)
        })
        .unzip();
    Ok(PreparedCompletion {
        texts,
        requests,
        stream,
        include_usage,
        echo,
        with_logprobs: logprobs.is_some(),
    })
}

/// Each prompt's token ids, and its text (for `echo`).
fn prompt_tokens(model: &ServedModel, prompt: Prompt) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    let tokenizer = model.tokenizer();
    let empty = || ApiError::invalid("prompt", "The prompt is empty.");
    let limits = model.limits();
    let encode = |text: String| {
        if text.is_empty() {
            return Err(empty());
        }
        let ids = tokenizer
            .encode_prompt(&text)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
        Ok((ids, text))
    };
    let from_ids = |ids: Vec<u32>| {
        // The engine's check, before decoding (for `echo`) reads the ids.
        limits
            .check_prompt(&ids)
            .map_err(|e| ApiError::from_invalid(e, &ParamNames::COMPLETIONS))?;
        let text = tokenizer.decode(&ids, false);
        Ok((ids, text))
    };
    match prompt {
        Prompt::Text(text) => Ok(vec![encode(text)?]),
        Prompt::Texts(texts) if texts.is_empty() => Err(empty()),
        Prompt::Texts(texts) => texts.into_iter().map(encode).collect(),
        Prompt::Tokens(ids) => Ok(vec![from_ids(ids)?]),
        Prompt::TokenLists(lists) if lists.is_empty() => Err(empty()),
        Prompt::TokenLists(lists) => lists.into_iter().map(from_ids).collect(),
    }
}

#[derive(Default)]
struct ChoiceState {
    text: String,
    logprobs: Option<CompletionLogprobs>,
    /// Where the next token starts in the choice's text.
    offset: logprobs::TextOffset,
    finish: Option<FinishEvent>,
}

fn token_logprobs(
    generation: &Generation,
    choice: &mut ChoiceState,
    event: &sluice_engine::TokenEvent,
) -> Option<CompletionLogprobs> {
    let lp = event.logprobs.as_ref()?;
    let mut out = CompletionLogprobs::default();
    logprobs::push_completion(
        &mut out,
        generation.model.tokenizer(),
        generation.skip_special_tokens,
        lp,
        &mut choice.offset,
    );
    Some(out)
}

async fn collect(
    mut generation: Generation,
    echoes: Vec<String>,
    with_logprobs: bool,
) -> Result<axum::Json<CompletionResponse>, ApiError> {
    let mut choices: Vec<ChoiceState> = (0..generation.num_choices())
        .map(|c| {
            let echo = echoes
                .get(generation.prompt_of(c))
                .cloned()
                .unwrap_or_default();
            ChoiceState {
                offset: logprobs::TextOffset::after(&echo),
                text: echo,
                logprobs: with_logprobs.then(CompletionLogprobs::default),
                finish: None,
            }
        })
        .collect();
    while let Some(item) = generation.next().await {
        match item {
            Item::Token { choice, event } => {
                let Some(state) = choices.get_mut(choice) else {
                    continue;
                };
                state.text.push_str(&event.text);
                if let Some(lp) = token_logprobs(&generation, state, &event) {
                    if let Some(all) = &mut state.logprobs {
                        all.append(lp);
                    }
                }
            }
            Item::Finished { event, .. } if event.reason == sluice_engine::FinishReason::Error => {
                return Err(generation::engine_failure(&event))
            }
            Item::Finished { choice, event } => {
                if let Some(state) = choices.get_mut(choice) {
                    state.finish = Some(event);
                }
            }
            Item::Lost => return Err(generation::engine_lost()),
        }
    }
    let usage = generation.usage();
    Ok(axum::Json(CompletionResponse {
        id: generation.id.clone(),
        object: OBJECT,
        created: generation.created,
        model: generation.served_as.clone(),
        choices: choices
            .into_iter()
            .enumerate()
            .map(|(index, c)| CompletionChoice {
                index,
                text: c.text,
                logprobs: c.logprobs,
                finish_reason: c
                    .finish
                    .as_ref()
                    .map(|f| generation::finish_reason(f.reason)),
                stop_reason: c.finish.as_ref().and_then(generation::stop_reason),
            })
            .collect(),
        usage: Some(Some(usage)),
    }))
}

fn chunk(generation: &Generation, choices: Vec<CompletionChoice>) -> CompletionResponse {
    CompletionResponse {
        id: generation.id.clone(),
        object: OBJECT,
        created: generation.created,
        model: generation.served_as.clone(),
        choices,
        usage: None,
    }
}

fn stream_chunks(
    mut generation: Generation,
    echoes: Vec<String>,
    with_logprobs: bool,
    include_usage: bool,
) -> impl futures_util::Stream<Item = axum::response::sse::Event> + Send {
    async_stream::stream! {
        let usage_field = |mut c: CompletionResponse| {
            if include_usage {
                c.usage = Some(None);
            }
            c
        };
        let mut choices: Vec<ChoiceState> = (0..generation.num_choices())
            .map(|_| ChoiceState::default())
            .collect();
        for (index, state) in choices.iter_mut().enumerate() {
            let Some(echo) = echoes.get(generation.prompt_of(index)) else {
                continue;
            };
            state.offset = logprobs::TextOffset::after(echo);
            let choice = CompletionChoice {
                index,
                text: echo.clone(),
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            };
            yield sse::json(&usage_field(chunk(&generation, vec![choice])));
        }
        while let Some(item) = generation.next().await {
            match item {
                Item::Token { choice, event } => {
                    let Some(state) = choices.get_mut(choice) else {
                        continue;
                    };
                    let logprobs = token_logprobs(&generation, state, &event);
                    // A token whose text is held back (half a character, a possible stop
                    // string) sends nothing, unless its logprobs were asked for.
                    if event.text.is_empty() && !(with_logprobs && logprobs.is_some()) {
                        continue;
                    }
                    let c = CompletionChoice {
                        index: choice,
                        text: event.text,
                        logprobs,
                        finish_reason: None,
                        stop_reason: None,
                    };
                    yield sse::json(&usage_field(chunk(&generation, vec![c])));
                }
                Item::Finished { event, .. } if event.reason == sluice_engine::FinishReason::Error => {
                    yield sse::error(&generation::engine_failure(&event));
                    yield sse::done();
                    return;
                }
                Item::Finished { choice, event } => {
                    let c = CompletionChoice {
                        index: choice,
                        text: String::new(),
                        logprobs: None,
                        finish_reason: Some(generation::finish_reason(event.reason)),
                        stop_reason: generation::stop_reason(&event),
                    };
                    yield sse::json(&usage_field(chunk(&generation, vec![c])));
                }
                Item::Lost => {
                    yield sse::error(&generation::engine_lost());
                    yield sse::done();
                    return;
                }
            }
        }
        if include_usage {
            let mut last = chunk(&generation, Vec::new());
            last.usage = Some(Some(generation.usage()));
            yield sse::json(&last);
        }
        yield sse::done();
    }
}
