//! The engine over the real SmolLM2-135M (f32 weights): batching, preemption and the prefix
//! cache change no token; seeds reproduce; stop strings and UTF-8 survive real tokenization.
//! The model is found at `$SLUICE_MODEL` or in `models/`; a missing file fails the test with
//! the command that fetches it.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::submit_all;
use sluice_engine::{
    Engine, EngineConfig, EngineHandle, Event, FinishReason, Request, SamplingParams,
    SpeculationConfig, StopParams, StopReason,
};
use sluice_model::{LlamaModel, LoadOptions, PagedLlama, WeightsKind};
use sluice_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

fn model_path() -> PathBuf {
    let path = match std::env::var_os("SLUICE_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    assert!(
        path.is_file(),
        "model not found at {}: run scripts/fetch-model.sh (or set SLUICE_MODEL)",
        path.display()
    );
    path
}

/// An engine over the real model with a KV cache of `num_blocks` blocks of 16 tokens.
fn start_engine(num_blocks: usize) -> (Engine, Arc<Tokenizer>) {
    start_engine_with(num_blocks, EngineConfig::default())
}

fn start_engine_with(num_blocks: usize, config: EngineConfig) -> (Engine, Arc<Tokenizer>) {
    let path = model_path();
    let file = sluice_model::GgufFile::open(&path).unwrap();
    let tokenizer = Arc::new(file.tokenizer().unwrap());
    let options = LoadOptions {
        weights: WeightsKind::F32,
        ..LoadOptions::default()
    };
    let model = LlamaModel::load(&path, &options).unwrap();
    let model = PagedLlama::new(model, num_blocks, 16).unwrap();
    let engine = Engine::start(Box::new(model), tokenizer.clone(), config).unwrap();
    (engine, tokenizer)
}

#[derive(Debug, Clone, PartialEq)]
struct Output {
    tokens: Vec<u32>,
    deltas: Vec<String>,
    reason: FinishReason,
    stop_reason: Option<StopReason>,
}

impl Output {
    fn text(&self) -> String {
        self.deltas.concat()
    }
}

fn collect(events: Vec<Event>) -> Output {
    let mut tokens = Vec::new();
    let mut deltas = Vec::new();
    let mut finish = None;
    for e in events {
        assert!(finish.is_none(), "event after finish: {e:?}");
        match e {
            Event::Token(t) => {
                tokens.push(t.token);
                deltas.push(t.text);
            }
            Event::Finished(f) => {
                assert_ne!(f.reason, FinishReason::Error, "{:?}", f.error);
                finish = Some((f.reason, f.stop_reason));
            }
        }
    }
    let (reason, stop_reason) = finish.expect("the request finished");
    Output {
        tokens,
        deltas,
        reason,
        stop_reason,
    }
}

fn run(h: &EngineHandle, request: Request) -> Output {
    collect(
        h.submit(h.validate(request).unwrap())
            .unwrap()
            .collect_blocking(),
    )
}

/// Submits everything at once, then collects.
fn run_all(h: &EngineHandle, requests: &[Request]) -> Vec<Output> {
    submit_all(h, requests)
        .into_iter()
        .map(|s| collect(s.collect_blocking()))
        .collect()
}

const TOPICS: [&str; 8] = [
    "The history of the Roman Empire",
    "How photosynthesis works in plants",
    "A recipe for a simple tomato soup",
    "Why the sky is blue",
    "The rules of chess",
    "How a bicycle stays upright",
    "The life cycle of a butterfly",
    "What makes a good night's sleep",
];

/// 32 prompts of 6 to ~130 tokens.
fn varied_prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    (0..32)
        .map(|i| {
            let topic = TOPICS[i % TOPICS.len()];
            let mut text = format!("{topic}.");
            for k in 0..i / 2 {
                text.push_str(&format!(" Point {k} about {}.", topic.to_lowercase()));
            }
            text.push_str(" In short,");
            tok.encode_prompt(&text).unwrap()
        })
        .collect()
}

