//! The engine over a tiny Gemma 3 (a local layer with a window of 8 keys, then a global one)
//! whose local layer has a KV pool of its own, which keeps only the blocks the windows reach:
//! every token and every logprob is bit for bit what the model gives with one pool for all
//! layers, alone or batched, chunked, preempted, through the prefix cache and with `n > 1`; and
//! the window pool holds a few blocks a sequence while the full pool holds all of them.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::submit_all;
use sluice_engine::{Engine, EngineConfig, EngineHandle, Event, Request, SamplingParams};
use sluice_model::testing::{TinyModelSpec, TINY_GEMMA_WINDOW};
use sluice_model::{
    Architecture, CacheKind, KvPools, LlamaModel, LoadOptions, PagedLlama, WeightsKind,
};
use sluice_tokenizer::Tokenizer;

/// The tiny Gemma 3 file, written once per process: the tests run in parallel, and one that
/// found another's file half-written would read a truncated header.
fn tiny_gemma() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("sluice-window-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gemma3.gguf");
        let spec = TinyModelSpec {
            architecture: Architecture::Gemma3,
            head_dim: Some(32),
            ..TinyModelSpec::default()
        };
        spec.write_gguf(&path).unwrap();
        path
    })
    .clone()
}

/// An engine whose cache has `num_blocks` blocks of `block_size` tokens, and a window pool of
/// `window_blocks` for the local layer when given.
fn start(
    num_blocks: usize,
    window_blocks: Option<usize>,
    block_size: usize,
    config: EngineConfig,
) -> (Engine, Arc<Tokenizer>) {
    let path = tiny_gemma();
    let tokenizer = Arc::new(
        sluice_model::GgufFile::open(&path)
            .unwrap()
            .tokenizer()
            .unwrap(),
    );
    let options = LoadOptions {
        weights: WeightsKind::F32,
        ..LoadOptions::default()
    };
    let model = LlamaModel::load(&path, &options).unwrap();
    let pools = KvPools {
        num_blocks,
        group_blocks: window_blocks.into_iter().collect(),
    };
    let paged = PagedLlama::with_pools(model, pools, block_size).unwrap();
    assert_eq!(
        paged.kv_groups(),
        window_blocks
            .map(|b| (CacheKind::SlidingWindow(TINY_GEMMA_WINDOW), b))
            .into_iter()
            .collect::<Vec<_>>()
    );
    let engine = Engine::start(Box::new(paged), tokenizer.clone(), config).unwrap();
    (engine, tokenizer)
}

/// Each sequence's tokens and their logprobs' bits, in request then index order.
type Outputs = Vec<Vec<(u32, Vec<(u32, u32)>)>>;

/// A request's tokens, sequence after sequence (their events interleave as they run).
fn collect(mut events: Vec<Event>) -> Vec<(u32, Vec<(u32, u32)>)> {
    events.sort_by_key(Event::index);
    let mut out = Vec::new();
    for e in events {
        match e {
            Event::Token(t) => {
                let mut bits = Vec::new();
                if let Some(lp) = t.logprobs {
                    bits.push((t.token, lp.logprob.to_bits()));
                    bits.extend(lp.top.iter().map(|(id, p)| (*id, p.to_bits())));
                }
                out.push((t.token, bits));
            }
            Event::Finished(f) => assert!(f.error.is_none(), "{:?}", f.error),
        }
    }
    out
}

fn run_all(h: &EngineHandle, requests: &[Request]) -> Outputs {
    submit_all(h, requests)
        .into_iter()
        .map(|s| collect(s.collect_blocking()))
        .collect()
}

