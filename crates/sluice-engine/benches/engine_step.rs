//! What one engine step costs besides the model: scheduling, building the step batch,
//! sampling 256 rows over a 49,152-token vocabulary, stop checks, detokenization and event
//! delivery. The mock model's forward (which writes the logits) is measured separately and
//! left out. Target: bookkeeping (everything but forward and sampling) < 1 ms per step at 256
//! running sequences. Run with `cargo bench -p sluice-engine --bench engine_step`.

use std::time::{Duration, Instant};

use sluice_engine::testing::{byte_prompt, tiny_tokenizer, MockModel};
use sluice_engine::{Engine, EngineConfig, EngineStats, Request, SamplingParams, StopParams};

const VOCAB: usize = 49_152;
const SEQS: usize = 256;
const PROMPT: usize = 128;
const MEASURED_STEPS: u64 = 200;

fn wait_for(engine: &Engine, what: &str, cond: impl Fn(&EngineStats) -> bool) -> EngineStats {
    let start = Instant::now();
    loop {
        let s = engine.handle().stats();
        if cond(&s) {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn scenario(name: &str, sampling: SamplingParams) {
    scenario_with(name, sampling, false);
}

/// With `kv_events`, the engine records KV-cache events and a thread reads every batch, as the
/// server's publisher does.
fn scenario_with(name: &str, sampling: SamplingParams, kv_events: bool) {
    let model = MockModel::new(VOCAB, 4096, SEQS * 64, 16);
    let config = EngineConfig {
        max_num_seqs: SEQS,
        max_num_batched_tokens: 8192,
        max_waiting: 4096,
        max_model_len: None,
        kv_events,
        ..EngineConfig::default()
    };
    let mut engine = Engine::start(Box::new(model), tiny_tokenizer(), config).unwrap();
    let events = engine.take_kv_events().map(|mut rx| {
        std::thread::spawn(move || {
            let mut batches = 0usize;
            while rx.blocking_recv().is_some() {
                batches += 1;
            }
            batches
        })
    });
    let h = engine.handle();
    let steps = 16 + MEASURED_STEPS as usize + 64;
    let streams: Vec<_> = (0..SEQS as u64)
        .map(|i| {
            let request = Request {
                sampling: sampling.clone(),
                stop: StopParams {
                    ignore_eos: true,
                    ..StopParams::default()
                },
                ..Request::new(byte_prompt(i, PROMPT), steps)
            };
            h.submit(h.validate(request).unwrap()).unwrap()
        })
        .collect();
    // Drain the streams on another thread, as the server's tasks would.
    let reader = std::thread::spawn(move || {
        streams
            .into_iter()
            .map(|s| s.collect_blocking().len())
            .sum::<usize>()
    });
    let warm = wait_for(&engine, "warm-up", |s| s.running == SEQS && s.steps >= 16);
    let done = wait_for(&engine, "measured steps", |s| {
        s.steps >= warm.steps + MEASURED_STEPS
    });
    let n = (done.steps - warm.steps) as f64;
    let us = |d: Duration| d.as_secs_f64() * 1e6 / n;
    let step = us(done.step_time - warm.step_time);
    let forward = us(done.forward_time - warm.forward_time);
    let sample = us(done.sample_time - warm.sample_time);
    println!(
        "{name}: {SEQS} running, vocab {VOCAB}: per step {step:.0} us total, mock forward \
         {forward:.0} us, sampling {sample:.0} us ({:.2} us/row), bookkeeping {:.0} us \
         (schedule + batch + commit + stop/detokenize + events)",
        sample / SEQS as f64,
        step - forward - sample
    );
    drop(engine);
    let stream_events = reader.join().unwrap();
    assert!(stream_events >= SEQS);
    if let Some(events) = events {
        let batches = events.join().unwrap();
        assert!(batches > 0, "no KV-event batch");
        println!("  {batches} KV-event batches read");
    }
}

fn main() {
    scenario("greedy", SamplingParams::greedy());
    scenario_with("greedy + KV events", SamplingParams::greedy(), true);
    scenario(
        "temperature 0.8, top_p 0.95, top_k 50",
        SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 50,
            ..SamplingParams::default()
        },
    );
    scenario(
        "temperature 1.0, top_p 0.9",
        SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            ..SamplingParams::default()
        },
    );
    scenario(
        "greedy + 5 logprobs + penalties",
        SamplingParams {
            logprobs: Some(5),
            presence_penalty: 0.5,
            frequency_penalty: 0.5,
            repetition_penalty: 1.1,
            ..SamplingParams::greedy()
        },
    );
}
