//! LoRA adapters through the engine, on a tiny random-weight model: requests naming three
//! adapters and the base, run together with two adapter slots (so adapters wait their turn
//! for a slot), each generate exactly the tokens they generate alone; an adapter changes
//! what its requests generate; a request naming an adapter is refused by an engine without
//! adapter slots.

use std::path::PathBuf;
use std::sync::Arc;

use sluice_engine::{AdapterKey, Engine, EngineConfig, Event, LoraRequest, Request, ValidRequest};
use sluice_model::testing::{TinyLoraSpec, TinyModelSpec};
use sluice_model::{LlamaModel, LoadOptions, LoraProjection, PagedLlama};

fn dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("sluice-engine-lora-{}", std::process::id()))
        .join(test);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Fixture {
    model: PathBuf,
    adapters: Vec<LoraRequest>,
}

/// The model and its three adapters, written for `test` alone (tests run in parallel).
fn fixture(test: &str) -> Fixture {
    let dir = dir(test);
    let model = dir.join("model.gguf");
    TinyModelSpec {
        seed: 5,
        ..TinyModelSpec::default()
    }
    .write_gguf(&model)
    .unwrap();
    let base = LlamaModel::load(&model, &LoadOptions::default()).unwrap();
    let adapters = (1..=3u64)
        .map(|id| {
            let path = dir.join(format!("adapter-{id}.gguf"));
            TinyLoraSpec {
                rank: 8,
                // Large enough that each adapter moves the greedy tokens.
                alpha: 256.0,
                targets: LoraProjection::ALL.to_vec(),
                seed: 100 + id,
            }
            .write_gguf(base.config(), &path)
            .unwrap();
            LoraRequest {
                key: AdapterKey {
                    id,
                    name: format!("adapter-{id}").into(),
                },
                adapter: Arc::new(base.load_adapter(&path, 64).unwrap()),
            }
        })
        .collect();
    Fixture { model, adapters }
}

fn start(f: &Fixture, max_loras: usize) -> Engine {
    let model = LlamaModel::load(&f.model, &LoadOptions::default()).unwrap();
    let tokenizer = Arc::new(
        sluice_model::GgufFile::open(&f.model)
            .unwrap()
            .tokenizer()
            .unwrap(),
    );
    let paged = PagedLlama::new(model, 256, 16).unwrap();
    Engine::start(
        Box::new(paged),
        tokenizer,
        EngineConfig {
            max_loras,
            max_num_batched_tokens: 64,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

fn prompt(i: u32) -> Vec<u32> {
    (0..12 + i % 5)
        .map(|t| (t * 13 + i * 7 + 1) % 200 + 3)
        .collect()
}

/// Submits every `(prompt, adapter)` at once and returns each one's greedy tokens.
fn generate(engine: &Engine, jobs: &[(Vec<u32>, Option<LoraRequest>)]) -> Vec<Vec<u32>> {
    let handle = engine.handle();
    let mut streams: Vec<_> = jobs
        .iter()
        .map(|(prompt, lora)| {
            let mut request = Request::new(prompt.clone(), 12);
            request.stop.ignore_eos = true;
            let mut valid = ValidRequest::new(request, &handle.limits()).unwrap();
            if let Some(lora) = lora {
                valid = valid.with_adapter(lora.clone()).unwrap();
            }
            handle.submit(valid).unwrap()
        })
        .collect();
    streams
        .iter_mut()
        .map(|s| {
            let mut tokens = Vec::new();
            while let Some(event) = s.blocking_recv() {
                match event {
                    Event::Token(t) => tokens.push(t.token),
                    Event::Finished(_) => break,
                }
            }
            tokens
        })
        .collect()
}

#[test]
fn mixed_adapters_in_one_step_give_each_request_its_tokens_alone() {
    let f = fixture("mixed");
    let jobs: Vec<(Vec<u32>, Option<LoraRequest>)> = (0..16u32)
        .map(|i| {
            let lora = match i % 4 {
                0 => None,
                k => Some(f.adapters[k as usize - 1].clone()),
            };
            (prompt(i), lora)
        })
        .collect();
    let alone: Vec<Vec<u32>> = {
        let engine = start(&f, 1);
        jobs.iter()
            .map(|job| generate(&engine, std::slice::from_ref(job)).remove(0))
            .collect()
    };
    // Two slots for three adapters: some requests wait for a slot while others run.
    let engine = start(&f, 2);
    let together = generate(&engine, &jobs);
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(
            a,
            t,
            "request {i} (adapter {:?})",
            jobs[i].1.as_ref().map(|l| l.key.id)
        );
        assert_eq!(a.len(), 12);
    }
    // The adapters do something: the same prompt gives other tokens under each.
    let same: Vec<(Vec<u32>, Option<LoraRequest>)> = std::iter::once(None)
        .chain(f.adapters.iter().cloned().map(Some))
        .map(|lora| (prompt(1), lora))
        .collect();
    let outs = generate(&engine, &same);
    for i in 0..outs.len() {
        for j in i + 1..outs.len() {
            assert_ne!(
                outs[i], outs[j],
                "adapters {i} and {j} generate the same tokens"
            );
        }
    }
}

#[test]
fn an_engine_without_adapter_slots_refuses_an_adapter() {
    let f = fixture("no-slots");
    let engine = start(&f, 0);
    let request = ValidRequest::new(Request::new(prompt(0), 4), &engine.handle().limits()).unwrap();
    let err = request.with_adapter(f.adapters[0].clone()).unwrap_err();
    assert!(err.to_string().contains("adapter-1"), "{err}");
}
