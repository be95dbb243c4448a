//! One streamed completion request and the timestamps of its tokens.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::StreamExt;
use serde_json::{json, Value};

pub struct Client {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
}

/// What one request measured.
#[derive(Debug, Clone)]
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

    pub async fn first_model(&self) -> anyhow::Result<String> {
        let mut req = self.http.get(format!("{}/v1/models", self.base));
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let body: Value = req.send().await?.error_for_status()?.json().await?;
        body["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .context("the server lists no model")
    }

    /// Sends one streaming completion and times each content chunk as it arrives.
    pub async fn complete(
        &self,
        model: &str,
        prompt: &[u32],
        max_tokens: usize,
        ignore_eos: bool,
        temperature: f32,
    ) -> Outcome {
        let start = Instant::now();
        let mut outcome = Outcome {
            prompt_tokens: prompt.len(),
            output_tokens: 0,
            ttft: Duration::ZERO,
            itl: Vec::with_capacity(max_tokens),
            e2e: Duration::ZERO,
            finished_at: Duration::ZERO,
            error: None,
        };
        if let Err(e) = self
            .stream(
                model,
                prompt,
                max_tokens,
                ignore_eos,
                temperature,
                start,
                &mut outcome,
            )
            .await
        {
            outcome.error = Some(format!("{e:#}"));
        }
        outcome.e2e = start.elapsed();
        outcome
    }

    #[allow(clippy::too_many_arguments)]
    async fn stream(
        &self,
        model: &str,
        prompt: &[u32],
        max_tokens: usize,
        ignore_eos: bool,
        temperature: f32,
        start: Instant,
        out: &mut Outcome,
    ) -> anyhow::Result<()> {
        let body = json!({
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "ignore_eos": ignore_eos,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let resp = self.post("/v1/completions").json(&body).send().await?;
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
                    let has_text = v["choices"][0]["text"]
                        .as_str()
                        .is_some_and(|t| !t.is_empty());
                    if has_text {
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
            bail!("the stream carried no text");
        }
        Ok(())
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
    use super::find_event_end;

    #[test]
    fn events_end_at_blank_lines() {
        assert_eq!(find_event_end(b"data: 1\n\ndata: 2"), Some(9));
        assert_eq!(find_event_end(b"data: 1\r\n\r\n"), Some(11));
        assert_eq!(find_event_end(b"data: 1\n"), None);
    }
}
