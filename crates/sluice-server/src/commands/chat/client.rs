//! `sluice chat`'s side of the API: the served models (`GET /v1/models`) and one streamed chat
//! completion (`POST /v1/chat/completions`, OpenAI's server-sent events) read into
//! [`Delta`]s. It speaks to any OpenAI-compatible server, sluice's own in-process one included.

use futures_util::StreamExt;
use serde_json::{json, Value};

/// A piece of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    Content(String),
    /// `reasoning_content`: a thinking model's reasoning, shown dimmed.
    Reasoning(String),
    /// A tool call's name (when it starts) or a piece of its arguments.
    ToolCall {
        name: Option<String>,
        arguments: String,
    },
    /// How the answer ended (`stop`, `length`, `tool_calls`, ...).
    Finish(String),
    /// The usage chunk: the answer's tokens.
    Usage {
        completion_tokens: u64,
    },
}

/// The sampling choices a turn is sent with.
#[derive(Debug, Clone, Copy)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub max_tokens: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach {url}: {source}")]
    Connect { url: String, source: reqwest::Error },
    #[error("the server answered {status}: {message}")]
    Api { status: u16, message: String },
    #[error("the stream broke off: {0}")]
    Stream(reqwest::Error),
    #[error("the server sent something that is not JSON: {0}")]
    Event(String),
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
}

impl Client {
    /// A client of the server at `base` (`http://HOST:PORT`, with or without a trailing `/v1`).
    pub fn new(base: &str, api_key: Option<String>) -> Self {
        let base = base.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base).to_string();
        Self {
            http: reqwest::Client::new(),
            base,
            api_key,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.api_key {
            Some(key) => r.bearer_auth(key),
            None => r,
        }
    }

    async fn send(&self, r: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let response = r.send().await.map_err(|source| ClientError::Connect {
            url: self.base.clone(),
            source,
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        Err(ClientError::Api {
            status,
            message: error_message(status, &body),
        })
    }

    /// The ids the server lists, in its order (the first is its default).
    pub async fn models(&self) -> Result<Vec<String>, ClientError> {
        let response = self
            .send(self.request(reqwest::Method::GET, "/v1/models"))
            .await?;
        let text = response.text().await.map_err(ClientError::Stream)?;
        let list: Value = serde_json::from_str(&text).map_err(|_| ClientError::Event(text))?;
        Ok(list["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["id"].as_str().map(str::to_string))
            .collect())
    }

    /// Streams one answer to `messages`, handing each piece to `each` as it arrives. Dropping
    /// the returned future (ctrl-c) closes the connection, and the server frees the sequence.
    pub async fn stream_chat(
        &self,
        model: &str,
        messages: Value,
        sampling: Sampling,
        mut each: impl FnMut(Delta),
    ) -> Result<(), ClientError> {
        let mut body = json!({
            "model": model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(t) = sampling.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(n) = sampling.max_tokens {
            body["max_tokens"] = json!(n);
        }
        let response = self
            .send(
                self.request(reqwest::Method::POST, "/v1/chat/completions")
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.to_string()),
            )
            .await?;
        let mut bytes = response.bytes_stream();
        let mut events = EventLines::default();
        while let Some(chunk) = bytes.next().await {
            let chunk = chunk.map_err(ClientError::Stream)?;
            for data in events.push(&chunk) {
                if data == "[DONE]" {
                    return Ok(());
                }
                let event: Value =
                    serde_json::from_str(&data).map_err(|_| ClientError::Event(data.clone()))?;
                if let Some(message) = event["error"]["message"].as_str() {
                    return Err(ClientError::Api {
                        status: 200,
                        message: message.to_string(),
                    });
                }
                deltas(&event).into_iter().for_each(&mut each);
            }
        }
        Ok(())
    }
}

/// The `message` of an OpenAI-shaped error body, else the body itself; what a 401 means.
fn error_message(status: u16, body: &str) -> String {
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.trim().to_string());
    if status == 401 {
        format!("{message} (give the server's key with --api-key or SLUICE_API_KEY)")
    } else {
        message
    }
}

/// The pieces of one chunk of a chat completion stream.
fn deltas(event: &Value) -> Vec<Delta> {
    let mut out = Vec::new();
    if let Some(choice) = event["choices"].get(0) {
        let delta = &choice["delta"];
        if let Some(text) = delta["reasoning_content"]
            .as_str()
            .filter(|t| !t.is_empty())
        {
            out.push(Delta::Reasoning(text.to_string()));
        }
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            out.push(Delta::Content(text.to_string()));
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let function = &call["function"];
            out.push(Delta::ToolCall {
                name: function["name"].as_str().map(str::to_string),
                arguments: function["arguments"].as_str().unwrap_or("").to_string(),
            });
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            out.push(Delta::Finish(reason.to_string()));
        }
    }
    if let Some(tokens) = event["usage"]["completion_tokens"].as_u64() {
        out.push(Delta::Usage {
            completion_tokens: tokens,
        });
    }
    out
}

/// Server-sent events cut into `data:` payloads, however the bytes are split: an event ends
/// at a blank line, and its `data:` lines join with newlines.
#[derive(Default)]
struct EventLines {
    buffer: Vec<u8>,
    data: Vec<String>,
}

impl EventLines {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    events.push(self.data.join("\n"));
                    self.data.clear();
                }
            } else if let Some(data) = line.strip_prefix("data:") {
                self.data
                    .push(data.strip_prefix(' ').unwrap_or(data).to_string());
            }
            // Comments (`: keep-alive`), `event:` and `id:` lines carry nothing for us.
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_whole_however_the_bytes_are_cut() {
        let stream =
            b"data: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\":\xc3\xa9}\r\n\r\ndata: [DONE]\n\n";
        for cut in 1..stream.len() {
            let mut lines = EventLines::default();
            let mut events = lines.push(&stream[..cut]);
            events.extend(lines.push(&stream[cut..]));
            assert_eq!(events, ["{\"a\":1}", "{\"b\":é}", "[DONE]"], "cut at {cut}");
        }
    }

    #[test]
    fn a_chunk_gives_its_reasoning_content_tool_calls_finish_and_usage() {
        let chunk = json!({"choices": [{"index": 0, "delta": {
            "reasoning_content": "hmm", "content": "Hi",
            "tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{\"x\""}}]
        }, "finish_reason": "tool_calls"}]});
        assert_eq!(
            deltas(&chunk),
            [
                Delta::Reasoning("hmm".into()),
                Delta::Content("Hi".into()),
                Delta::ToolCall {
                    name: Some("f".into()),
                    arguments: "{\"x\"".into()
                },
                Delta::Finish("tool_calls".into()),
            ]
        );
        let usage = json!({"choices": [], "usage": {"completion_tokens": 7}});
        assert_eq!(
            deltas(&usage),
            [Delta::Usage {
                completion_tokens: 7
            }]
        );
        assert!(deltas(&json!({"choices": [{"delta": {"content": ""}}]})).is_empty());
    }

    #[test]
    fn errors_say_the_servers_message_and_what_a_401_needs() {
        let body = r#"{"error": {"message": "no such model", "type": "x"}}"#;
        assert_eq!(error_message(404, body), "no such model");
        assert!(error_message(401, body).contains("--api-key"));
        assert_eq!(error_message(502, " bad gateway\n"), "bad gateway");
    }

    #[test]
    fn the_base_may_name_v1() {
        for base in [
            "http://h:1",
            "http://h:1/",
            "http://h:1/v1",
            "http://h:1/v1/",
        ] {
            assert_eq!(Client::new(base, None).base, "http://h:1");
        }
    }
}
