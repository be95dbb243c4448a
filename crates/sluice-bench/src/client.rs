//! One streamed completion request and the timestamps of its tokens.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::StreamExt;
use serde_json::Value;

use crate::server_metrics::{self, Scrape};
use crate::structured::ToolCall;

pub struct Client {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
}

/// Which endpoint a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`: token-id prompts, output in `choices[0].text`.
    Completions,
    /// `/v1/chat/completions`: text messages, output in `choices[0].delta` (content,
    /// reasoning, tool calls).
    Chat,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Self::Completions => "/v1/completions",
            Self::Chat => "/v1/chat/completions",
        }
    }
}

/// One request, ready to send.
#[derive(Debug, Clone)]
pub struct Request {
    pub endpoint: Endpoint,
    pub body: Value,
    /// The prompt's length as generated (tokens, or words for chat); the server's `usage`
    /// replaces it when it reports one.
    pub prompt_tokens: usize,
    pub max_tokens: usize,
}

/// What one request measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub ttft: Duration,
    /// Gaps between consecutive content chunks.
    pub itl: Vec<Duration>,
    pub e2e: Duration,
    /// When it finished, counted from the start of the run (set by the runner).
    pub finished_at: Duration,
    pub error: Option<String>,
    /// `finish_reason` of the last chunk that had one.
    pub finish_reason: Option<String>,
    /// The output text (content only, for chat) and the tool calls, reassembled; the runner
    /// checks them against the workload's structure and drops them.
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    /// Whether the output honours the workload's structure (`None`: nothing to check).
    pub valid: Option<Result<(), String>>,
}

impl Client {
    pub fn new(base_url: &str, api_key: Option<String>) -> anyhow::Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(1024)
                .build()?,
            base: base_url.trim_end_matches('/').to_string(),
            api_key,
        })
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.post(format!("{}{path}", self.base));
        match &self.api_key {
            Some(key) => req.bearer_auth(key),
            None => req,
        }
    }

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.get(format!("{}{path}", self.base));
        match &self.api_key {
            Some(key) => req.bearer_auth(key),
            None => req,
        }
    }

    pub async fn first_model(&self) -> anyhow::Result<String> {
        let body: Value = self
            .get("/v1/models")
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        body["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .context("the server lists no model")
    }

    /// The server's step metrics from `/metrics`, or `None` when it has no such page.
    pub async fn scrape_metrics(&self) -> Option<Scrape> {
        let resp = self.get("/metrics").send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        Some(server_metrics::parse(&resp.text().await.ok()?))
    }

    /// Sends one streaming request and times each output chunk as it arrives.
    pub async fn send(&self, request: &Request) -> Outcome {
        let start = Instant::now();
        let mut outcome = Outcome {
            prompt_tokens: request.prompt_tokens,
            itl: Vec::with_capacity(request.max_tokens),
            ..Outcome::default()
        };
        if let Err(e) = self.stream(request, start, &mut outcome).await {
            outcome.error = Some(format!("{e:#}"));
        }
        outcome.e2e = start.elapsed();
        outcome
    }

    async fn stream(
        &self,
        request: &Request,
        start: Instant,
        out: &mut Outcome,
    ) -> anyhow::Result<()> {
        let resp = self
            .post(request.endpoint.path())
            .json(&request.body)
            .send()
            .await?;
        let status = resp.status();
        if !status.is_success() {
            bail!("HTTP {status}: {}", resp.text().await.unwrap_or_default());
        }
        let mut bytes = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        let mut last: Option<Instant> = None;
        let mut chunks = 0usize;
        let mut usage_tokens = None;
        while let Some(piece) = bytes.next().await {
            buf.extend_from_slice(&piece?);
            // SSE events end with a blank line; anything after the last one waits for more bytes.
            while let Some(end) = find_event_end(&buf) {
                let event: Vec<u8> = buf.drain(..end).collect();
                for line in event.split(|&b| b == b'\n') {
                    let Some(data) = line.strip_prefix(b"data:") else {
                        continue;
                    };
                    let data = std::str::from_utf8(data)?.trim();
                    if data == "[DONE]" {
                        continue;
                    }
                    let v: Value = serde_json::from_str(data)
                        .with_context(|| format!("bad SSE data: {data}"))?;
                    if let Some(err) = v.get("error") {
                        bail!("error event: {err}");
                    }
                    if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                        usage_tokens = Some(n as usize);
                    }
                    if let Some(n) = v["usage"]["prompt_tokens"].as_u64() {
                        out.prompt_tokens = n as usize;
                    }
                    if absorb_chunk(&v, request.endpoint, out) {
                        let now = Instant::now();
                        match last {
                            None => out.ttft = now - start,
                            Some(prev) => out.itl.push(now - prev),
                        }
                        last = Some(now);
                        chunks += 1;
                    }
                }
            }
        }
        out.output_tokens = usage_tokens.unwrap_or(chunks);
        if last.is_none() {
            bail!("the stream carried no output");
        }
        Ok(())
    }
}

