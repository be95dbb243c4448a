//! Which requests are sent and when: prompts of exact token lengths, closed or open loop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

use crate::client::{Client, Endpoint, Outcome, Request};
use crate::structured::Structure;

/// How requests arrive.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Load {
    /// `concurrency` requests always in flight.
    Closed { concurrency: usize },
    /// Exponential gaps between arrivals, `rate` per second on average.
    Poisson { rate: f64 },
}

pub struct Workload {
    /// `model` of each request, in turn: the `i`-th request names `model[i % len]` (several:
    /// LoRA adapters of one server, spread over the requests).
    pub model: String,
    pub prompt_tokens: (usize, usize),
    pub output_tokens: (usize, usize),
    /// Sent only without a structure: a constrained output ends when its grammar completes.
    pub ignore_eos: bool,
    pub temperature: f32,
    pub seed: u64,
    /// Completions take token-id prompts; chat takes a user message of about as many words.
    pub endpoint: Endpoint,
    /// What constrains the outputs (a schema, tools) and how they are checked.
    pub structure: Structure,
    /// Chat only: a system message of this many words, the same in every request, so the
    /// prompts share a prefix as they do when they carry the same tool definitions.
    pub system_words: usize,
    /// `parallel_tool_calls` sent with tools, when set.
    pub parallel_tool_calls: Option<bool>,
    /// The editing workload's file (`--edit`): every chat request asks for it back whole,
    /// changed by one first line naming the request.
    pub edit: Option<String>,
}

/// The user message of the `i`-th editing request.
fn edit_message(file: &str, i: usize) -> String {
    format!(
        "Here is a file:\n```\n{file}\n```\nReturn the whole file, unchanged except for one \
         new first line: a comment that says `edited by request {i}`. Write only the file, in \
         a code block."
    )
}

/// `N` or `MIN:MAX`.
pub fn parse_range(s: &str) -> anyhow::Result<(usize, usize)> {
    let (lo, hi) = match s.split_once(':') {
        Some((a, b)) => (a.trim().parse()?, b.trim().parse()?),
        None => {
            let n = s
                .trim()
                .parse()
                .with_context(|| format!("`{s}` is not a number or MIN:MAX"))?;
            (n, n)
        }
    };
    if lo == 0 || lo > hi {
        bail!("`{s}`: lengths must be positive and MIN <= MAX");
    }
    Ok((lo, hi))
}

/// Token ids well inside any real vocabulary and clear of special tokens.
const PROMPT_IDS: std::ops::Range<u32> = 1000..9000;

/// Words of a chat prompt: common English words, each one token (with its leading space) in
/// the usual BPE vocabularies, so `N` words make a message of about `N` tokens.
const WORDS: &[&str] = &[
    "the", "order", "was", "late", "and", "my", "account", "shows", "a", "charge", "for", "two",
    "items", "I", "did", "not", "buy", "please", "check", "what", "happened", "with", "last",
    "week", "when", "we", "moved", "office", "to", "new", "city", "our", "team", "meeting", "is",
    "on", "Monday", "at", "ten", "weather", "there", "will", "be", "cold", "so", "bring", "coat",
    "customer", "asked", "about", "refund", "status", "of", "shipping", "box", "from", "store",
    "today", "time", "call", "back", "number", "help", "need",
];

fn words(rng: &mut StdRng, n: usize) -> String {
    let words: Vec<&str> = (0..n)
        .map(|_| WORDS[rng.gen_range(0..WORDS.len())])
        .collect();
    words.join(" ")
}

impl Workload {
    /// The `i`-th request, the same for every run with this seed: a prompt of the drawn length
    /// (token ids for completions, that many words for chat), `max_tokens` the drawn output
    /// length, and the structure's fields.
    pub fn request(&self, i: usize) -> Request {
        let mut rng =
            StdRng::seed_from_u64(self.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let p = rng.gen_range(self.prompt_tokens.0..=self.prompt_tokens.1);
        let o = rng.gen_range(self.output_tokens.0..=self.output_tokens.1);
        let names = self.model.split(',').collect::<Vec<_>>();
        let mut body = json!({
            "model": names[i % names.len()],
            "max_tokens": o,
            "temperature": self.temperature,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let fields = body.as_object_mut().expect("an object");
        match self.endpoint {
            Endpoint::Completions => {
                let ids: Vec<u32> = (0..p).map(|_| rng.gen_range(PROMPT_IDS)).collect();
                fields.insert("prompt".into(), json!(ids));
            }
            Endpoint::Chat => {
                let mut messages = Vec::new();
                if self.system_words > 0 {
                    let mut shared = StdRng::seed_from_u64(self.seed ^ 0x5157_E300);
                    messages.push(json!({"role": "system",
                                         "content": words(&mut shared, self.system_words)}));
                }
                let user = match &self.edit {
                    Some(file) => edit_message(file, i),
                    None => words(&mut rng, p),
                };
                messages.push(json!({"role": "user", "content": user}));
                fields.insert("messages".into(), Value::Array(messages));
            }
        }
        if self.structure.is_plain() {
            fields.insert("ignore_eos".into(), Value::Bool(self.ignore_eos));
        }
        self.structure.apply(fields);
        if let (Structure::Tools { .. }, Some(parallel)) =
            (&self.structure, self.parallel_tool_calls)
        {
            fields.insert("parallel_tool_calls".into(), Value::Bool(parallel));
        }
        Request {
            endpoint: self.endpoint,
            body,
            prompt_tokens: p,
            max_tokens: o,
        }
    }
}

/// Runs `count` requests under `load`; returns every outcome, failures included. All requests
/// are futures of one task: the work per token is a few microseconds of parsing, far below
/// what the servers under test take, so one task does not distort the timings.
pub async fn run(
    client: &Client,
    w: &Workload,
    load: Load,
    count: usize,
    quiet: bool,
) -> anyhow::Result<Vec<Outcome>> {
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(count as u64)
    };
    bar.set_style(ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} requests",
    )?);
    let run_start = Instant::now();
    let one = |i: usize| {
        let bar = bar.clone();
        async move {
            let request = w.request(i);
            let mut outcome = client.send(&request).await;
            outcome.finished_at = run_start.elapsed();
            if outcome.error.is_none() {
                outcome.valid = w.structure.check(&outcome.text, &outcome.tool_calls);
            }
            outcome.text = String::new();
            outcome.tool_calls = Vec::new();
            bar.inc(1);
            outcome
        }
    };
    let outcomes = match load {
        Load::Closed { concurrency } => {
            let next = AtomicUsize::new(0);
            let worker = || async {
                let mut mine = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break mine;
                    }
                    mine.push(one(i).await);
                }
            };
            let workers: Vec<_> = (0..concurrency.min(count)).map(|_| worker()).collect();
            futures_util::future::join_all(workers)
                .await
                .into_iter()
                .flatten()
                .collect()
        }
        Load::Poisson { rate } => {
            // Arrival times are drawn up front; each request sleeps until its own.
            let mut rng = StdRng::seed_from_u64(w.seed.wrapping_add(1));
            let mut at = Duration::ZERO;
            let arrivals: Vec<_> = (0..count)
                .map(|i| {
                    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
                    at += Duration::from_secs_f64(-u.ln() / rate);
                    let start = at;
                    let request = one(i);
                    async move {
                        tokio::time::sleep(start).await;
                        request.await
                    }
                })
                .collect();
            futures_util::future::join_all(arrivals).await
        }
    };
    bar.finish_and_clear();
    Ok(outcomes)
}