#[test]
fn greedy_tokens_are_the_same_batched_preempted_or_alone() {
    let (engine, tok) = start_engine(2048);
    let h = engine.handle();
    let requests: Vec<Request> = varied_prompts(&tok)
        .into_iter()
        .map(|p| Request::new(p, 10))
        .collect();
    let longest = requests.iter().map(|r| r.prompt.len()).max().unwrap();
    assert!((100..=200).contains(&longest), "longest prompt {longest}");
    let alone: Vec<Output> = requests.iter().map(|r| run(&h, r.clone())).collect();

    let batched = run_all(&h, &requests);
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert_eq!(
            a.tokens, b.tokens,
            "request {i}: batched differs from alone"
        );
        assert_eq!(a.text(), b.text());
    }
    drop(engine);

    // 24 blocks: the longest request fits alone, but not much more does.
    let (small, _) = start_engine(24);
    let hs = small.handle();
    let squeezed = run_all(&hs, &requests);
    for (i, (a, b)) in alone.iter().zip(&squeezed).enumerate() {
        assert_eq!(
            a.tokens, b.tokens,
            "request {i}: preempted differs from alone"
        );
    }
    let stats = hs.stats();
    assert!(stats.preemptions > 0, "no preemption happened: {stats:?}");
    assert_eq!(stats.kv_blocks_used, 0);
}

#[test]
fn a_shared_prefix_is_reused_and_changes_no_token() {
    let (engine, tok) = start_engine(1024);
    let h = engine.handle();
    let system = "You are a helpful assistant who answers questions about geography, history and \
                  science in a short and friendly way. Always give one fact and one example. ";
    let mut system = system.repeat(6);
    system.push_str("Question: ");
    let a = tok
        .encode_prompt(&format!("{system}What is the tallest mountain? Answer:"))
        .unwrap();
    let b = tok
        .encode_prompt(&format!("{system}Why do leaves fall in autumn? Answer:"))
        .unwrap();
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(shared >= 96, "the prompts share only {shared} tokens");

    run(&h, Request::new(a, 8));
    let before = h.stats().prefix_cache;
    let with_cache = run(&h, Request::new(b.clone(), 12));
    let after = h.stats().prefix_cache;
    let hits = after.hits - before.hits;
    assert_eq!(
        hits as usize,
        shared / 16 * 16,
        "B reused A's full shared blocks"
    );

    let (fresh, _) = start_engine(1024);
    let without_cache = run(&fresh.handle(), Request::new(b, 12));
    assert_eq!(fresh.handle().stats().prefix_cache.hits, 0);
    assert_eq!(with_cache.tokens, without_cache.tokens);
}

#[test]
fn a_seed_gives_the_same_text_alone_and_in_a_batch_of_16() {
    let (engine, tok) = start_engine(2048);
    let h = engine.handle();
    let seeded = Request {
        sampling: SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: Some(42),
            ..SamplingParams::default()
        },
        stop: StopParams {
            ignore_eos: true,
            ..StopParams::default()
        },
        ..Request::new(
            tok.encode_prompt("Once upon a time, in a small village,")
                .unwrap(),
            16,
        )
    };
    let first = run(&h, seeded.clone());
    let second = run(&h, seeded.clone());
    assert_eq!(first.tokens, second.tokens);

    let mut batch: Vec<Request> = varied_prompts(&tok)
        .into_iter()
        .take(15)
        .map(|p| Request {
            sampling: SamplingParams {
                temperature: 1.0,
                ..SamplingParams::default()
            },
            ..Request::new(p, 16)
        })
        .collect();
    batch.insert(7, seeded);
    let outputs = run_all(&h, &batch);
    assert_eq!(outputs[7].tokens, first.tokens);
    assert_eq!(outputs[7].text(), first.text());

    let other_seed = Request {
        sampling: SamplingParams {
            seed: Some(43),
            ..batch[7].sampling.clone()
        },
        ..batch[7].clone()
    };
    assert_ne!(run(&h, other_seed).tokens, first.tokens);
}