/// Takes one streamed chunk's output into `out` (text, tool-call fragments, finish reason);
/// true when it carried output (a timed chunk).
fn absorb_chunk(v: &Value, endpoint: Endpoint, out: &mut Outcome) -> bool {
    let choice = &v["choices"][0];
    if let Some(reason) = choice["finish_reason"].as_str() {
        out.finish_reason = Some(reason.to_string());
    }
    fn nonempty(x: &Value) -> Option<&str> {
        x.as_str().filter(|t| !t.is_empty())
    }
    match endpoint {
        Endpoint::Completions => match nonempty(&choice["text"]) {
            Some(t) => {
                out.text.push_str(t);
                true
            }
            None => false,
        },
        Endpoint::Chat => {
            let delta = &choice["delta"];
            let mut carried = false;
            if let Some(t) = nonempty(&delta["content"]) {
                out.text.push_str(t);
                carried = true;
            }
            // Reasoning is output the server computed too, but no part of the answer.
            carried |= nonempty(&delta["reasoning_content"]).is_some()
                || nonempty(&delta["reasoning"]).is_some();
            if let Some(calls) = delta["tool_calls"].as_array() {
                for (pos, call) in calls.iter().enumerate() {
                    let index = call["index"].as_u64().map_or(pos, |i| i as usize);
                    if out.tool_calls.len() <= index {
                        out.tool_calls.resize(index + 1, ToolCall::default());
                    }
                    let slot = &mut out.tool_calls[index];
                    // The name comes once; a server that repeats it is not concatenated.
                    if let Some(name) = nonempty(&call["function"]["name"]) {
                        if slot.name != name {
                            slot.name.push_str(name);
                        }
                    }
                    if let Some(args) = nonempty(&call["function"]["arguments"]) {
                        slot.arguments.push_str(args);
                    }
                    carried = true;
                }
            }
            carried
        }
    }
}

/// Index just past the first `\n\n` (or `\r\n\r\n`) in `buf`.
fn find_event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_end_at_blank_lines() {
        assert_eq!(find_event_end(b"data: 1\n\ndata: 2"), Some(9));
        assert_eq!(find_event_end(b"data: 1\r\n\r\n"), Some(11));
        assert_eq!(find_event_end(b"data: 1\n"), None);
    }

    #[test]
    fn completion_chunks_give_text_and_finish() {
        let mut out = Outcome::default();
        let e = Endpoint::Completions;
        assert!(absorb_chunk(
            &json!({"choices": [{"text": "{\"a\""}]}),
            e,
            &mut out
        ));
        assert!(absorb_chunk(
            &json!({"choices": [{"text": ": 1}", "finish_reason": "stop"}]}),
            e,
            &mut out
        ));
        assert!(!absorb_chunk(
            &json!({"choices": [], "usage": {"completion_tokens": 5}}),
            e,
            &mut out
        ));
        assert_eq!(out.text, "{\"a\": 1}");
        assert_eq!(out.finish_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn chat_chunks_reassemble_tool_calls() {
        let mut out = Outcome::default();
        let e = Endpoint::Chat;
        let chunks = [
            json!({"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
            json!({"choices": [{"delta": {"reasoning_content": "hmm"}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": ""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"Oslo\"}"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "function": {"name": "f", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ];
        let carried: Vec<bool> = chunks
            .iter()
            .map(|c| absorb_chunk(c, e, &mut out))
            .collect();
        assert_eq!(carried, [false, true, true, true, true, true, false]);
        assert_eq!(out.text, "");
        assert_eq!(
            out.tool_calls,
            [
                ToolCall {
                    name: "get_weather".into(),
                    arguments: "{\"city\": \"Oslo\"}".into()
                },
                ToolCall {
                    name: "f".into(),
                    arguments: "{}".into()
                },
            ]
        );
        assert_eq!(out.finish_reason.as_deref(), Some("tool_calls"));
        assert!(absorb_chunk(
            &json!({"choices": [{"delta": {"content": "hi"}}]}),
            e,
            &mut out
        ));
        assert_eq!(out.text, "hi");
    }
}