/// Prompts of 3 to ~90 tokens (many windows of 8), half of them sharing a long prefix, one
/// of them asking for 3 sequences.
fn requests(tok: &Tokenizer) -> Vec<Request> {
    let shared = "the quick brown fox jumps over the lazy dog and then ".repeat(3);
    (0..12)
        .map(|i| {
            let text = if i % 2 == 0 {
                format!("{shared}{i} more words")
            } else {
                "in the beginning ".repeat(i)
            };
            let mut r = Request::new(tok.encode_prompt(&text).unwrap(), 6 + i % 5);
            r.sampling = SamplingParams {
                logprobs: Some(3),
                ..SamplingParams::greedy()
            };
            if i == 4 {
                r.n = 3;
                r.sampling.temperature = 0.8;
                r.sampling.seed = Some(7);
            }
            r
        })
        .collect()
}

fn config(max_num_batched_tokens: usize) -> EngineConfig {
    EngineConfig {
        max_num_batched_tokens,
        ..EngineConfig::default()
    }
}

#[test]
fn a_window_pool_changes_no_token_and_no_logprob() {
    for block_size in [4, 16] {
        let (one_pool, tok) = start(256, None, block_size, config(2048));
        let requests = requests(&tok);
        let alone: Outputs = requests
            .iter()
            .flat_map(|r| run_all(&one_pool.handle(), std::slice::from_ref(r)))
            .collect();
        drop(one_pool);

        // Batched, prefills chunked by a budget of 24 tokens, with a roomy window pool.
        let (engine, _) = start(256, Some(128), block_size, config(24));
        let h = engine.handle();
        let batched: Outputs = run_all(&h, &requests);
        assert_eq!(batched, alone, "block size {block_size}: batched, chunked");
        // Again: the shared prefix now comes from both prefix caches.
        let before = h.stats().prefix_cache.hits;
        let cached: Outputs = run_all(&h, &requests);
        assert_eq!(
            cached, alone,
            "block size {block_size}: through the prefix cache"
        );
        assert!(
            h.stats().prefix_cache.hits > before,
            "block size {block_size}: no prefix-cache hit"
        );
        assert_eq!(h.stats().kv_blocks_used, 0);
        drop(engine);

        // A window pool as small as the scheduler allows: sequences wait and are preempted
        // for window blocks, and still nothing changes.
        let budget = 24;
        let tight = (TINY_GEMMA_WINDOW - 1 + budget).div_ceil(block_size) + 1;
        let (engine, _) = start(256, Some(tight), block_size, config(budget));
        let h = engine.handle();
        let squeezed: Outputs = run_all(&h, &requests);
        assert_eq!(
            squeezed, alone,
            "block size {block_size}: a tight window pool"
        );
        assert!(
            h.stats().preemptions > 0,
            "block size {block_size}: the tight window pool preempted nothing"
        );
        assert_eq!(h.stats().kv_blocks_used, 0);
    }
}

#[test]
fn a_long_sequence_keeps_only_its_window_in_the_window_pool() {
    let block_size = 4;
    let (engine, tok) = start(64, Some(7), block_size, config(16));
    let h = engine.handle();
    // ~200 tokens: 50 blocks in the full pool; the window pool has 7, the fewest the scheduler
    // accepts for a window of 8 and chunks of 16 tokens.
    let prompt = tok
        .encode_prompt(&"the lazy dog sleeps in the sun all day long ".repeat(5))
        .unwrap();
    assert!(prompt.len() > 150, "prompt of {} tokens", prompt.len());
    let request = Request {
        sampling: SamplingParams {
            logprobs: Some(2),
            ..SamplingParams::greedy()
        },
        ..Request::new(prompt, 40)
    };
    // The full pool holds the whole sequence; 7 window blocks (28 tokens) suffice because
    // blocks out of the window go back as it advances.
    let needed = (request.prompt.len() + 40).div_ceil(block_size);
    assert!(needed > 7 * 5, "{needed} blocks");
    let out = run_all(&h, std::slice::from_ref(&request));
    assert_eq!(out[0].len(), 40);
    assert_eq!(h.stats().kv_blocks_used, 0);
    let (one_pool, _) = start(64, None, block_size, config(16));
    let reference = run_all(&one_pool.handle(), &[request]);
    assert_eq!(out, reference);
}

