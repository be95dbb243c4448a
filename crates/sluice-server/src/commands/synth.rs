//! `sluice synth`: a random-weight GGUF checkpoint of a real model's shape in any format sluice
//! loads (`sluice_model::synthetic`), so a machine that can download nothing (a lent GPU) can
//! still benchmark every size and format.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use sluice_model::synthetic::{ModelShape, SyntheticFormat, SyntheticSpec};

#[derive(clap::Args)]
pub struct SynthArgs {
    /// The shape: smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b, llama-3.1-8b, the
    /// mixtures of experts qwen3-30b-a3b, mixtral-8x7b and gpt-oss-20b, or the hybrids (Gated
    /// DeltaNet layers) qwen3.6-35b-a3b and qwen3.6-27b.
    #[arg(long)]
    shape: ModelShape,
    /// The weights' format: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k .. q6_k, or
    /// llama.cpp's mixes q4_k_m, q5_k_m and mxfp4_moe (gpt-oss's: MXFP4 experts, the rest
    /// Q8_0). Rows whose length does not split into a K-quant's
    /// 256-value blocks (SmolLM2's 576) get Q8_0, as llama.cpp gives them a fallback.
    #[arg(long)]
    format: SyntheticFormat,
    /// The GGUF file to write.
    #[arg(long)]
    out: PathBuf,
    /// Fewer layers than the shape has: a quick file for tests, or as much of a model as fits
    /// a machine's memory for a benchmark (Qwen3-30B-A3B's 48 layers are 17 GiB in Q4_K_M).
    #[arg(long)]
    layers: Option<usize>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    let spec = SyntheticSpec {
        shape: args.shape,
        format: args.format,
        num_layers: args.layers,
        seed: args.seed,
    };
    let start = Instant::now();
    let bytes = spec
        .write_gguf(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "wrote {} ({}, {:?}, {} layers, {} MiB of tensors) in {:.1} s",
        args.out.display(),
        spec.shape.name,
        spec.format,
        spec.num_layers(),
        bytes >> 20,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
