//! Embedding requests in the engine loop, over the mock model: one finish carrying a unit
//! vector of the model's hidden size, no token; the same vector alone, beside other
//! embeddings and generations, and split over many prefill chunks, for every pooling; blocks
//! freed at the end; generations beside them unchanged.

mod common;

use std::time::{Duration, Instant};

use sluice_engine::testing::{tiny_tokenizer, MockModel, MOCK_HIDDEN_SIZE, TINY_VOCAB};
use sluice_engine::{
    Engine, EngineConfig, EngineHandle, Event, FinishReason, InvalidRequest, Pooling, Request,
    RequestStream, StopParams,
};

fn start(config: EngineConfig) -> Engine {
    let model = MockModel::new(TINY_VOCAB, 512, 256, 16);
    Engine::start(Box::new(model), tiny_tokenizer(), config).unwrap()
}

/// Byte tokens (ids under 256: never a control token of the tiny vocabulary).
fn input(seed: u64, len: usize) -> Vec<u32> {
    (0..len as u64)
        .map(|i| (common::mix(seed, i) % 256) as u32)
        .collect()
}

fn embed(h: &EngineHandle, tokens: Vec<u32>) -> RequestStream {
    h.submit(h.validate_embedding(tokens).unwrap()).unwrap()
}

/// The one event an embedding sends: its finish, with the vector.
fn vector(stream: RequestStream) -> Vec<f32> {
    let events = stream.collect_blocking();
    assert_eq!(events.len(), 1, "{events:?}");
    let Event::Finished(f) = &events[0] else {
        panic!("not a finish: {events:?}");
    };
    assert_eq!(f.reason, FinishReason::Stop);
    assert_eq!(f.usage.completion_tokens, 0);
    f.embedding.clone().expect("an embedding")
}

fn generation(seed: u64) -> Request {
    Request {
        stop: StopParams {
            ignore_eos: true,
            ..StopParams::default()
        },
        ..Request::new(input(seed, 40), 12)
    }
}

fn tokens(stream: RequestStream) -> Vec<u32> {
    stream
        .collect_blocking()
        .into_iter()
        .filter_map(|e| match e {
            Event::Token(t) => Some(t.token),
            Event::Finished(_) => None,
        })
        .collect()
}

fn wait_idle(h: &EngineHandle) {
    let start = Instant::now();
    while h.stats().kv_blocks_used != 0 || h.stats().in_flight() != 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "{:?}", h.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_embedding_is_the_same_alone_batched_and_chunked_for_every_pooling() {
    let inputs: Vec<Vec<u32>> = (0..6).map(|i| input(i, 5 + 23 * i as usize)).collect();
    for pooling in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
        let alone_engine = start(EngineConfig {
            pooling,
            ..EngineConfig::default()
        });
        let h = alone_engine.handle();
        assert_eq!(h.embedding_size(), MOCK_HIDDEN_SIZE);
        let alone: Vec<Vec<f32>> = inputs
            .iter()
            .map(|i| vector(embed(&h, i.clone())))
            .collect();
        for v in &alone {
            assert_eq!(v.len(), MOCK_HIDDEN_SIZE);
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "{pooling:?}: norm {norm}");
        }
        assert_ne!(alone[0], alone[1], "different inputs, different vectors");
        wait_idle(&h);

        // All at once, beside generations, with a budget of 16 tokens a step: every input
        // longer than that is split over several steps, and chunks share steps.
        let busy = start(EngineConfig {
            pooling,
            max_num_batched_tokens: 16,
            ..EngineConfig::default()
        });
        let h = busy.handle();
        let generations: Vec<RequestStream> = (0..3)
            .map(|s| h.submit(h.validate(generation(s)).unwrap()).unwrap())
            .collect();
        let streams: Vec<RequestStream> = inputs.iter().map(|i| embed(&h, i.clone())).collect();
        let together: Vec<Vec<f32>> = streams.into_iter().map(vector).collect();
        for g in generations {
            assert_eq!(tokens(g).len(), 12);
        }
        assert_eq!(together, alone, "{pooling:?}");
        wait_idle(&h);
    }
}

#[test]
fn generations_beside_embeddings_are_unchanged() {
    let engine = start(EngineConfig::default());
    let h = engine.handle();
    let alone: Vec<Vec<u32>> = (0..4)
        .map(|s| tokens(h.submit(h.validate(generation(s)).unwrap()).unwrap()))
        .collect();
    let embeddings: Vec<RequestStream> = (0..8).map(|i| embed(&h, input(i + 100, 70))).collect();
    let mixed: Vec<RequestStream> = (0..4)
        .map(|s| h.submit(h.validate(generation(s)).unwrap()).unwrap())
        .collect();
    let mixed: Vec<Vec<u32>> = mixed.into_iter().map(tokens).collect();
    for e in embeddings {
        vector(e);
    }
    assert_eq!(mixed, alone);
    wait_idle(&h);
}

#[test]
fn embeddings_are_validated_and_aborts_free_their_blocks() {
    let engine = start(EngineConfig::default());
    let h = engine.handle();
    // The whole context (512) may be embedded; one token more may not.
    vector(embed(&h, input(1, 512)));
    assert!(matches!(
        h.validate_embedding(input(1, 513)),
        Err(InvalidRequest::InputTooLong { .. })
    ));
    assert_eq!(
        h.validate_embedding(vec![]),
        Err(InvalidRequest::EmptyPrompt)
    );
    // Dropped before it finishes: aborted, its blocks freed.
    let stream = embed(&h, input(2, 400));
    drop(stream);
    wait_idle(&h);
}
