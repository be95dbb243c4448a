//! Summaries of a run: throughput and latency percentiles, as a table, JSON and CSV.

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use crate::client::Outcome;
use crate::workload::Load;

/// Mean and percentiles of one latency, in milliseconds.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Stats {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Stats {
    fn of(mut xs: Vec<f64>) -> Self {
        if xs.is_empty() {
            return Self::default();
        }
        xs.sort_by(f64::total_cmp);
        let pick = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
        Self {
            mean: xs.iter().sum::<f64>() / xs.len() as f64,
            p50: pick(0.5),
            p90: pick(0.9),
            p99: pick(0.99),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub load: Load,
    pub completed: usize,
    pub failed: usize,
    /// Wall time from the first request sent to the last finished.
    pub duration_s: f64,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub ttft_ms: Stats,
    /// Time per output token after the first: (e2e - ttft) / (tokens - 1), per request.
    pub tpot_ms: Stats,
    pub itl_ms: Stats,
    pub e2e_ms: Stats,
    pub first_error: Option<String>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Summary {
    pub fn new(load: Load, outcomes: &[Outcome]) -> Self {
        let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_none()).collect();
        let duration_s = outcomes
            .iter()
            .map(|o| o.finished_at.as_secs_f64())
            .fold(0.0, f64::max);
        let output: usize = ok.iter().map(|o| o.output_tokens).sum();
        let prompt: usize = ok.iter().map(|o| o.prompt_tokens).sum();
        let per_s = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        Self {
            load,
            completed: ok.len(),
            failed: outcomes.len() - ok.len(),
            duration_s,
            request_throughput: per_s(ok.len() as f64),
            output_throughput: per_s(output as f64),
            total_token_throughput: per_s((output + prompt) as f64),
            ttft_ms: Stats::of(ok.iter().map(|o| ms(o.ttft)).collect()),
            tpot_ms: Stats::of(
                ok.iter()
                    .filter(|o| o.output_tokens > 1)
                    .map(|o| ms(o.e2e.saturating_sub(o.ttft)) / (o.output_tokens - 1) as f64)
                    .collect(),
            ),
            itl_ms: Stats::of(
                ok.iter()
                    .flat_map(|o| o.itl.iter().map(|&d| ms(d)))
                    .collect(),
            ),
            e2e_ms: Stats::of(ok.iter().map(|o| ms(o.e2e)).collect()),
            first_error: outcomes.iter().find_map(|o| o.error.clone()),
        }
    }

    pub fn table(&self) -> String {
        let mut t = String::new();
        let load = match self.load {
            Load::Closed { concurrency } => format!("closed loop, {concurrency} concurrent"),
            Load::Poisson { rate } => format!("open loop, {rate} req/s"),
        };
        let _ = writeln!(
            t,
            "== {load}: {} completed, {} failed in {:.2} s",
            self.completed, self.failed, self.duration_s
        );
        let _ = writeln!(
            t,
            "request throughput {:>10.2} req/s",
            self.request_throughput
        );
        let _ = writeln!(
            t,
            "output throughput  {:>10.1} tok/s",
            self.output_throughput
        );
        let _ = writeln!(
            t,
            "total throughput   {:>10.1} tok/s",
            self.total_token_throughput
        );
        let _ = writeln!(
            t,
            "{:<8} {:>10} {:>10} {:>10} {:>10}",
            "(ms)", "mean", "p50", "p90", "p99"
        );
        for (name, s) in [
            ("TTFT", &self.ttft_ms),
            ("TPOT", &self.tpot_ms),
            ("ITL", &self.itl_ms),
            ("E2E", &self.e2e_ms),
        ] {
            let _ = writeln!(
                t,
                "{name:<8} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                s.mean, s.p50, s.p90, s.p99
            );
        }
        if let Some(e) = &self.first_error {
            let _ = writeln!(t, "first error: {e}");
        }
        t
    }
}

/// One row per summary: the numbers a throughput/latency-versus-concurrency plot needs.
pub fn csv(results: &[Summary]) -> String {
    let mut out = String::from(
        "concurrency,request_rate,completed,failed,duration_s,request_throughput,output_throughput,total_token_throughput,\
         ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms,itl_p50_ms,itl_p99_ms,e2e_p50_ms,e2e_p99_ms\n",
    );
    for r in results {
        let (c, rate) = match r.load {
            Load::Closed { concurrency } => (concurrency.to_string(), String::new()),
            Load::Poisson { rate } => (String::new(), rate.to_string()),
        };
        let _ = writeln!(
            out,
            "{c},{rate},{},{},{:.3},{:.3},{:.2},{:.2},{:.2},{:.2},{:.3},{:.3},{:.3},{:.3},{:.1},{:.1}",
            r.completed,
            r.failed,
            r.duration_s,
            r.request_throughput,
            r.output_throughput,
            r.total_token_throughput,
            r.ttft_ms.p50,
            r.ttft_ms.p99,
            r.tpot_ms.p50,
            r.tpot_ms.p99,
            r.itl_ms.p50,
            r.itl_ms.p99,
            r.e2e_ms.p50,
            r.e2e_ms.p99
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(ttft_ms: u64, e2e_ms: u64, tokens: usize) -> Outcome {
        Outcome {
            prompt_tokens: 10,
            output_tokens: tokens,
            ttft: Duration::from_millis(ttft_ms),
            itl: vec![Duration::from_millis(10); tokens.saturating_sub(1)],
            e2e: Duration::from_millis(e2e_ms),
            finished_at: Duration::from_millis(e2e_ms),
            error: None,
        }
    }

    #[test]
    fn percentiles_and_throughput() {
        let outcomes: Vec<Outcome> = (1..=100).map(|i| outcome(i, 1000, 11)).collect();
        let s = Summary::new(Load::Closed { concurrency: 100 }, &outcomes);
        assert_eq!(s.completed, 100);
        assert!((s.ttft_ms.p50 - 51.0).abs() < 1.0, "{}", s.ttft_ms.p50);
        assert!((s.ttft_ms.p99 - 99.0).abs() < 1.0);
        assert!(
            (s.output_throughput - 1100.0).abs() < 1e-6,
            "{}",
            s.output_throughput
        );
        assert!((s.itl_ms.mean - 10.0).abs() < 1e-9);
        // (1000 - 1) ms over 10 gaps for the first request.
        assert!((s.tpot_ms.p50 - 94.9).abs() < 0.2, "{}", s.tpot_ms.p50);
        assert!(csv(&[s]).lines().count() == 2);
    }

    #[test]
    fn failures_are_counted_not_averaged() {
        let mut outcomes = vec![outcome(5, 50, 3)];
        outcomes.push(Outcome {
            error: Some("HTTP 429".into()),
            ..outcome(0, 1, 0)
        });
        let s = Summary::new(Load::Poisson { rate: 2.0 }, &outcomes);
        assert_eq!((s.completed, s.failed), (1, 1));
        assert_eq!(s.first_error.as_deref(), Some("HTTP 429"));
        assert_eq!(s.e2e_ms.p99, 50.0);
    }
}
