//! Which requests are sent and when: prompts of exact token lengths, closed or open loop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::client::{Client, Outcome};

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
    pub model: String,
    pub prompt_tokens: (usize, usize),
    pub output_tokens: (usize, usize),
    pub ignore_eos: bool,
    pub temperature: f32,
    pub seed: u64,
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

impl Workload {
    /// The `i`-th request's prompt and output length, the same for every run with this seed.
    fn request(&self, i: usize) -> (Vec<u32>, usize) {
        let mut rng =
            StdRng::seed_from_u64(self.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let p = rng.gen_range(self.prompt_tokens.0..=self.prompt_tokens.1);
        let o = rng.gen_range(self.output_tokens.0..=self.output_tokens.1);
        ((0..p).map(|_| rng.gen_range(PROMPT_IDS)).collect(), o)
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
            let (prompt, out) = w.request(i);
            let mut outcome = client
                .complete(&w.model, &prompt, out, w.ignore_eos, w.temperature)
                .await;
            outcome.finished_at = run_start.elapsed();
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
