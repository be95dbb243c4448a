//! `sluice-bench`: a load generator for any OpenAI-compatible completions server (sluice,
//! vLLM, llama.cpp's server), measuring every server the same way.
//!
//! Prompts are sent as token ids, so their length in tokens is exact whatever the server's
//! tokenizer; `ignore_eos` makes output lengths exact. Closed loop keeps C requests in flight;
//! open loop sends Poisson arrivals at a rate. A sweep runs closed loop over several
//! concurrencies and writes one CSV row per level, and a PNG plot of throughput and latency
//! against concurrency with `--plot` (also from an earlier sweep's CSV with `--from-csv`).
//!
//! Structured workloads constrain every output: `--json-schema FILE` sends a JSON schema with
//! each completion, `--tools FILE` sends OpenAI function tools to the chat endpoint. Each
//! output is checked (it parses and validates, or holds valid tool calls), and where the server
//! exposes sluice's `/metrics`, the mean step time and grammar-mask time per constrained step
//! over each level are reported beside the throughput.

mod client;
mod plot;
mod report;
mod server_metrics;
mod structured;
mod workload;

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

use crate::client::Endpoint;
use crate::server_metrics::StepCost;
use crate::structured::{SchemaField, Structure};
use crate::workload::{Load, Workload};

#[derive(Parser, Debug)]
#[command(name = "sluice-bench", version, about)]
pub struct Args {
    /// Server base URL (the part before `/v1/completions`).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// Model name to send; default: the first model the server lists. Several, comma-separated
    /// (a server's LoRA adapters): the requests name them in turn.
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
    /// Constrain every output to the JSON schema in FILE (a bare schema, or OpenAI's
    /// `{"name", "schema", "strict"}` object). A constrained output ends when the schema is
    /// complete: `ignore_eos` is not sent, --output-tokens only caps it (`max_tokens`), and
    /// throughput counts the output tokens of the server's `usage`.
    #[arg(long, value_name = "FILE", conflicts_with = "tools")]
    json_schema: Option<PathBuf>,
    /// Where --json-schema goes in the request: OpenAI's `response_format` (sluice on both
    /// endpoints, vLLM on chat and recent completions), vLLM's `structured_outputs` or its
    /// older `guided_json`.
    #[arg(
        long,
        value_enum,
        default_value = "response-format",
        requires = "json_schema"
    )]
    schema_field: SchemaField,
    /// Offer the OpenAI function tools in FILE (a JSON array) with every request, on
    /// `/v1/chat/completions` (implies --chat). Outputs end with the call, as with --json-schema.
    #[arg(long, value_name = "FILE")]
    tools: Option<PathBuf>,
    /// `tool_choice` with --tools: `required` (a call forced by grammar), `auto`, `none`, or a
    /// function's name.
    #[arg(long, default_value = "required", requires = "tools")]
    tool_choice: String,
    /// `parallel_tool_calls` with --tools (default: not sent, the server's choice). `false`
    /// ends each output with its one call; with `true` a small model may chain calls up to
    /// `max_tokens`.
    #[arg(long, value_name = "BOOL", requires = "tools")]
    parallel_tool_calls: Option<bool>,
    /// Send chat requests (`/v1/chat/completions`) whose user message is --prompt-tokens words
    /// (about as many tokens, plus the chat template's) instead of token-id completions.
    #[arg(long)]
    chat: bool,
    /// With --chat: a system message of N words, the same in every request (a shared prefix,
    /// like tool definitions; `scripts/bench-structured.sh` sizes it to match --tools).
    #[arg(long, value_name = "N", default_value_t = 0)]
    system_words: usize,
    /// An editing workload, as a coding agent's: each chat request holds the text of FILE and
    /// asks for it back whole with one small change (a first line that comments which request
    /// it is). Outputs end where the model ends them (`ignore_eos` is not sent),
    /// --output-tokens caps them, and --prompt-tokens is not used. The workload n-gram
    /// speculation is for: most of the output is already in the prompt.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["tools", "json_schema", "chat"])]
    edit: Option<PathBuf>,
    /// Do not read the server's `/metrics` (sluice's step and grammar-mask times) before and
    /// after each level. Servers without them are skipped anyway.
    #[arg(long)]
    no_server_metrics: bool,
}

