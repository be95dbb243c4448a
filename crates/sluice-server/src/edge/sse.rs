//! Server-sent events as OpenAI streams them: `data: {json}\n\n` per chunk, comment lines as
//! keep-alives while a request waits (long queue, long prefill), an error object if the engine
//! fails mid-stream, and `data: [DONE]` at the end.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use serde::Serialize;

use crate::edge::error::ApiError;

/// Often enough for proxies with a 30-60 s idle timeout.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

pub fn json<T: Serialize>(value: &T) -> Event {
    match serde_json::to_string(value) {
        Ok(text) => Event::default().data(text),
        // Our response types always serialize; should one ever not, the client sees why.
        Err(e) => error(&ApiError::internal(format!(
            "cannot serialize a chunk: {e}"
        ))),
    }
}

/// `data: {"error": {...}}`, as vLLM sends when a request fails mid-stream.
pub fn error(e: &ApiError) -> Event {
    Event::default().data(e.to_json())
}

pub fn done() -> Event {
    Event::default().data("[DONE]")
}

pub fn response(events: impl Stream<Item = Event> + Send + 'static) -> Response {
    Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}
