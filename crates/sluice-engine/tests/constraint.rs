//! Grammar-constrained requests through the engine loop over the mock model: every sequence's
//! output is in its grammar, batching next to unconstrained requests changes nothing for them,
//! `n > 1` sequences each follow the grammar, and preemption by recompute keeps them valid.

use std::time::Duration;

use sluice_engine::testing::{tiny_tokenizer, MockModel, TINY_VOCAB};
use sluice_engine::{
    ConstraintCompiler, Engine, EngineConfig, EngineHandle, Event, FinishReason, Grammar, Request,
    SamplingParams, StopParams,
};

fn start(num_blocks: usize, max_num_seqs: usize) -> Engine {
    let model = MockModel::new(TINY_VOCAB, 512, num_blocks, 16);
    let config = EngineConfig {
        max_num_seqs,
        ..EngineConfig::default()
    };
    Engine::start(Box::new(model), tiny_tokenizer(), config).unwrap()
}

fn compiler() -> ConstraintCompiler {
    ConstraintCompiler::new(tiny_tokenizer(), TINY_VOCAB).unwrap()
}

/// Byte tokens of `text` (the tiny tokenizer's id = byte).
fn bytes(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

struct Seq {
    text: String,
    reason: FinishReason,
}

fn outputs(events: Vec<Event>, n: usize) -> Vec<Seq> {
    let mut texts = vec![String::new(); n];
    let mut reasons = vec![None; n];
    for e in events {
        match e {
            Event::Token(t) => texts[t.index as usize].push_str(&t.text),
            Event::Finished(f) => {
                assert!(f.error.is_none(), "{:?}", f.error);
                reasons[f.index as usize] = Some(f.reason);
            }
        }
    }
    texts
        .into_iter()
        .zip(reasons)
        .map(|(text, r)| Seq {
            text,
            reason: r.expect("finished"),
        })
        .collect()
}

fn submit(h: &EngineHandle, r: Request) -> sluice_engine::RequestStream {
    h.submit(h.validate(r).unwrap()).unwrap()
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

fn is_word(text: &str) -> bool {
    text.len() == 5 && text.bytes().all(|b| b.is_ascii_lowercase())
}

#[test]
fn constrained_rows_follow_their_grammar_and_leave_other_rows_alone() {
    let compiler = compiler();
    let word = compiler.compile(Grammar::Regex("[a-z]{5}".into())).unwrap();
    let choice = compiler
        .compile(Grammar::Choice(vec![
            "red".into(),
            "green".into(),
            "blue".into(),
        ]))
        .unwrap();
    let free = |i: u64| Request {
        stop: StopParams {
            ignore_eos: true,
            ..StopParams::default()
        },
        ..Request::new(bytes(&format!("free prompt {i}")), 12)
    };
    let engine = start(256, 64);
    let h = engine.handle();
    let alone: Vec<String> = (0..4)
        .map(|i| {
            outputs(submit(&h, free(i)).collect_blocking(), 1)
                .remove(0)
                .text
        })
        .collect();

    let mut streams = Vec::new();
    for i in 0..12u64 {
        let (constraint, kind) = if i % 2 == 0 {
            (word.clone(), "word")
        } else {
            (choice.clone(), "choice")
        };
        let r = Request {
            n: 2,
            sampling: sampled(i),
            constraint: Some(constraint),
            ..Request::new(bytes(&format!("constrained {i}")), 16)
        };
        streams.push((kind, 2, submit(&h, r)));
        if i < 4 {
            streams.push(("free", 1, submit(&h, free(i))));
        }
    }
    let mut free_seen = 0;
    for (kind, n, stream) in streams {
        for seq in outputs(stream.collect_blocking(), n) {
            match kind {
                "word" => {
                    assert!(is_word(&seq.text), "{:?}", seq.text);
                    assert_eq!(seq.reason, FinishReason::Stop);
                }
                "choice" => {
                    assert!(
                        ["red", "green", "blue"].contains(&seq.text.as_str()),
                        "{:?}",
                        seq.text
                    );
                    assert_eq!(seq.reason, FinishReason::Stop);
                }
                _ => {
                    assert_eq!(seq.text, alone[free_seen], "unconstrained row {free_seen}");
                    free_seen += 1;
                }
            }
        }
    }
    assert_eq!(free_seen, 4);
    engine.shutdown(Duration::from_secs(5));
}

#[test]
fn preemption_by_recompute_keeps_constrained_outputs_valid() {
    // 12 blocks of 16 slots for 8 sequences of ~60 prompt + 40 output tokens: the scheduler
    // must preempt, and the preempted sequences' matchers go on from their kept tokens.
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"k": {"type": "string", "pattern": "^[a-z]{30}$"}},
        "required": ["k"],
        "additionalProperties": false
    });
    let json = compiler()
        .compile(Grammar::Json {
            schema,
            strict: true,
        })
        .unwrap();
    let engine = start(24, 8);
    let h = engine.handle();
    let streams: Vec<_> = (0..8u64)
        .map(|i| {
            let r = Request {
                sampling: sampled(100 + i),
                constraint: Some(json.clone()),
                ..Request::new(bytes(&"p".repeat(60 + i as usize)), 60)
            };
            submit(&h, r)
        })
        .collect();
    for stream in streams {
        let seq = outputs(stream.collect_blocking(), 1).remove(0);
        let v: serde_json::Value = serde_json::from_str(&seq.text).unwrap_or_else(|e| {
            panic!("{:?} is not JSON: {e}", seq.text);
        });
        let k = v["k"].as_str().unwrap();
        assert_eq!(k.len(), 30, "{k}");
        assert!(k.bytes().all(|b| b.is_ascii_lowercase()), "{k}");
    }
    assert!(h.stats().preemptions > 0, "the test did not preempt");
    engine.shutdown(Duration::from_secs(5));
}
