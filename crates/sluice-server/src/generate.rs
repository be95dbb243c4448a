//! `sluice generate`: one prompt, one sequence, straight through the model's paged forward.
//! Handy to try a model file; serving goes through the engine instead.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use candle_core::{Device, Tensor, D};
use rand::distributions::{Distribution, WeightedIndex};
use rand::SeedableRng;
use sluice_model::{
    ChatMessage, ChatTemplate, GgufFile, IncrementalDecoder, LlamaModel, LoadOptions, StepBatch,
    Tokenizer, WeightsKind,
};

const BLOCK_SIZE: usize = 16;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// GGUF model file.
    #[arg(
        long,
        env = "SLUICE_MODEL",
        default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    )]
    model: PathBuf,
    /// The prompt text (a user message with --chat).
    #[arg(long)]
    prompt: String,
    /// Most tokens to generate; generation also stops at an end-of-sequence token.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed for sampling (with --temperature > 0).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Weight representation: f32, f16, quantized or auto.
    #[arg(long, default_value = "f32")]
    weights: WeightsKind,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        bail!("--temperature must be a finite number >= 0");
    }
    let load_start = Instant::now();
    let mut file = GgufFile::open(&args.model)?;
    let tokenizer = Tokenizer::from_gguf(&file.content, &args.model)?;
    let options = LoadOptions {
        weights: args.weights,
        device: Device::Cpu,
        attention: None,
    };
    let model = LlamaModel::from_gguf(&mut file, &options)?;
    let load_time = load_start.elapsed();

    let prompt_ids = if args.chat {
        let source = tokenizer
            .chat_template()
            .context("the model has no chat template; drop --chat")?;
        let template = ChatTemplate::new(source, tokenizer.bos_token(), tokenizer.eos_token())?;
        let text = template.render(&[ChatMessage::new("user", &args.prompt)], true)?;
        tokenizer.encode(&text)?
    } else {
        tokenizer.encode_prompt(&args.prompt)?
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty");
    }
    let max_len = model.config().max_position_embeddings;
    let total = (prompt_ids.len() + args.max_tokens).min(max_len);
    if prompt_ids.len() >= total {
        bail!(
            "the prompt has {} tokens; the model's context is {max_len}",
            prompt_ids.len()
        );
    }

    let blocks = total.div_ceil(BLOCK_SIZE);
    let mut kv = model.new_kv_cache(blocks, BLOCK_SIZE)?;
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut batch = StepBatch::new(BLOCK_SIZE);
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut decoder = IncrementalDecoder::new(true);
    let mut out = std::io::stdout().lock();

    let start = Instant::now();
    batch.push_sequence(&prompt_ids, 0, &table, true);
    let mut logits = model.forward(&batch, &mut kv)?;
    let prefill_time = start.elapsed();
    let mut generated = 0usize;
    for pos in prompt_ids.len()..total {
        let token = choose(&logits, args.temperature, &mut rng)?;
        if tokenizer.eos_token_ids().contains(&token) {
            break;
        }
        generated += 1;
        write!(out, "{}", decoder.push(&tokenizer, token))?;
        out.flush()?;
        if pos + 1 == total {
            break;
        }
        batch.clear();
        batch.push_sequence(&[token], pos, &table, true);
        logits = model.forward(&batch, &mut kv)?;
    }
    writeln!(out, "{}", decoder.finish())?;
    let decode_time = start.elapsed() - prefill_time;
    eprintln!(
        "[{} prompt tokens, {generated} generated; load {:.2}s, prefill {:.0} tok/s, decode {:.1} tok/s]",
        prompt_ids.len(),
        load_time.as_secs_f64(),
        prompt_ids.len() as f64 / prefill_time.as_secs_f64(),
        generated.saturating_sub(1) as f64 / decode_time.as_secs_f64().max(1e-9),
    );
    Ok(())
}

/// Greedy at temperature 0, otherwise a draw from the tempered softmax.
fn choose(logits: &Tensor, temperature: f32, rng: &mut rand::rngs::StdRng) -> anyhow::Result<u32> {
    let logits = logits.flatten_all()?;
    if temperature == 0.0 {
        return Ok(logits.argmax(D::Minus1)?.to_scalar::<u32>()?);
    }
    let probs =
        candle_nn::ops::softmax_last_dim(&(logits / temperature as f64)?)?.to_vec1::<f32>()?;
    Ok(WeightedIndex::new(&probs)?.sample(rng) as u32)
}
