//! `sluice-bench`: a load generator for any OpenAI-compatible completions server (sluice,
//! vLLM, llama.cpp's server), measuring every server the same way.
//!
//! Prompts are sent as token ids, so their length in tokens is exact whatever the server's
//! tokenizer; `ignore_eos` makes output lengths exact. Closed loop keeps C requests in flight;
//! open loop sends Poisson arrivals at a rate. A sweep runs closed loop over several
//! concurrencies and writes one CSV row per level, and a PNG plot of throughput and latency
//! against concurrency with `--plot` (also from an earlier sweep's CSV with `--from-csv`).

mod client;
mod plot;
mod report;
mod workload;

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

use crate::workload::{Load, Workload};

#[derive(Parser, Debug)]
#[command(name = "sluice-bench", version, about)]
pub struct Args {
    /// Server base URL (the part before `/v1/completions`).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// Model name to send; default: the first model the server lists.
    #[arg(long)]
    model: Option<String>,
    /// Bearer API key, if the server wants one.
    #[arg(long, env = "OPENAI_API_KEY")]
    api_key: Option<String>,
    /// Requests kept in flight (closed loop). Ignored with --request-rate.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Poisson arrivals per second (open loop).
    #[arg(long)]
    request_rate: Option<f64>,
    /// Requests to complete (per level, with --sweep): `N`, or `Kx` for K per concurrent
    /// client (`4x` at concurrency 64 is 256), so every level of a sweep runs a few rounds.
    #[arg(long, default_value = "32")]
    num_requests: RequestCount,
    /// Prompt length in tokens: `N`, or `MIN:MAX` for uniform random lengths.
    #[arg(long, default_value = "128")]
    prompt_tokens: String,
    /// Output length in tokens: `N`, or `MIN:MAX`.
    #[arg(long, default_value = "128")]
    output_tokens: String,
    /// Stop at end-of-sequence tokens instead of generating exactly the output length.
    #[arg(long)]
    respect_eos: bool,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed of the prompt generator.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Requests sent (and not measured) before the run, to warm the server up.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Closed-loop concurrency levels to run one after another, e.g. `1,4,16,64`.
    #[arg(long, value_delimiter = ',')]
    sweep: Vec<usize>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write one CSV row per level here (with --sweep, or a single row).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw throughput and latency percentiles against concurrency into this PNG (for a
    /// --sweep, or the CSV given with --from-csv).
    #[arg(long, value_name = "PNG")]
    plot: Option<PathBuf>,
    /// Plot the sweep in this CSV (written by --csv) instead of running one; needs --plot. No
    /// server is contacted; --model, if given, goes in the title.
    #[arg(long, value_name = "CSV", requires = "plot",
          conflicts_with_all = ["sweep", "request_rate", "json", "csv"])]
    from_csv: Option<PathBuf>,
    /// Hide the progress bar.
    #[arg(long)]
    quiet: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(csv) = &args.from_csv {
        return plot_csv(&args, csv);
    }
    anyhow::ensure!(
        args.plot.is_none() || !args.sweep.is_empty() || args.request_rate.is_none(),
        "--plot draws closed-loop levels against concurrency: use it with --sweep or --concurrency"
    );
    let client = client::Client::new(&args.base_url, args.api_key.clone())?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => client
            .first_model()
            .await
            .context("listing the server's models (pass --model to skip)")?,
    };
    let workload = Workload {
        model,
        prompt_tokens: workload::parse_range(&args.prompt_tokens).context("--prompt-tokens")?,
        output_tokens: workload::parse_range(&args.output_tokens).context("--output-tokens")?,
        ignore_eos: !args.respect_eos,
        temperature: args.temperature,
        seed: args.seed,
    };
    if args.warmup > 0 {
        workload::run(
            &client,
            &workload,
            Load::Closed {
                concurrency: args.warmup,
            },
            args.warmup,
            true,
        )
        .await?;
    }
    let levels: Vec<Load> = if !args.sweep.is_empty() {
        args.sweep
            .iter()
            .map(|&c| Load::Closed {
                concurrency: c.max(1),
            })
            .collect()
    } else if let Some(rate) = args.request_rate {
        anyhow::ensure!(
            rate > 0.0 && rate.is_finite(),
            "--request-rate must be positive"
        );
        vec![Load::Poisson { rate }]
    } else {
        vec![Load::Closed {
            concurrency: args.concurrency.max(1),
        }]
    };
    let mut results = Vec::new();
    for load in levels {
        let count = args.num_requests.for_load(load)?;
        let outcomes = workload::run(&client, &workload, load, count, args.quiet).await?;
        let summary = report::Summary::new(load, &outcomes);
        println!("{}", summary.table());
        results.push(summary);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.csv {
        std::fs::write(path, report::csv(&results))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let output = if args.respect_eos { "up to " } else { "" };
        let subtitle = format!(
            "prompt {} tokens, output {output}{} tokens, {} per level",
            args.prompt_tokens, args.output_tokens, args.num_requests
        );
        plot::write_png(
            path,
            &plot::points_from_summaries(&results),
            &workload.model,
            Some(&subtitle),
        )?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// How many requests a level runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum RequestCount {
    Fixed(usize),
    PerClient(usize),
}

impl RequestCount {
    fn for_load(self, load: Load) -> anyhow::Result<usize> {
        match (self, load) {
            (Self::Fixed(n), _) => Ok(n),
            (Self::PerClient(k), Load::Closed { concurrency }) => Ok(k * concurrency),
            (Self::PerClient(_), _) => {
                anyhow::bail!("--num-requests Kx needs a closed loop (--concurrency or --sweep)")
            }
        }
    }
}

impl std::str::FromStr for RequestCount {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (digits, per_client) = match s.strip_suffix('x') {
            Some(d) => (d, true),
            None => (s, false),
        };
        let n: usize = digits
            .parse()
            .map_err(|_| format!("`{s}` is not a count: expected N or Kx (K per client)"))?;
        if n == 0 {
            return Err("the request count must be at least 1".into());
        }
        Ok(if per_client {
            Self::PerClient(n)
        } else {
            Self::Fixed(n)
        })
    }
}

impl std::fmt::Display for RequestCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed(n) => write!(f, "{n} requests"),
            Self::PerClient(k) => write!(f, "{k} requests per client"),
        }
    }
}

/// `--from-csv`: redraws an earlier sweep without running anything.
fn plot_csv(args: &Args, csv: &std::path::Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(csv).with_context(|| format!("reading {}", csv.display()))?;
    let points =
        plot::points_from_csv(&text).with_context(|| format!("reading {}", csv.display()))?;
    let path = args.plot.as_deref().context("--from-csv needs --plot")?;
    let title = args.model.as_deref().unwrap_or("sluice-bench sweep");
    plot::write_png(path, &points, title, Some(&csv.display().to_string()))?;
    println!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counts_parse_fixed_and_per_client() {
        assert_eq!("32".parse(), Ok(RequestCount::Fixed(32)));
        assert_eq!("4x".parse(), Ok(RequestCount::PerClient(4)));
        assert!("0".parse::<RequestCount>().is_err());
        assert!("x".parse::<RequestCount>().is_err());
        assert!("4y".parse::<RequestCount>().is_err());
        let closed = Load::Closed { concurrency: 64 };
        assert_eq!(RequestCount::PerClient(4).for_load(closed).unwrap(), 256);
        assert_eq!(RequestCount::Fixed(10).for_load(closed).unwrap(), 10);
        assert!(RequestCount::PerClient(4)
            .for_load(Load::Poisson { rate: 2.0 })
            .is_err());
    }
}
