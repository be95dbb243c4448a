//! One client request as the engine runs it: its prompts validated into the engine's
//! [`ValidRequest`]s (every range is checked there, once) and submitted, their event streams
//! merged into one stream of choices, and the log line written when it ends.
//!
//! A [`Generation`] owns the engine's [`RequestStream`]s. Whoever holds it (the handler future
//! of a non-streaming request, the SSE body of a streaming one) dropping it, because the client
//! went away, aborts every sequence it still has in the engine.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{self, SelectAll, Stream, StreamExt};
use sluice_engine::{ErrorCause, StopReason, TokenEvent, ValidRequest};
use sluice_engine::{Event, FinishEvent, FinishReason, Request, RequestStream};

use crate::edge::error::{ApiError, ParamNames};
use crate::edge::ids::random_id;
use crate::engine::state::{AppState, InFlight, ServedModel};

/// `cmpl-…`, `chatcmpl-…`: a prefix and 24 random hex digits.
pub fn request_id(prefix: &str) -> String {
    random_id(prefix, '-')
}

/// An event of one choice (`prompt index * n + sequence index`).
#[derive(Debug)]
pub enum Item {
    Token {
        choice: usize,
        event: TokenEvent,
    },
    Finished {
        choice: usize,
        event: FinishEvent,
    },
    /// The engine stopped before finishing this request: it will never finish.
    Lost,
}

/// The engine's requests (one per prompt, as the endpoint built them), each checked against
/// the engine's limits ([`ValidRequest::new`]); the first invalid one refuses them all with a
/// 400 naming the field as the endpoint calls it (`names`). What [`Generation::start`]
/// submits, and what the render routes show without submitting.
pub fn validate(
    model: &ServedModel,
    requests: Vec<Request>,
    names: &ParamNames,
) -> Result<Vec<ValidRequest>, ApiError> {
    requests
        .into_iter()
        .map(|request| {
            model
                .engine
                .validate(request)
                .map_err(|e| ApiError::from_invalid(e, names))
        })
        .collect()
}

type Events = SelectAll<Pin<Box<dyn Stream<Item = (usize, Option<Event>)> + Send>>>;

pub struct Generation {
    pub id: String,
    pub created: u64,
    pub model: Arc<ServedModel>,
    /// The name its responses give as `model`: the LoRA adapter it runs with, else the
    /// served model's.
    pub served_as: String,
    /// Sequences per prompt.
    pub n: usize,
    /// Prompt tokens of each prompt.
    pub prompt_tokens: Vec<usize>,
    /// Control tokens are left out of the text (logprobs still list them, by name).
    pub skip_special_tokens: bool,
    events: Events,
    log: RequestLog,
}

impl Generation {
    /// Validates one engine request per prompt ([`validate`]), then submits them all: an
    /// invalid prompt refuses the whole request before any is queued, and on a failed
    /// submission nothing stays queued (streams already submitted are dropped, which aborts
    /// them).
    pub fn start(
        state: &AppState,
        model: Arc<ServedModel>,
        id: String,
        endpoint: &'static str,
        started: Instant,
        requests: Vec<Request>,
        names: &ParamNames,
    ) -> Result<Self, ApiError> {
        let skip_special_tokens = requests.first().is_none_or(|r| r.stop.skip_special_tokens);
        let requests = validate(&model, requests, names)?;
        Self::submit(
            state,
            model,
            id,
            endpoint,
            started,
            requests,
            skip_special_tokens,
        )
    }

    /// Submits requests already validated (all with the same `n`), as [`Generation::start`]
    /// does once it has validated its own; embeddings come this way.
    pub fn submit(
        state: &AppState,
        model: Arc<ServedModel>,
        id: String,
        endpoint: &'static str,
        started: Instant,
        requests: Vec<ValidRequest>,
        skip_special_tokens: bool,
    ) -> Result<Self, ApiError> {
        // Counted in flight before the engine can see it: a drain (or a test) that finds
        // nothing in flight must not miss a request the engine already runs.
        let in_flight = state.track();
        let n = requests.first().map_or(1, ValidRequest::n);
        let served_as = requests
            .first()
            .and_then(ValidRequest::adapter)
            .map_or_else(|| model.name.clone(), |lora| lora.key.name.to_string());
        let prompt_tokens: Vec<usize> = requests.iter().map(ValidRequest::prompt_len).collect();
        let mut streams = Vec::with_capacity(requests.len());
        for request in requests {
            let stream = model
                .engine
                .submit(request)
                .map_err(ApiError::from_submit)?;
            streams.push(stream);
        }
        let engine_ids: Vec<u64> = streams.iter().map(RequestStream::id).collect();
        tracing::debug!(request_id = %id, ?engine_ids, "submitted");
        let events = stream::select_all(
            streams
                .into_iter()
                .enumerate()
                .map(|(i, s)| prompt_events(i, s)),
        );
        let log = RequestLog {
            id: id.clone(),
            endpoint,
            started,
            prompt_tokens: prompt_tokens.iter().sum(),
            completion_tokens: 0,
            cached_tokens: 0,
            first_token: None,
            finish: vec![None; prompt_tokens.len() * n],
            _in_flight: in_flight,
        };
        Ok(Self {
            id,
            created: crate::engine::state::unix_now(),
            model,
            served_as,
            n,
            prompt_tokens,
            skip_special_tokens,
            events,
            log,
        })
    }