#[test]
fn stop_strings_split_across_tokens_are_caught_and_never_streamed() {
    let (engine, tok) = start_engine(512);
    let h = engine.handle();
    let prompt = tok.encode_prompt("The capital of France is").unwrap();
    let full = run(&h, Request::new(prompt.clone(), 24));
    // A stop string made of the end of one token's text and the start of the next.
    let pieces: Vec<String> = full
        .tokens
        .iter()
        .map(|&t| tok.decode(&[t], true))
        .collect();
    let i = (2..pieces.len() - 1)
        .find(|&i| {
            pieces[i].len() >= 2
                && pieces[i + 1].len() >= 2
                && pieces[i].is_ascii()
                && pieces[i + 1].is_ascii()
        })
        .expect("two neighbouring multi-character tokens");
    let stop = format!(
        "{}{}",
        &pieces[i][pieces[i].len() - 2..],
        &pieces[i + 1][..2]
    );
    let text = full.text();
    let expected = &text[..text.find(&stop).unwrap()];

    let request = Request {
        stop: StopParams {
            stop: vec![stop.clone()],
            ..StopParams::default()
        },
        ..Request::new(prompt, 24)
    };
    let out = run(&h, request);
    assert_eq!(out.reason, FinishReason::Stop);
    assert_eq!(out.stop_reason, Some(StopReason::String(stop.clone())));
    assert_eq!(out.text(), expected);
    let mut streamed = String::new();
    for d in &out.deltas {
        streamed.push_str(d);
        assert!(!streamed.contains(&stop), "{stop:?} leaked: {streamed:?}");
    }
}

#[test]
fn streamed_text_never_splits_a_character() {
    let (engine, tok) = start_engine(512);
    let h = engine.handle();
    let template = ChatTemplate::new(
        tok.chat_template().unwrap(),
        tok.bos_token(),
        tok.eos_token(),
    )
    .unwrap();
    let text = template
        .render(
            &[ChatMessage::new("user", "Write three emojis about cats")],
            true,
        )
        .unwrap();
    let out = run(&h, Request::new(tok.encode(&text).unwrap(), 40));
    // The test means something only if some token holds part of a character.
    assert!(
        out.tokens
            .iter()
            .any(|&t| std::str::from_utf8(tok.token_bytes(t)).is_err()),
        "no token split a character: {:?}",
        out.text()
    );
    let decoded = tok.decode(&out.tokens, true);
    assert_eq!(out.text(), decoded);
    // U+FFFD only where the output was cut mid-character, at the very end.
    assert!(!out.text().trim_end_matches('\u{FFFD}').contains('\u{FFFD}'));
    assert!(
        out.text().chars().any(|c| c.len_utf8() == 4),
        "{:?}",
        out.text()
    );
}

fn embedding(h: &EngineHandle, tokens: Vec<u32>) -> sluice_engine::RequestStream {
    h.submit(h.validate_embedding(tokens).unwrap()).unwrap()
}

fn embedding_vector(stream: sluice_engine::RequestStream) -> Vec<f32> {
    let events = stream.collect_blocking();
    match events.as_slice() {
        [Event::Finished(f)] => f.embedding.clone().expect("an embedding"),
        other => panic!("an embedding sends its finish only: {other:?}"),
    }
}

