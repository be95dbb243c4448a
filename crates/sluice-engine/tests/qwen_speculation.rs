//! Speculation on Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, default weights), the model it is
//! for: with Qwen2.5-Coder-0.5B as its draft model and with n-gram lookup, k = 1, 4 and 8,
//! greedy answers to coding prompts are plain decoding's, token for token, alone and four at
//! once. Both files are optional (`scripts/fetch-qwen.sh`, `scripts/fetch-qwen-1.5b.sh`; CI
//! fetches them): without them the test says why it skipped and passes.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{generate_alone, generate_together};
use sluice_engine::{Engine, EngineConfig, Request, SpeculationConfig};
use sluice_model::testing::optional_model;
use sluice_model::{LlamaModel, LoadOptions, ModelSource, PagedLlama};
use sluice_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

const TARGET: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
const DRAFT: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

fn paged(path: &Path) -> Box<PagedLlama> {
    let model = LlamaModel::load(path, &LoadOptions::default()).unwrap();
    Box::new(PagedLlama::new(model, 512, 16).unwrap())
}

fn chat_prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    let template = ChatTemplate::new(
        tok.chat_template().expect("Qwen has a chat template"),
        tok.bos_token(),
        tok.eos_token(),
    )
    .unwrap();
    [
        "Write a Python function that returns the n-th Fibonacci number.",
        "Copy this code exactly, adding a docstring to add:\ndef add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b",
        "What does `git rebase` do? One sentence.",
        "Write a Rust function that reverses a string.",
    ]
    .iter()
    .map(|text| {
        let rendered = template
            .render(&[ChatMessage::new("user", *text)], true)
            .unwrap();
        tok.encode_prompt(&rendered).unwrap()
    })
    .collect()
}

#[test]
fn speculation_on_qwen_1_5b_changes_no_token() {
    let (Some(target), Some(draft)) = (
        optional_model(TARGET, "scripts/fetch-qwen-1.5b.sh"),
        optional_model(DRAFT, "scripts/fetch-qwen.sh"),
    ) else {
        return;
    };
    let tok = Arc::new(ModelSource::open(&target).unwrap().tokenizer().unwrap());
    let draft_tok = ModelSource::open(&draft).unwrap().tokenizer().unwrap();
    assert_eq!(tok.vocabulary_difference(&draft_tok), None);
    let requests: Vec<Request> = chat_prompts(&tok)
        .into_iter()
        .map(|p| Request::new(p, 40))
        .collect();
    let plain = Engine::start(paged(&target), tok.clone(), EngineConfig::default()).unwrap();
    let want: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| generate_alone(&plain.handle(), r))
        .collect();
    drop(plain);
    for (method, k) in [("draft", 1), ("draft", 4), ("draft", 8), ("ngram", 4)] {
        let config = |speculation| EngineConfig {
            speculation: Some(speculation),
            ..EngineConfig::default()
        };
        let engine = match method {
            "draft" => Engine::start_with_draft(
                paged(&target),
                paged(&draft),
                tok.clone(),
                // Every round guesses: on two CPU cores guesses do not pay for this pair, and
                // a cost-aware engine would soon stop making them.
                config(SpeculationConfig {
                    cost_aware: false,
                    ..SpeculationConfig::draft_model(k)
                }),
            ),
            _ => Engine::start(
                paged(&target),
                tok.clone(),
                config(SpeculationConfig::ngram(k)),
            ),
        }
        .unwrap();
        let h = engine.handle();
        for (i, r) in requests.iter().enumerate() {
            assert_eq!(
                generate_alone(&h, r),
                want[i],
                "{method}, k = {k}, request {i} alone"
            );
        }
        let together = generate_together(&h, &requests);
        for (i, want) in want.iter().enumerate() {
            assert_eq!(&together[i], want, "{method}, k = {k}, request {i} of four");
        }
        let s = h.stats();
        eprintln!(
            "{method}, k = {k}: {} of {} guesses kept",
            s.spec_accepted_tokens, s.spec_draft_tokens
        );
        assert!(s.spec_accepted_tokens > 0, "{method}, k = {k}: {s:?}");
    }
}