    pub fn num_choices(&self) -> usize {
        self.prompt_tokens.len() * self.n
    }

    /// The prompt a choice continues.
    pub fn prompt_of(&self, choice: usize) -> usize {
        choice / self.n
    }

    /// The next event of any choice; `None` once every choice has finished.
    pub async fn next(&mut self) -> Option<Item> {
        let (prompt, event) = self.events.next().await?;
        let item = match event {
            None => Item::Lost,
            Some(Event::Token(event)) => {
                self.log.completion_tokens += 1;
                self.log.first_token.get_or_insert_with(Instant::now);
                Item::Token {
                    choice: prompt * self.n + event.index as usize,
                    event,
                }
            }
            Some(Event::Finished(event)) => {
                let choice = prompt * self.n + event.index as usize;
                if event.index == 0 {
                    // A prompt's sequences share its cached prefix: count it once.
                    self.log.cached_tokens += event.usage.cached_tokens;
                }
                if let Some(slot) = self.log.finish.get_mut(choice) {
                    *slot = Some(event.reason);
                }
                Item::Finished { choice, event }
            }
        };
        Some(item)
    }

    /// Prompt tokens whose K/V the prefix cache already held (known once the choices have
    /// finished).
    pub fn cached_tokens(&self) -> usize {
        self.log.cached_tokens
    }

    pub fn usage(&self) -> crate::openai::Usage {
        crate::openai::Usage::new(self.log.prompt_tokens, self.log.completion_tokens)
    }
}

/// One prompt's events tagged with its index; a final `None` if the engine dropped the
/// request without finishing it.
fn prompt_events(
    index: usize,
    stream: RequestStream,
) -> Pin<Box<dyn Stream<Item = (usize, Option<Event>)> + Send>> {
    stream::unfold(Some(stream), move |state| async move {
        let mut stream = state?;
        match stream.recv().await {
            Some(event) => Some(((index, Some(event)), Some(stream))),
            None if stream.is_finished() => None,
            None => Some(((index, None), None)),
        }
    })
    .boxed()
}

/// OpenAI's `finish_reason`. An aborted sequence (drain timeout) reports `abort`, as vLLM's.
pub fn finish_reason(reason: FinishReason) -> &'static str {
    reason.as_str()
}

/// vLLM's `stop_reason`: the stop string or stop token id that ended the choice.
pub fn stop_reason(event: &FinishEvent) -> Option<serde_json::Value> {
    match event.stop_reason.as_ref()? {
        StopReason::String(s) => Some(serde_json::Value::String(s.clone())),
        StopReason::TokenId(id) => Some(serde_json::Value::from(*id)),
        StopReason::Eos(_) => None,
    }
}

/// The error a client gets for a choice the engine failed.
/// The error a failed choice answers with: a 400 when the request's own grammar could not be
/// followed (it asked for more than the grammar engine's budget), a 500 otherwise.
pub fn engine_failure(event: &FinishEvent) -> ApiError {
    let message = event.error.as_deref().unwrap_or("unknown error");
    match event.error_cause {
        Some(ErrorCause::Constraint) => ApiError::malformed(format!(
            "The output constraint could not be followed: {message}"
        )),
        _ => ApiError::internal(format!("The engine failed while generating: {message}")),
    }
}

pub fn engine_lost() -> ApiError {
    ApiError::unavailable("The engine stopped before the request finished.")
}

/// Writes the request's one info line when it ends, however it ends (finished, failed, or
/// dropped because the client went away). Never the prompt or the output.
struct RequestLog {
    id: String,
    endpoint: &'static str,
    started: Instant,
    prompt_tokens: usize,
    completion_tokens: usize,
    /// Prompt tokens the prefix cache held, summed over the prompts.
    cached_tokens: usize,
    first_token: Option<Instant>,
    finish: Vec<Option<FinishReason>>,
    /// Keeps the request counted as in flight for shutdown's drain.
    _in_flight: InFlight,
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let mut reasons: Vec<&str> = self
            .finish
            .iter()
            .map(|r| r.map_or("client_disconnected", FinishReason::as_str))
            .collect();
        reasons.sort_unstable();
        reasons.dedup();
        let ttft_ms = self
            .first_token
            .map(|t| (t - self.started).as_secs_f64() * 1e3);
        tracing::info!(
            request_id = %self.id,
            endpoint = self.endpoint,
            prompt_tokens = self.prompt_tokens,
            completion_tokens = self.completion_tokens,
            ttft_ms = ttft_ms.map(|t| (t * 10.0).round() / 10.0),
            duration_ms = (self.started.elapsed().as_secs_f64() * 1e4).round() / 10.0,
            finish_reason = reasons.join(","),
            "request finished"
        );
    }
}