impl Args {
    /// The workload the flags describe (files read and checked here, before any request).
    fn workload(&self, model: String) -> anyhow::Result<Workload> {
        let structure = match (&self.json_schema, &self.tools) {
            (Some(path), _) => {
                Structure::json_schema_file(path, self.schema_field).context("--json-schema")?
            }
            (None, Some(path)) => {
                Structure::tools_file(path, &self.tool_choice).context("--tools")?
            }
            (None, None) => Structure::Plain,
        };
        let edit = match &self.edit {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("--edit: cannot read {}", path.display()))?,
            ),
            None => None,
        };
        let chat = self.chat || self.tools.is_some() || edit.is_some();
        Ok(Workload {
            model,
            prompt_tokens: workload::parse_range(&self.prompt_tokens).context("--prompt-tokens")?,
            output_tokens: workload::parse_range(&self.output_tokens).context("--output-tokens")?,
            ignore_eos: !self.respect_eos && edit.is_none(),
            temperature: self.temperature,
            seed: self.seed,
            endpoint: if chat {
                Endpoint::Chat
            } else {
                Endpoint::Completions
            },
            structure,
            system_words: self.system_words,
            parallel_tool_calls: self.parallel_tool_calls,
            edit,
        })
    }
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
    // The files are read before anything is sent: a bad schema fails at once.
    args.workload(String::new())?;
    let client = client::Client::new(&args.base_url, args.api_key.clone())?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => client
            .first_model()
            .await
            .context("listing the server's models (pass --model to skip)")?,
    };
    let workload = args.workload(model)?;
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
        let before = match args.no_server_metrics {
            false => client.scrape_metrics().await,
            true => None,
        };
        let outcomes = workload::run(&client, &workload, load, count, args.quiet).await?;
        let after = match before {
            Some(_) => client.scrape_metrics().await,
            None => None,
        };
        let mut summary = report::Summary::new(load, &outcomes);
        summary.workload = workload.structure.label().to_string();
        summary.server = before
            .zip(after)
            .and_then(|(b, a)| StepCost::between(&b, &a));
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
        let output = if args.respect_eos || !workload.structure.is_plain() {
            "up to "
        } else {
            ""
        };
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

    fn args(flags: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("sluice-bench").chain(flags.iter().copied()))
    }

    fn example(name: &str) -> String {
        format!(
            "{}/../../benchmarks/structured/{name}",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    #[test]
    fn the_editing_workload_asks_for_the_file_back() {
        let file = format!(
            "{}/../../benchmarks/edit/inventory.py",
            env!("CARGO_MANIFEST_DIR")
        );
        let w = args(&["--edit", &file, "--output-tokens", "700"])
            .unwrap()
            .workload("m".into())
            .unwrap();
        assert_eq!(w.endpoint, Endpoint::Chat);
        let r = w.request(3);
        assert_eq!(r.endpoint, Endpoint::Chat);
        let user = r.body["messages"][0]["content"].as_str().unwrap();
        assert!(user.contains("class Ledger:") && user.contains("edited by request 3"));
        assert_eq!(r.body["ignore_eos"], false, "the model ends the file");
        assert_eq!(r.body["max_tokens"], 700);
        assert!(args(&["--edit", &file, "--chat"]).is_err());
        assert!(args(&["--edit", "/no/such/file"])
            .unwrap()
            .workload("m".into())
            .is_err());
    }

    /// Several models (a server's LoRA adapters): the requests name them in turn.
    #[test]
    fn requests_name_several_models_in_turn() {
        let w = args(&[]).unwrap().workload("a,b,c".into()).unwrap();
        let names: Vec<_> = (0..5).map(|i| w.request(i).body["model"].clone()).collect();
        assert_eq!(names, ["a", "b", "c", "a", "b"]);
    }

    #[test]
    fn plain_flags_give_the_unconstrained_workload() {
        let w = args(&[]).unwrap().workload("m".into()).unwrap();
        assert_eq!(w.endpoint, Endpoint::Completions);
        assert_eq!(w.structure, Structure::Plain);
        let r = w.request(0);
        assert_eq!(r.endpoint, Endpoint::Completions);
        assert_eq!(r.body["prompt"].as_array().unwrap().len(), 128);
        assert_eq!(r.body["ignore_eos"], true);
        assert_eq!(r.body["max_tokens"], 128);
        assert!(r.body.get("response_format").is_none());
        let chat = args(&["--chat"]).unwrap().workload("m".into()).unwrap();
        assert_eq!(chat.endpoint, Endpoint::Chat);
        assert_eq!(chat.request(0).body["ignore_eos"], true);
        assert_eq!(
            chat.request(0).body["messages"].as_array().unwrap().len(),
            1
        );

        // A system message shared by every request, then each one's own user message.
        let chat = args(&["--chat", "--system-words", "300", "--prompt-tokens", "20"])
            .unwrap()
            .workload("m".into())
            .unwrap();
        let (a, b) = (chat.request(0).body, chat.request(1).body);
        assert_eq!(a["messages"][0]["role"], "system");
        assert_eq!(a["messages"][0], b["messages"][0]);
        assert_eq!(
            a["messages"][0]["content"]
                .as_str()
                .unwrap()
                .split(' ')
                .count(),
            300
        );
        assert_ne!(a["messages"][1], b["messages"][1]);
        assert_eq!(
            a["messages"][1]["content"]
                .as_str()
                .unwrap()
                .split(' ')
                .count(),
            20
        );
    }

    #[test]
    fn json_schema_flags() {
        let schema = example("schema.json");
        let a = args(&["--json-schema", &schema, "--output-tokens", "200"]).unwrap();
        assert_eq!(a.schema_field, SchemaField::ResponseFormat);
        let w = a.workload("m".into()).unwrap();
        assert_eq!(
            w.endpoint,
            Endpoint::Completions,
            "the same shape as the plain run"
        );
        let r = w.request(3);
        assert_eq!(r.body["response_format"]["type"], "json_schema");
        assert_eq!(r.body["max_tokens"], 200);
        assert!(
            r.body.get("ignore_eos").is_none(),
            "a grammar ends the output"
        );
        assert_eq!(
            r.body["prompt"],
            args(&[])
                .unwrap()
                .workload("m".into())
                .unwrap()
                .request(3)
                .body["prompt"]
        );

        let a = args(&[
            "--json-schema",
            &schema,
            "--schema-field",
            "structured-outputs",
            "--chat",
        ])
        .unwrap();
        let r = a.workload("m".into()).unwrap().request(0);
        assert_eq!(r.endpoint, Endpoint::Chat);
        assert_eq!(r.body["structured_outputs"]["json"]["type"], "object");
        assert!(r.body.get("response_format").is_none());
        let a = args(&["--json-schema", &schema, "--schema-field", "guided-json"]).unwrap();
        assert!(a.workload("m".into()).unwrap().request(0).body["guided_json"].is_object());

        assert!(
            args(&["--schema-field", "guided-json"]).is_err(),
            "needs --json-schema"
        );
        assert!(args(&["--json-schema", &schema, "--schema-field", "xml"]).is_err());
        assert!(args(&["--json-schema", &schema, "--tools", &example("tools.json")]).is_err());
        let missing = args(&["--json-schema", "/nonexistent.json"]).unwrap();
        assert!(missing.workload("m".into()).is_err());
    }

    #[test]
    fn tools_flags() {
        let tools = example("tools.json");
        let w = args(&["--tools", &tools, "--prompt-tokens", "40", "--seed", "7"])
            .unwrap()
            .workload("m".into())
            .unwrap();
        assert_eq!(w.endpoint, Endpoint::Chat, "--tools implies chat");
        let r = w.request(0);
        assert_eq!(r.endpoint.path(), "/v1/chat/completions");
        assert_eq!(r.body["tool_choice"], "required");
        assert_eq!(r.body["tools"].as_array().unwrap().len(), 3);
        assert_eq!(r.body["stream"], true);
        assert!(r.body.get("prompt").is_none());
        let messages = r.body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0]["role"], "user");
        let words = messages[0]["content"].as_str().unwrap().split(' ').count();
        assert_eq!(words, 40);
        assert_eq!(
            r.body,
            w.request(0).body,
            "the same request for the same seed"
        );

        let named = args(&["--tools", &tools, "--tool-choice", "get_weather"]).unwrap();
        let r = named.workload("m".into()).unwrap().request(0);
        assert_eq!(r.body["tool_choice"]["function"]["name"], "get_weather");
        let unknown = args(&["--tools", &tools, "--tool-choice", "fly"]).unwrap();
        assert!(unknown.workload("m".into()).is_err());
        assert!(args(&["--tool-choice", "auto"]).is_err(), "needs --tools");
        assert!(
            r.body.get("parallel_tool_calls").is_none(),
            "the server's default"
        );
        let single = args(&["--tools", &tools, "--parallel-tool-calls", "false"]).unwrap();
        let r = single.workload("m".into()).unwrap().request(0);
        assert_eq!(r.body["parallel_tool_calls"], false);
        assert!(
            args(&["--parallel-tool-calls", "false"]).is_err(),
            "needs --tools"
        );
    }

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
