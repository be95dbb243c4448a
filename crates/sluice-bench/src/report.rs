//! Summaries of a run: throughput and latency percentiles, as a table, JSON and CSV.

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use crate::client::Outcome;
use crate::server_metrics::StepCost;
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
    /// `plain`, `json-schema` or `tools` (set by the caller).
    pub workload: String,
    /// Means over completed requests, from the server's `usage` where it sends one (a chat
    /// prompt's length includes the template and the tools).
    pub prompt_tokens_mean: f64,
    pub output_tokens_mean: f64,
    /// Completed requests that stopped at `max_tokens` (`finish_reason: "length"`).
    pub length_capped: usize,
    /// Completed outputs checked against the structure, and how many honoured it.
    pub checked: usize,
    pub validated: usize,
    pub first_invalid: Option<String>,
    /// The server's own step and mask times over the level (sluice's `/metrics`).
    pub server: Option<StepCost>,
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
        let mean = |total: usize| {
            if ok.is_empty() {
                0.0
            } else {
                total as f64 / ok.len() as f64
            }
        };
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
            workload: "plain".into(),
            prompt_tokens_mean: mean(prompt),
            output_tokens_mean: mean(output),
            length_capped: ok
                .iter()
                .filter(|o| o.finish_reason.as_deref() == Some("length"))
                .count(),
            checked: ok.iter().filter(|o| o.valid.is_some()).count(),
            validated: ok
                .iter()
                .filter(|o| matches!(o.valid, Some(Ok(()))))
                .count(),
            first_invalid: ok.iter().find_map(|o| match &o.valid {
                Some(Err(e)) => Some(e.clone()),
                _ => None,
            }),
            server: None,
        }
    }

    pub fn table(&self) -> String {
        let mut t = String::new();
        let load = match self.load {
            Load::Closed { concurrency } => format!("closed loop, {concurrency} concurrent"),
            Load::Poisson { rate } => format!("open loop, {rate} req/s"),
        };
        let workload = match self.workload.as_str() {
            "plain" => String::new(),
            w => format!(" ({w})"),
        };
        let _ = writeln!(
            t,
            "== {load}{workload}: {} completed, {} failed in {:.2} s",
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
        let _ = writeln!(
            t,
            "tokens per request {:>10.1} prompt, {:.1} output, {} stopped at max_tokens",
            self.prompt_tokens_mean, self.output_tokens_mean, self.length_capped
        );
        if self.checked > 0 {
            let _ = writeln!(
                t,
                "validated          {:>10} of {} outputs",
                self.validated, self.checked
            );
        }
        if let Some(e) = &self.first_invalid {
            let _ = writeln!(t, "first invalid: {e}");
        }
        if let Some(s) = &self.server {
            let fmt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2} ms"));
            let _ = writeln!(
                t,
                "server steps       {:>10} mean {}; {} with masks, mean mask {}",
                s.steps,
                fmt(s.step_ms),
                s.constrained_steps,
                fmt(s.mask_ms)
            );
        }
        if let Some(e) = &self.first_error {
            let _ = writeln!(t, "first error: {e}");
        }
        t
    }
}

/// A number with `digits` decimals, or nothing.
fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or(String::new(), |v| format!("{v:.digits$}"))
}

/// One row per summary: the numbers a throughput/latency-versus-concurrency plot needs.
pub fn csv(results: &[Summary]) -> String {
    let mut out = String::from(
        "concurrency,request_rate,completed,failed,duration_s,request_throughput,output_throughput,total_token_throughput,\
         ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms,itl_p50_ms,itl_p99_ms,e2e_p50_ms,e2e_p99_ms,\
         workload,prompt_tokens_mean,output_tokens_mean,length_capped,checked,validated,\
         server_steps,server_step_ms,constrained_steps,mask_ms\n",
    );
    for r in results {
        let (c, rate) = match r.load {
            Load::Closed { concurrency } => (concurrency.to_string(), String::new()),
            Load::Poisson { rate } => (String::new(), rate.to_string()),
        };
        let _ = writeln!(
            out,
            "{c},{rate},{},{},{:.3},{:.3},{:.2},{:.2},{:.2},{:.2},{:.3},{:.3},{:.3},{:.3},{:.1},{:.1},\
             {},{:.1},{:.1},{},{},{},{},{},{},{}",
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
            r.e2e_ms.p99,
            r.workload,
            r.prompt_tokens_mean,
            r.output_tokens_mean,
            r.length_capped,
            r.checked,
            r.validated,
            opt(r.server.map(|s| s.steps as f64), 0),
            opt(r.server.and_then(|s| s.step_ms), 3),
            opt(r.server.map(|s| s.constrained_steps as f64), 0),
            opt(r.server.and_then(|s| s.mask_ms), 4),
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
            ..Outcome::default()
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

    #[test]
    fn validation_and_server_costs_are_reported() {
        let mut outcomes: Vec<Outcome> = (0..4).map(|_| outcome(5, 50, 20)).collect();
        outcomes[0].valid = Some(Ok(()));
        outcomes[1].valid = Some(Err("not JSON".into()));
        outcomes[1].finish_reason = Some("length".into());
        outcomes[2].valid = Some(Ok(()));
        let mut s = Summary::new(Load::Closed { concurrency: 4 }, &outcomes);
        assert_eq!((s.checked, s.validated, s.length_capped), (3, 2, 1));
        assert_eq!(s.first_invalid.as_deref(), Some("not JSON"));
        assert!((s.output_tokens_mean - 20.0).abs() < 1e-9);
        assert!((s.prompt_tokens_mean - 10.0).abs() < 1e-9);
        s.workload = "json-schema".into();
        s.server = Some(StepCost {
            steps: 100,
            step_ms: Some(12.5),
            constrained_steps: 90,
            mask_ms: Some(0.75),
        });
        let table = s.table();
        assert!(table.contains("(json-schema)"), "{table}");
        assert!(
            table.contains("validated                   2 of 3"),
            "{table}"
        );
        assert!(table.contains("mean mask 0.75 ms"), "{table}");
        let text = csv(&[s]);
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let row: Vec<&str> = lines.next().unwrap().split(',').collect();
        assert_eq!(header.len(), row.len());
        let col = |name: &str| row[header.iter().position(|h| *h == name).unwrap()];
        assert_eq!(col("workload"), "json-schema");
        assert_eq!(col("validated"), "2");
        assert_eq!(col("mask_ms"), "0.7500");
        assert_eq!(col("server_step_ms"), "12.500");
    }
}