/// Embeddings of 8 texts (6 to ~130 tokens), each alone, then all together beside 8 greedy
/// generations with a 48-token step budget (long inputs prefilled in chunks that share steps
/// with decodes): every vector within 1e-4 of its own alone, of length 1, for mean and last
/// pooling; the generations give the tokens they give alone.
#[test]
fn embeddings_are_the_same_alone_and_in_mixed_chunked_batches() {
    for pooling in [sluice_engine::Pooling::Mean, sluice_engine::Pooling::Last] {
        let config = EngineConfig {
            pooling,
            ..EngineConfig::default()
        };
        let (engine, tok) = start_engine_with(1024, config.clone());
        let h = engine.handle();
        let prompts = varied_prompts(&tok);
        let inputs: Vec<Vec<u32>> = prompts.iter().step_by(4).cloned().collect();
        let alone: Vec<Vec<f32>> = inputs
            .iter()
            .map(|i| embedding_vector(embedding(&h, i.clone())))
            .collect();
        let generations: Vec<Request> = prompts
            .iter()
            .skip(1)
            .step_by(4)
            .map(|p| Request::new(p.clone(), 16))
            .collect();
        let generated_alone: Vec<Output> = generations.iter().map(|r| run(&h, r.clone())).collect();
        drop(engine);

        let (engine, _) = start_engine_with(
            1024,
            EngineConfig {
                max_num_batched_tokens: 48,
                ..config
            },
        );
        let h = engine.handle();
        let gen_streams: Vec<_> = generations
            .iter()
            .map(|r| h.submit(h.validate(r.clone()).unwrap()).unwrap())
            .collect();
        let streams: Vec<_> = inputs.iter().map(|i| embedding(&h, i.clone())).collect();
        let together: Vec<Vec<f32>> = streams.into_iter().map(embedding_vector).collect();
        let generated: Vec<Output> = gen_streams
            .into_iter()
            .map(|s| collect(s.collect_blocking()))
            .collect();
        assert_eq!(generated, generated_alone, "{pooling:?}");
        for (a, b) in alone.iter().zip(&together) {
            assert_eq!(a.len(), 576);
            let norm: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "{pooling:?}: norm {norm}");
            let worst = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst <= 1e-4,
                "{pooling:?}: batching moved a value by {worst}"
            );
        }
        assert!(
            alone.windows(2).all(|w| w[0] != w[1]),
            "different texts, different vectors"
        );
    }
}

/// Prompts whose continuation copies text already in them, as an editing request's does: the
/// ground where n-gram drafts come true.
fn copying_prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    let texts = [
        "Copy the list.\nList: apple, banana, cherry, date, fig, grape, kiwi, lemon, mango.\nCopy: apple, banana,",
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n# The same two functions again:\ndef add(a, b):\n",
        "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,",
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,",
        "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The",
        "Why the sky is blue. In short,",
    ];
    texts
        .iter()
        .map(|t| tok.encode_prompt(t).unwrap())
        .collect()
}

/// Requests for the speculation tests: one greedy request per prompt (the first stops at
/// "lemon", the fourth has `max_tokens` 3, the fifth `min_tokens` 12), then `sampled` seeded
/// ones at temperature 0.7, top_p 0.95, each `max_tokens` long.
fn speculation_requests(prompts: &[Vec<u32>], max_tokens: usize, sampled: usize) -> Vec<Request> {
    let mut requests: Vec<Request> = prompts
        .iter()
        .map(|p| Request::new(p.clone(), max_tokens))
        .collect();
    requests[0].stop.stop = vec!["lemon".into()];
    requests[3].max_tokens = Some(3);
    requests[4].stop.min_tokens = 12;
    requests.extend(
        prompts
            .iter()
            .take(sampled)
            .enumerate()
            .map(|(i, p)| Request {
                sampling: SamplingParams {
                    temperature: 0.7,
                    top_p: 0.95,
                    seed: Some(100 + i as u64),
                    ..SamplingParams::default()
                },
                ..Request::new(p.clone(), max_tokens)
            }),
    );
    requests
}