/// The figure of the sliding-window work: the KV memory one 32k-token sequence holds, with
/// gpt-oss-20b's attention (24 layers of 8 KV heads of 64 in f16, every other one a window of
/// 128 keys), against the same sequence with every layer in one pool. Measured on the
/// scheduler's own tables while it prefills in chunks of 2048 and decodes 64 tokens.
#[test]
fn a_32k_token_gpt_oss_shaped_sequence_holds_about_half_the_kv_of_full_attention() {
    use sluice_engine::{KvGroupSpec, Scheduler, SchedulerConfig, WindowPool};
    use sluice_model::StepBatch;

    const LAYERS: usize = 24;
    const LOCAL: usize = 12;
    const WINDOW: usize = 128;
    // K and V of 8 heads of 64 dimensions in f16, one layer, one token.
    const LAYER_TOKEN_BYTES: usize = 2 * 8 * 64 * 2;
    let (bs, budget, prompt, generated): (usize, usize, usize, usize) = (16, 2048, 32 * 1024, 64);
    let window_blocks = WindowPool::blocks_for_one(WINDOW, budget, bs);
    let num_blocks = (prompt + generated).div_ceil(bs);
    let mut sched = Scheduler::new(SchedulerConfig {
        max_num_seqs: 1,
        max_num_batched_tokens: budget,
        block_size: bs,
        num_blocks,
        max_model_len: prompt + generated,
        speculation: None,
        kv_groups: vec![KvGroupSpec::SlidingWindow(WindowPool {
            num_blocks: window_blocks,
            window: WINDOW,
        })],
        max_loras: 0,
    })
    .unwrap();
    sched.add_request(
        1,
        (0..prompt as u32).map(|t| t % 1000).collect(),
        generated,
        1,
    );
    let mut batch = StepBatch::new(bs);
    let (mut peak_full, mut peak_window, mut decode_window) = (0, 0, 0);
    let mut steps = 0;
    while sched.has_unfinished() {
        let out = sched.schedule();
        let samples = out.num_samples();
        sched.fill_step_batch(&mut batch);
        let pools = sched.block_pools();
        let window_used = pools.window().unwrap().num_used_blocks();
        peak_full = peak_full.max(pools.num_used_blocks());
        peak_window = peak_window.max(window_used);
        if batch.num_tokens() == 1 {
            decode_window = decode_window.max(window_used);
        }
        sched.commit(&vec![7; samples]).unwrap();
        let id = sluice_engine::SeqId::new(1, 0);
        if sched.get(id).unwrap().num_generated() == generated {
            sched.finish(id);
        }
        sched.check_invariants().unwrap();
        steps += 1;
    }
    assert_eq!(sched.num_used_blocks(), 0);
    let block_bytes = bs * LAYER_TOKEN_BYTES;
    let full_attention = num_blocks * LAYERS * block_bytes;
    let windowed = peak_full * (LAYERS - LOCAL) * block_bytes + peak_window * LOCAL * block_bytes;
    let decoding = peak_full * (LAYERS - LOCAL) * block_bytes + decode_window * LOCAL * block_bytes;
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    println!(
        "32k-token gpt-oss-20b-shaped sequence ({steps} steps): full attention {:.1} MiB; \
         window pool {:.1} MiB at its peak (prefill chunks of {budget}: {peak_window} window \
         blocks), {:.1} MiB decoding ({decode_window} window blocks): {:.3} and {:.3} of full",
        mib(full_attention),
        mib(windowed),
        mib(decoding),
        windowed as f64 / full_attention as f64,
        decoding as f64 / full_attention as f64,
    );
    assert_eq!(peak_full, num_blocks);
    assert!(peak_window <= window_blocks);
    // A decode step's window: 128 keys over at most 9 blocks of 16, and its new token's.
    assert!(decode_window <= WINDOW.div_ceil(bs) + 1, "{decode_window}");
    // Decoding, the local layers hold 9 blocks against 2052: about half of full attention;
    // a prefill chunk's 2048 new tokens sit in the window pool during their step.
    assert!(decoding * 1000 < full_attention * 505);
    assert!(windowed * 1000 < full_attention * 535);
}
