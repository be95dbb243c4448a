//! Gemma 3 270M (15 local layers with a window of 512 keys, 3 global ones) with its local
//! layers in a window pool of their own, as small as the scheduler allows: a 1,300-token
//! prompt and three shorter ones, batched and prefilled in chunks, give every token and every
//! logprob bit for bit as with one pool for all layers, and the local layers never hold more
//! than their windows. Skips (saying so) without `scripts/fetch-gemma.sh`'s model; CI fetches it.

mod common;

use std::sync::Arc;

use common::submit_all;
use sluice_engine::{Engine, EngineConfig, Event, Request, SamplingParams, WindowPool};
use sluice_model::testing::optional_model;
use sluice_model::{KvPools, LlamaModel, LoadOptions, PagedLlama, WeightsKind};
use sluice_tokenizer::Tokenizer;

const BLOCK: usize = 16;
const BUDGET: usize = 256;

/// Each request's tokens with their logprobs' bits.
fn run(
    model: LlamaModel,
    tokenizer: &Arc<Tokenizer>,
    window_blocks: Option<usize>,
    requests: &[Request],
) -> Vec<Vec<u32>> {
    let pools = KvPools {
        num_blocks: 256,
        group_blocks: window_blocks.into_iter().collect(),
    };
    let paged = PagedLlama::with_pools(model, pools, BLOCK).unwrap();
    let config = EngineConfig {
        max_num_batched_tokens: BUDGET,
        ..EngineConfig::default()
    };
    let engine = Engine::start(Box::new(paged), tokenizer.clone(), config).unwrap();
    let h = engine.handle();
    let out = submit_all(&h, requests)
        .into_iter()
        .map(|s| {
            let mut bits = Vec::new();
            for e in s.collect_blocking() {
                match e {
                    Event::Token(t) => {
                        let lp = t.logprobs.expect("logprobs were asked for");
                        bits.push(t.token);
                        bits.push(lp.logprob.to_bits());
                        for (id, p) in lp.top {
                            bits.extend([id, p.to_bits()]);
                        }
                    }
                    Event::Finished(f) => assert!(f.error.is_none(), "{:?}", f.error),
                }
            }
            bits
        })
        .collect();
    assert_eq!(h.stats().kv_blocks_used, 0);
    out
}

#[test]
fn a_window_pool_changes_no_token_of_gemma_3() {
    let Some(path) = optional_model("gemma-3-270m-q4_k_m.gguf", "scripts/fetch-gemma.sh") else {
        return;
    };
    let load = || {
        let options = LoadOptions {
            weights: WeightsKind::Auto,
            ..LoadOptions::default()
        };
        LlamaModel::load(&path, &options).unwrap()
    };
    let model = load();
    let window = model.config().sliding_window.as_ref().unwrap().window;
    assert_eq!(window, 512);
    let tokenizer = Arc::new(
        sluice_model::GgufFile::open(&path)
            .unwrap()
            .tokenizer()
            .unwrap(),
    );
    let long =
        "The river runs past the old mill, where the miller counts his sacks of grain. ".repeat(80);
    let texts = [
        long.as_str(),
        "The capital of France is",
        "Once upon a time, in a small village by the sea,",
        "def fibonacci(n):",
    ];
    let requests: Vec<Request> = texts
        .iter()
        .map(|t| Request {
            sampling: SamplingParams {
                logprobs: Some(3),
                ..SamplingParams::greedy()
            },
            ..Request::new(tokenizer.encode_prompt(t).unwrap(), 24)
        })
        .collect();
    let longest = requests[0].prompt.len();
    assert!(longest > 2 * window, "the long prompt has {longest} tokens");
    let one_pool = run(model, &tokenizer, None, &requests);
    let tight = WindowPool::blocks_for_one(window, BUDGET, BLOCK);
    let windowed = run(load(), &tokenizer, Some(tight), &requests);
    assert_eq!(windowed, one_pool);
}
