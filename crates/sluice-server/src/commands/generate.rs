//! `sluice generate`, the command-line subcommand: one prompt through the engine (the same
//! loading, scheduler, sampler and stop handling that `sluice serve` uses), its text printed
//! as it is generated.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::KvCacheDtype;
use crate::engine::hub;
use crate::engine::load::{dated, load_model, LoadedModel};
use anyhow::{bail, Context};
use sluice_engine::{
    Engine, EngineConfig, Event, FinishReason, Request, SamplingParams, StopParams,
};
use sluice_model::{CudaGraphs, PagedLlama, WeightsKind};
use sluice_tokenizer::{ChatMessage, TemplateDate};

const BLOCK_SIZE: usize = 16;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// GGUF model file, Hugging Face model directory (config.json, tokenizer.json,
    /// *.safetensors), or hub name `ORG/NAME[:QUANT]` (fetched into the Hugging Face cache).
    #[arg(
        long,
        env = "SLUICE_MODEL",
        default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf",
        value_name = "PATH|ORG/NAME[:QUANT]"
    )]
    model: PathBuf,
    /// The hub revision a hub name is fetched at.
    #[arg(long, default_value = sluice_hub::DEFAULT_REVISION, value_name = "REV")]
    revision: String,
    /// The prompt text (a user message with --chat).
    #[arg(long)]
    prompt: String,
    /// Most tokens to generate; generation also stops at an end-of-sequence token.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    chat: bool,
    /// With --chat: the date the template prints through `strftime_now`, `today` or a day
    /// `YYYY-MM-DD` pinned (as `sluice serve --chat-template-date`).
    #[arg(
        long,
        env = "SLUICE_CHAT_TEMPLATE_DATE",
        default_value = "today",
        value_name = "DATE"
    )]
    chat_template_date: TemplateDate,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens holding this much probability.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Seed for sampling (with --temperature > 0).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Weight representation: auto, exact, f32, f16, bf16 or quantized.
    #[arg(long, default_value = "auto")]
    weights: WeightsKind,
    /// On a GPU: decode steps replayed from a CUDA graph (on), op by op (off), or the graph's
    /// launches enqueued without capture (eager).
    #[arg(long, default_value = "on")]
    cuda_graphs: CudaGraphs,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let load_start = Instant::now();
    // The server's loading, chat-template fallback (ChatML) included; an f16 KV cache, as
    // the server's default.
    let LoadedModel {
        model,
        tokenizer,
        chat_template,
    } = load_model(
        &hub::resolve_blocking(&args.model, &args.revision)?,
        args.weights,
        KvCacheDtype::F16,
    )?;
    let load_time = load_start.elapsed();

    let prompt = if args.chat {
        let template = chat_template.context("the model has no chat template; drop --chat")?;
        let template = dated(template, args.chat_template_date);
        let text = template.render(&[ChatMessage::new("user", &args.prompt)], true)?;
        // The template writes any BOS the model wants itself.
        tokenizer.encode(&text)?
    } else {
        tokenizer.encode_prompt(&args.prompt)?
    };
    let max_len = model.config().max_position_embeddings;
    if prompt.len() >= max_len {
        bail!(
            "the prompt has {} tokens; the model's context is {max_len}",
            prompt.len()
        );
    }
    // Generation stops at the context length, as it always did here.
    let max_tokens = args.max_tokens.min(max_len - prompt.len());
    let prompt_tokens = prompt.len();
    // A cache for exactly this one sequence.
    let num_blocks = (prompt_tokens + max_tokens).div_ceil(BLOCK_SIZE).max(1);
    let mut model = PagedLlama::new(model, num_blocks, BLOCK_SIZE)?;
    model.enable_cuda_graphs(args.cuda_graphs, 1)?;
    let engine = Engine::start(
        Box::new(model),
        Arc::new(tokenizer),
        EngineConfig::default(),
    )?;
    let request = Request {
        prompt,
        n: 1,
        max_tokens: Some(max_tokens),
        sampling: SamplingParams {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            seed: Some(args.seed),
            ..SamplingParams::default()
        },
        constraint: None,
        lora: None,
        images: Vec::new(),
        stop: StopParams::default(),
    };
    // Checked like a server request (an empty prompt, a temperature out of [0, 2], ...).
    let handle = engine.handle();
    let mut stream = handle.submit(handle.validate(request)?)?;

    let mut out = std::io::stdout().lock();
    let mut finish = None;
    while let Some(event) = stream.blocking_recv() {
        match event {
            Event::Token(t) => {
                write!(out, "{}", t.text)?;
                out.flush()?;
            }
            Event::Finished(f) => finish = Some(f),
        }
    }
    writeln!(out)?;
    engine.shutdown(Duration::from_secs(1));
    let finish = finish.context("the engine stopped without finishing the request")?;
    if finish.reason == FinishReason::Error {
        bail!(
            "generation failed: {}",
            finish.error.unwrap_or_else(|| "unknown error".into())
        );
    }
    let t = finish.timing;
    let generated = finish.usage.completion_tokens;
    let prefill = match (t.scheduled, t.first_token) {
        (Some(s), Some(f)) => prompt_tokens as f64 / (f - s).as_secs_f64().max(1e-9),
        _ => 0.0,
    };
    let decode = match (t.first_token, t.last_token) {
        (Some(f), Some(l)) if generated > 1 => {
            (generated - 1) as f64 / (l - f).as_secs_f64().max(1e-9)
        }
        _ => 0.0,
    };
    eprintln!(
        "[{prompt_tokens} prompt tokens, {generated} generated ({}); load {:.2}s, prefill {prefill:.0} tok/s, decode {decode:.1} tok/s]",
        finish.reason,
        load_time.as_secs_f64(),
    );
    Ok(())
}
