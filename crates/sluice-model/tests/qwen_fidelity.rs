//! Qwen2.5-Coder-0.5B-Instruct (qwen2, "Q4_K_M": Q5_0, Q8_0, Q4_K and Q6_K matrices) against
//! llama.cpp on the same weights, by the rule of `tests/fixtures/README.md`, and batching
//! that changes no token of 32 sequences. Skips (saying so) without `scripts/fetch-qwen.sh`'s
//! model; CI fetches it.

mod common;

use std::sync::OnceLock;
use std::time::Instant;

use common::decode::assert_batching_changes_no_token;
use common::fidelity::{check_agreement, compare_with_fixture, Expect};
use sluice_model::testing::optional_model;
use sluice_model::{LlamaModel, WeightsKind};
use sluice_tokenizer::Tokenizer;

const GGUF: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const FETCH: &str = "scripts/fetch-qwen.sh";

/// The model as `kind` holds it, loaded once for every test of this binary (a load takes
/// seconds, and the f32 copy 2.5 GB).
fn model(kind: WeightsKind) -> Option<&'static LlamaModel> {
    static F32: OnceLock<LlamaModel> = OnceLock::new();
    static AUTO: OnceLock<LlamaModel> = OnceLock::new();
    static QUANTIZED: OnceLock<LlamaModel> = OnceLock::new();
    let path = optional_model(GGUF, FETCH)?;
    let cell = match kind {
        WeightsKind::F32 => &F32,
        WeightsKind::Auto => &AUTO,
        WeightsKind::Quantized => &QUANTIZED,
        other => panic!("this binary does not test {other} weights"),
    };
    Some(common::load_once(cell, &path, kind))
}

fn tokenizer() -> Option<&'static Tokenizer> {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    Some(common::tokenizer_once(
        &TOKENIZER,
        &optional_model(GGUF, FETCH)?,
    ))
}

/// Plain completions, then chat rows (their `prompt_ids` are the prompt llama.cpp rendered with
/// the file's template, default system message included).
fn fixture_rows() -> Vec<serde_json::Value> {
    let mut rows = common::read_jsonl("qwen2.5-coder-0.5b-greedy.jsonl");
    rows.extend(common::read_jsonl("qwen2.5-coder-0.5b-chat-greedy.jsonl"));
    rows
}

/// The README's bound on logprobs of agreeing tokens, as for SmolLM2: both sides compute in f32
/// from the same dequantized weights. Measured (2026-11-22, f32 and auto alike, all 297 tokens
/// agreeing): largest gap 0.0113 ("The capital of France is", step 27), over the bound, because
/// the loader re-quantizes to Q8_0 the fused QKV of the 12 layers whose V is stored in another
/// format than Q and K (`weights.rs` `concat_rows`), which llama.cpp does not. With those Q, K
/// and V handed over in f32 instead, the largest gap is 0.0040 (0.0005 to 0.0040 per row).
const LOGPROB_TOLERANCE: f32 = 1e-2;

/// The bound for `quantized`, whose activations are rounded to int8 (per 32 for the Q5_0 and
/// Q8_0 matrices, per 256 for the K-quants) as llama.cpp's own quantized kernels round them,
/// while the fixtures come from its f32 run: as SmolLM2's quantized bound (`fidelity.rs`).
const QUANTIZED_LOGPROB_TOLERANCE: f32 = 0.35;

/// Every fixture row by the README's rule, logprobs of agreeing tokens within `tolerance`.
fn matches_llama_cpp(kind: WeightsKind, tolerance: f32) {
    let Some(model) = model(kind) else {
        return;
    };
    let started = Instant::now();
    let rows = fixture_rows();
    let (mut agreed, mut total) = (0, 0);
    for row in &rows {
        let a = compare_with_fixture(model, row, tolerance);
        // f32 weights compute as llama.cpp's f32 run; the int8 kinds round their activations.
        let expect = match kind {
            WeightsKind::F32 => Expect::F32 { near_tie: 1e-2 },
            _ => Expect::Rounded,
        };
        check_agreement(&a, expect, &format!("{kind}, {}", row["prompt"]));
        let len = row["ids"].as_array().unwrap().len();
        eprintln!(
            "{kind}: {}/{len} tokens agree, logprobs within {:.4}, for {:?}",
            a.agreed, a.max_logprob_diff, row["prompt"]
        );
        agreed += a.agreed;
        total += len;
    }
    eprintln!(
        "{kind}: {agreed}/{total} greedy tokens identical to llama.cpp before any divergence ({:.1?})",
        started.elapsed()
    );
}

