//! Rows a model samples itself (a GPU model's `Model::samples_rows`), through the engine loop
//! over the mock model, which then samples by the rule the CUDA kernel follows: greedy rows
//! give what the engine's sampler gives (tokens, logprobs and top logprobs), rows that need the
//! sampler (penalties, bias, `min_tokens` bans, grammars) stay with it in the same steps, and
//! seeded rows are reproducible in any batch.

mod common;

use common::submit_all;
use sluice_engine::testing::{byte_prompt, tiny_tokenizer, MockControl, MockModel, TINY_VOCAB};
use sluice_engine::{
    ConstraintCompiler, Engine, EngineConfig, EngineHandle, Event, Grammar, Request,
    SamplingParams, StopParams,
};

fn start(model_samples: bool) -> (Engine, MockControl) {
    let mut model = MockModel::new(TINY_VOCAB, 512, 256, 16);
    if model_samples {
        model = model.sampling_rows_itself();
    }
    let control = model.control();
    let engine = Engine::start(Box::new(model), tiny_tokenizer(), EngineConfig::default());
    (engine.unwrap(), control)
}

/// Exactly `max_tokens` tokens (EOS ignored) with `sampling`.
fn request(seed: u64, max_tokens: usize, sampling: SamplingParams) -> Request {
    Request {
        sampling,
        stop: StopParams {
            ignore_eos: true,
            ..StopParams::default()
        },
        ..Request::new(byte_prompt(seed, 5 + seed as usize % 11), max_tokens)
    }
}

/// A token's logprob and its top alternatives', as streamed.
type Logprobs = Option<(f32, Vec<(u32, f32)>)>;

/// Each request's tokens and logprobs, all submitted at once so they share steps.
fn run_together(h: &EngineHandle, requests: &[Request]) -> Vec<(Vec<u32>, Vec<Logprobs>)> {
    submit_all(h, requests)
        .into_iter()
        .map(|s| {
            let mut tokens = Vec::new();
            let mut logprobs = Vec::new();
            for e in s.collect_blocking() {
                match e {
                    Event::Token(t) => {
                        tokens.push(t.token);
                        logprobs.push(t.logprobs.map(|l| (l.logprob, l.top)));
                    }
                    Event::Finished(f) => assert!(f.error.is_none(), "{:?}", f.error),
                }
            }
            (tokens, logprobs)
        })
        .collect()
}

fn greedy_with(edit: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams::greedy();
    edit(&mut p);
    p
}

#[test]
fn the_model_takes_the_plain_rows_and_the_sampler_the_rest_in_the_same_steps() {
    let constraint = ConstraintCompiler::new(tiny_tokenizer(), TINY_VOCAB)
        .unwrap()
        .compile(Grammar::Regex("[a-z]{12}".into()))
        .unwrap();
    let requests = vec![
        // The model's: greedy, greedy with the chosen token's logprob or top logprobs, top_k 1.
        request(1, 12, SamplingParams::greedy()),
        request(2, 12, greedy_with(|p| p.logprobs = Some(0))),
        request(6, 12, greedy_with(|p| p.logprobs = Some(5))),
        request(
            3,
            12,
            SamplingParams {
                temperature: 1.0,
                top_k: 1,
                ..SamplingParams::default()
            },
        ),
        // The sampler's: penalties, bias, a grammar.
        request(4, 12, greedy_with(|p| p.frequency_penalty = 1.5)),
        request(
            5,
            12,
            greedy_with(|p| p.logit_bias = vec![(b'q'.into(), 5.0)]),
        ),
        Request {
            constraint: Some(constraint),
            ..request(7, 12, SamplingParams::greedy())
        },
        // min_tokens bans EOS for its first 5 rows (the sampler's), then the model's.
        Request {
            stop: StopParams {
                min_tokens: 5,
                ..StopParams::default()
            },
            ..request(8, 12, SamplingParams::greedy())
        },
    ];
    let (plain, plain_control) = start(false);
    let (gpu_like, control) = start(true);
    let expected = run_together(&plain.handle(), &requests);
    let got = run_together(&gpu_like.handle(), &requests);
    assert_eq!(plain_control.model_sampled_rows(), 0);
    for (i, (want, have)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(want.0, have.0, "request {i}: the same tokens on both paths");
        assert_eq!(want.1.len(), have.1.len());
        for (a, b) in want.1.iter().zip(&have.1) {
            match (a, b) {
                (Some(a), Some(b)) => {
                    assert!((a.0 - b.0).abs() < 1e-5, "request {i}: {a:?} vs {b:?}");
                    assert_eq!(a.1.len(), b.1.len(), "request {i}: {a:?} vs {b:?}");
                    for (x, y) in a.1.iter().zip(&b.1) {
                        assert_eq!(x.0, y.0, "request {i}: {a:?} vs {b:?}");
                        assert!((x.1 - y.1).abs() < 1e-5, "request {i}: {a:?} vs {b:?}");
                    }
                }
                (None, None) => {}
                _ => panic!("request {i}: logprobs on one path only"),
            }
        }
    }
    assert_eq!(got[2].1[0].as_ref().unwrap().1.len(), 5);
    let min_tokens_rows = got[7].0.len() - 5;
    assert_eq!(
        control.model_sampled_rows(),
        (4 * 12 + min_tokens_rows) as u64,
        "exactly the plain rows went to the model"
    );
}

#[test]
fn seeded_rows_sampled_by_the_model_are_the_same_in_any_batch() {
    let (engine, control) = start(true);
    let h = engine.handle();
    let seeded = request(
        21,
        24,
        SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            top_k: 40,
            min_p: 0.01,
            seed: Some(1234),
            ..SamplingParams::default()
        },
    );
    let alone = run_together(&h, std::slice::from_ref(&seeded));
    let mut batch = vec![seeded];
    batch.extend((0..15).map(|i| {
        let sampling = SamplingParams {
            temperature: 1.0,
            presence_penalty: if i % 2 == 0 { 0.5 } else { 0.0 },
            ..SamplingParams::default()
        };
        request(100 + i, 30, sampling)
    }));
    let batched = run_together(&h, &batch);
    assert_eq!(alone[0].0, batched[0].0);
    assert!(control.model_sampled_rows() >= 2 * 24);
    // A different seed draws differently.
    let mut other = batch[0].clone();
    other.sampling.seed = Some(99);
    assert_ne!(run_together(&h, &[other])[0].0, alone[0].0);
}
