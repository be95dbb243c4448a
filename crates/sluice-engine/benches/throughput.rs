//! End-to-end generation throughput of the engine over the real SmolLM2-135M (f32 weights):
//! N concurrent requests of 128 new tokens each (EOS ignored), for N = 1, 16 and 64. Reports
//! output tokens per second and the share of step time spent outside the model's forward
//! (scheduling, sampling, detokenization, events; target < 5% at 64).
//! Run with `cargo bench -p sluice-engine --bench throughput` (the model from
//! `scripts/fetch-model.sh`, or `$SLUICE_MODEL`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use sluice_engine::{Engine, EngineConfig, Request, StopParams};
use sluice_model::{GgufFile, LlamaModel, LoadOptions, PagedLlama};

// As in the `sluice` binary: the forward's large temporary tensors churn the allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NEW_TOKENS: usize = 128;

fn model_path() -> PathBuf {
    let path = std::env::var_os("SLUICE_MODEL").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        },
        PathBuf::from,
    );
    assert!(
        path.is_file(),
        "model not found at {}: run scripts/fetch-model.sh (or set SLUICE_MODEL)",
        path.display()
    );
    path
}

fn main() {
    let path = model_path();
    let file = GgufFile::open(&path).unwrap();
    let tokenizer = Arc::new(file.tokenizer().unwrap());
    let model = LlamaModel::load(&path, &LoadOptions::default()).unwrap();
    println!(
        "SmolLM2-135M, weights {}, KV cache {:?}, {} rayon threads",
        model.weights(),
        model.kv_dtype(),
        rayon::current_num_threads()
    );
    // 64 sequences of ~40 + 128 tokens, with room to spare.
    let model = PagedLlama::new(model, 64 * 16, 16).unwrap();
    let engine =
        Engine::start(Box::new(model), tokenizer.clone(), EngineConfig::default()).unwrap();
    let h = engine.handle();

    for concurrency in [1usize, 16, 64] {
        let requests: Vec<Request> = (0..concurrency)
            .map(|i| {
                let text = format!(
                    "Request {i}: write a long story about a traveller who visits city number {i}."
                );
                Request {
                    stop: StopParams {
                        ignore_eos: true,
                        ..StopParams::default()
                    },
                    ..Request::new(tokenizer.encode_prompt(&text).unwrap(), NEW_TOKENS)
                }
            })
            .collect();
        let before = h.stats();
        let start = Instant::now();
        let streams: Vec<_> = requests
            .into_iter()
            .map(|r| h.submit(h.validate(r).unwrap()).unwrap())
            .collect();
        let mut first_token = None;
        let mut generated = 0usize;
        for s in streams {
            for e in s.collect_blocking() {
                if let sluice_engine::Event::Finished(f) = e {
                    generated += f.usage.completion_tokens;
                    let ttft = f.timing.time_to_first_token().unwrap();
                    first_token =
                        Some(first_token.map_or(ttft, |t: std::time::Duration| t.max(ttft)));
                }
            }
        }
        let wall = start.elapsed();
        let after = h.stats();
        let steps = after.steps - before.steps;
        let step_time = after.step_time - before.step_time;
        let forward = after.forward_time - before.forward_time;
        let sample = after.sample_time - before.sample_time;
        let outside = 1.0 - forward.as_secs_f64() / step_time.as_secs_f64();
        println!(
            "{concurrency:>3} concurrent x {NEW_TOKENS} tokens: {:.1} tok/s ({generated} tokens in \
             {:.2} s, {steps} steps of {:.1} ms, last first token at {:.0} ms); outside the \
             forward {:.2}% of step time (sampling {:.2}%)",
            generated as f64 / wall.as_secs_f64(),
            wall.as_secs_f64(),
            step_time.as_secs_f64() * 1e3 / steps as f64,
            first_token.unwrap_or_default().as_secs_f64() * 1e3,
            outside * 100.0,
            sample.as_secs_f64() / step_time.as_secs_f64() * 100.0,
        );
    }
}