#[test]
fn greedy_matches_llama_cpp_f32() {
    matches_llama_cpp(WeightsKind::F32, LOGPROB_TOLERANCE);
}

/// `auto` as it serves: its K-quant matrices (Q4_K, Q6_K) in int8 as `quantized` computes
/// them (and as llama.cpp's own CPU kernels do), its Q5_0 and Q8_0 ones as exact panels; so
/// `quantized`'s bound against the fixtures, which come from llama.cpp's f32 run.
#[test]
fn greedy_matches_llama_cpp_auto() {
    matches_llama_cpp(WeightsKind::Auto, QUANTIZED_LOGPROB_TOLERANCE);
}

/// `quantized`: int8 activations against every matrix's blocks (our kernels for Q5_0, Q8_0,
/// Q4_K and Q6_K alike).
#[test]
fn greedy_matches_llama_cpp_quantized() {
    matches_llama_cpp(WeightsKind::Quantized, QUANTIZED_LOGPROB_TOLERANCE);
}

/// Prompts for the batching test beside the fixtures': code, prose, chat markup, one token
/// and a few hundred, so sequences of very different lengths share steps.
const PROMPTS: &[&str] = &[
    "import numpy as np\n",
    "class Stack:\n    def __init__(self):\n",
    "// Binary search in Rust\nfn binary_search(xs: &[i32], x: i32) -> Option<usize> {\n",
    "<|im_start|>user\nWrite a haiku about Rust.<|im_end|>\n<|im_start|>assistant\n",
    "The three primary colors are",
    "#include <stdio.h>\n\nint main(void) {\n",
    "def quicksort(xs):\n    \"\"\"Sort xs.\"\"\"\n",
    "SELECT COUNT(*) FROM orders WHERE",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n",
    "<!DOCTYPE html>\n<html>\n<head>\n",
    "x",
    "Once upon a time, in a land far away,",
    "const add = (a, b) =>",
    "# TODO: parse the config file\ndef load_config(path):\n",
    "fn fib(n: u64) -> u64 {\n    match n {\n",
    "1, 1, 2, 3, 5, 8, 13,",
    "public class Hello {\n    public static void main(String[] args) {\n",
    "def is_palindrome(s: str) -> bool:\n",
    "Translate to French: Good morning, how are you?\n",
    "async function fetchJson(url) {\n",
    "    return",
    "a = [1, 2, 3]\nb = [x * 2 for x in a]\nprint(",
    "The quick brown fox",
    "#!/bin/bash\n# Count lines in every .rs file\n",
];

/// 32 sequences decoded together give exactly the greedy tokens each gives alone. Together,
/// a quarter join at each of the first four steps, so prefills share steps with decodes, and
/// blocks are not in order: the engine's steps look like that.
#[test]
fn batching_changes_no_token_of_32_sequences() {
    batching_changes_no_token(WeightsKind::Auto);
}

/// The same with int8 activations: each row is quantized alone, and each output's integer
/// sums and float steps are the same whether its row is alone or one of eight in a tile.
#[test]
fn batching_changes_no_token_of_32_sequences_quantized() {
    batching_changes_no_token(WeightsKind::Quantized);
}

fn batching_changes_no_token(kind: WeightsKind) {
    let (Some(model), Some(tok)) = (model(kind), tokenizer()) else {
        return;
    };
    let mut prompts: Vec<Vec<u32>> = fixture_rows()
        .iter()
        .map(|r| common::ids(&r["prompt_ids"]))
        .collect();
    // A long prompt: several blocks, and a prefill far larger than the decode rows beside it.
    let long = "def f(x):\n    return x\n".repeat(40);
    prompts.push(tok.encode(&long).unwrap());
    prompts.extend(PROMPTS.iter().map(|p| tok.encode(p).unwrap()));
    assert_eq!(prompts.len(), 32);
    let eos = tok.eos_token_ids();
    let max_new = 10;

    let (alone, alone_time, together_time) =
        assert_batching_changes_no_token(model, &prompts, max_new, eos, |t| tok.decode(t, false));
    eprintln!(
        "32 sequences of up to {max_new} tokens: {alone_time:.1?} one at a time, {together_time:.1?} together"
    );
    // Greedy sequences that all stop at once would hide little; make sure most ran full length.
    let full = alone.iter().filter(|a| a.len() == max_new).count();
    assert!(
        full >= 16,
        "only {full} of 32 sequences ran {max_new} tokens"
    );
}