/// Each request's output on `h` alone and all at once is `want`'s; the KV cache is empty
/// afterwards.
fn assert_plain_alone_and_in_a_crowd(
    h: &EngineHandle,
    requests: &[Request],
    want: &[Output],
    k: usize,
) {
    let alone: Vec<Output> = requests.iter().map(|r| run(h, r.clone())).collect();
    let crowd = run_all(h, requests);
    for (i, want) in want.iter().enumerate() {
        assert_eq!(alone[i], *want, "k = {k}, request {i} alone");
        assert_eq!(crowd[i], *want, "k = {k}, request {i} in a crowd");
    }
    assert_eq!(h.stats().kv_blocks_used, 0);
}

/// Output with n-gram speculation on is plain decoding's, token for token, whatever the number
/// of drafts, alone or in a crowd: greedy, with a stop string, a short `max_tokens` or
/// `min_tokens`, and sampled with a seed (each draft's row draws what plain decoding draws
/// there); and the drafts do come true on text that copies itself.
#[test]
fn speculation_changes_no_token_alone_or_in_a_crowd() {
    let (engine, tok) = start_engine(2048);
    let h = engine.handle();
    let requests = speculation_requests(&copying_prompts(&tok), 40, 4);
    let want: Vec<Output> = requests.iter().map(|r| run(&h, r.clone())).collect();
    drop(engine);
    for k in [1, 3, 8] {
        let config = EngineConfig {
            speculation: Some(SpeculationConfig {
                max_running: 16,
                ..SpeculationConfig::ngram(k)
            }),
            ..EngineConfig::default()
        };
        let (engine, _) = start_engine_with(2048, config);
        let h = engine.handle();
        assert_plain_alone_and_in_a_crowd(&h, &requests, &want, k);
        let stats = h.stats();
        assert!(
            stats.spec_accepted_tokens > 0 && stats.spec_draft_tokens >= stats.spec_accepted_tokens,
            "k = {k}: {stats:?}"
        );
    }
}

/// Speculation with a draft model: SmolLM2 in its file's own arithmetic (Q4_1 blocks in
/// int8) guesses for SmolLM2 in f32. The guesses are mostly right, and every output is plain
/// decoding's, token for token, alone and in a crowd, greedy and seeded, k = 1, 3 and 8; the
/// draft cache is empty when the requests are done.
#[test]
fn a_draft_model_changes_no_token_alone_or_in_a_crowd() {
    let (engine, tok) = start_engine(2048);
    let h = engine.handle();
    let prompts: Vec<Vec<u32>> = copying_prompts(&tok)
        .into_iter()
        .chain(varied_prompts(&tok).into_iter().take(4))
        .collect();
    let requests = speculation_requests(&prompts, 32, 3);
    let want: Vec<Output> = requests.iter().map(|r| run(&h, r.clone())).collect();
    drop(engine);
    let path = model_path();
    for k in [1, 3, 8] {
        let target = LlamaModel::load(
            &path,
            &LoadOptions {
                weights: WeightsKind::F32,
                ..LoadOptions::default()
            },
        )
        .unwrap();
        let draft = LlamaModel::load(&path, &LoadOptions::default()).unwrap();
        let engine = Engine::start_with_draft(
            Box::new(PagedLlama::new(target, 2048, 16).unwrap()),
            Box::new(PagedLlama::new(draft, 2048, 16).unwrap()),
            tok.clone(),
            EngineConfig {
                // Every round guesses, paying or not.
                speculation: Some(SpeculationConfig {
                    max_running: 16,
                    cost_aware: false,
                    ..SpeculationConfig::draft_model(k)
                }),
                ..EngineConfig::default()
            },
        )
        .unwrap();
        let h = engine.handle();
        assert_plain_alone_and_in_a_crowd(&h, &requests, &want, k);
        let stats = h.stats();
        assert!(
            stats.spec_accepted_tokens * 2 > stats.spec_draft_tokens,
            "k = {k}: the same model in int8 should guess most tokens right: {stats:?}"
        );
        // Freed before each finish was sent.
        assert_eq!(stats.draft_kv_blocks_used, 0);
    }
}
