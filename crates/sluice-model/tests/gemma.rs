//! Gemma 3 270M (gemma3: a SentencePiece vocabulary of 262,144 pieces, local and global layers,
//! "Q4_K_M": Q5_0, Q8_0, Q4_K and Q6_K matrices) against llama.cpp on the same weights, by the
//! rule of `tests/fixtures/README.md`: its tokenizer on 40 tricky strings, greedy completions
//! (one prompt of 598 tokens crosses the local layers' window of 512), chat prompts rendered
//! with Gemma's template; and batching that changes no token of 24 sequences. Skips (saying so)
//! without `scripts/fetch-gemma.sh`'s model; CI fetches it.

mod common;

use std::sync::OnceLock;
use std::time::Instant;

use common::decode::{assert_batching_changes_no_token, greedy_alone};
use common::fidelity::{check_agreement, compare_with_fixture, Expect};
use sluice_model::testing::optional_model;
use sluice_model::{Architecture, LlamaModel, WeightsKind};
use sluice_tokenizer::Tokenizer;

const GGUF: &str = "gemma-3-270m-q4_k_m.gguf";
const FETCH: &str = "scripts/fetch-gemma.sh";

/// The model as `kind` holds it, loaded once for every test of this binary.
fn model(kind: WeightsKind) -> Option<&'static LlamaModel> {
    static EXACT: OnceLock<LlamaModel> = OnceLock::new();
    static AUTO: OnceLock<LlamaModel> = OnceLock::new();
    let path = optional_model(GGUF, FETCH)?;
    let cell = match kind {
        WeightsKind::Exact => &EXACT,
        WeightsKind::Auto => &AUTO,
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

#[test]
fn the_file_reads_as_gemma3_with_its_layer_pattern() {
    let Some(model) = model(WeightsKind::Auto) else {
        return;
    };
    let c = model.config();
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!((c.num_layers, c.hidden_size, c.head_dim), (18, 640, 256));
    let window = c.sliding_window.as_ref().expect("gemma3 has local layers");
    assert_eq!(window.window, 512);
    // No pattern key in the file: llama.cpp's default, five local layers then a global one.
    let global: Vec<usize> = (0..c.num_layers)
        .filter(|&i| c.window_of_layer(i).is_none())
        .collect();
    assert_eq!(global, [5, 11, 17]);
    assert_eq!(window.local_rope_theta, 10_000.0);
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert_eq!(c.query_scale(), 1.0 / 16.0);
    assert_eq!(c.final_logit_softcap, None);
    assert!(c.tie_word_embeddings);
}

#[test]
fn tokenizer_matches_llama_cpp_on_40_strings() {
    let Some(tok) = tokenizer() else {
        return;
    };
    assert_eq!(tok.bos_token_id(), Some(2));
    assert!(tok.add_bos_token());
    // `<eos>` and `<end_of_turn>` both end a generation (a chat turn ends with the latter).
    let end_of_turn = tok.token_to_id("<end_of_turn>").unwrap();
    assert_eq!(end_of_turn, 106);
    assert!(
        tok.eos_token_ids().contains(&1) && tok.eos_token_ids().contains(&end_of_turn),
        "{:?}",
        tok.eos_token_ids()
    );
    let rows = common::read_jsonl("gemma3-270m-tokenize.jsonl");
    assert_eq!(rows.len(), 40);
    for row in &rows {
        let text = row["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text).unwrap(),
            common::ids(&row["ids"]),
            "{text:?}"
        );
    }
}

/// Plain completions, then chat rows (their `prompt_ids` are Gemma's template as llama.cpp
/// renders it, BOS included).
fn fixture_rows() -> Vec<serde_json::Value> {
    let mut rows = common::read_jsonl("gemma3-270m-greedy.jsonl");
    rows.extend(common::read_jsonl("gemma3-270m-chat-greedy.jsonl"));
    rows
}

#[test]
fn fixture_prompts_encode_as_llama_cpp_evaluated_them() {
    let Some(tok) = tokenizer() else {
        return;
    };
    for row in fixture_rows() {
        let prompt = row["prompt"].as_str().unwrap();
        assert_eq!(
            tok.encode_prompt(prompt).unwrap(),
            common::ids(&row["prompt_ids"]),
            "{prompt:?}"
        );
    }
}

/// Logprobs of agreeing tokens, as for the other models' f32 runs. Measured (2026-11-28, 400
/// of 400 tokens agreeing): largest gap 0.0064, though llama.cpp's GELU reads an f16 table
/// (`ggml_vec_gelu_f32` rounds its input to f16) where ours computes the tanh formula in f32.
const LOGPROB_TOLERANCE: f32 = 1e-2;

/// `auto`'s int8 activations (the K-quant and legacy matrices as llama.cpp's quantized kernels
/// compute them) against llama.cpp's f32 run: as the other models' quantized bound.
const ROUNDED_LOGPROB_TOLERANCE: f32 = 0.35;

fn matches_llama_cpp(kind: WeightsKind, tolerance: f32, expect: Expect) {
    let Some(model) = model(kind) else {
        return;
    };
    let started = Instant::now();
    let (mut agreed, mut total) = (0, 0);
    for row in &fixture_rows() {
        let a = compare_with_fixture(model, row, tolerance);
        check_agreement(&a, expect, &format!("{kind}, {}", row["prompt"]));
        let len = row["ids"].as_array().unwrap().len();
        eprintln!(
            "{kind}: {}/{len} tokens agree, logprobs within {:.4}{}, for {:.60?}",
            a.agreed,
            a.max_logprob_diff,
            a.divergence_margin
                .map(|m| format!(", diverged where llama.cpp's top two stood {m:.4} apart"))
                .unwrap_or_default(),
            row["prompt"].as_str().unwrap()
        );
        agreed += a.agreed;
        total += len;
    }
    eprintln!(
        "{kind}: {agreed}/{total} greedy tokens identical to llama.cpp before any divergence ({:.1?})",
        started.elapsed()
    );
}

/// `exact`: f32's results (each quantized block dequantized in registers), as llama.cpp's f32
/// run on the dequantized file: every token, up to genuine near-ties.
#[test]
fn greedy_matches_llama_cpp_exact() {
    matches_llama_cpp(
        WeightsKind::Exact,
        LOGPROB_TOLERANCE,
        Expect::F32 { near_tie: 5e-2 },
    );
}

#[test]
fn greedy_matches_llama_cpp_auto() {
    // The question's first token is a near-tie in llama.cpp's own run (" The" -1.589, " Paris"
    // -1.659), which int8 activations may decide either way.
    matches_llama_cpp(
        WeightsKind::Auto,
        ROUNDED_LOGPROB_TOLERANCE,
        Expect::RoundedNearTie { near_tie: 0.1 },
    );
}

/// The base model, asked as a question, names Paris (llama.cpp's greedy completion of "The
/// capital of France is" goes on about "the capital of the country of France" instead, with
/// " Paris" third at its first step: both implementations say so).
#[test]
fn a_question_about_france_is_answered_with_paris() {
    let (Some(model), Some(tok)) = (model(WeightsKind::Auto), tokenizer()) else {
        return;
    };
    let prompt = tok
        .encode_prompt("Q: What is the capital of France?\nA:")
        .unwrap();
    let out = greedy_alone(model, &prompt, 8, tok.eos_token_ids());
    let text = tok.decode(&out, true);
    assert!(text.contains("Paris"), "{text:?}");
}

/// 24 sequences decoded together give exactly the greedy tokens each gives alone, the longest
/// prompt past the local layers' window, so their windows slide while others prefill.
#[test]
fn batching_changes_no_token_of_24_sequences() {
    let (Some(model), Some(tok)) = (model(WeightsKind::Auto), tokenizer()) else {
        return;
    };
    let mut prompts: Vec<Vec<u32>> = fixture_rows()
        .iter()
        .map(|r| common::ids(&r["prompt_ids"]))
        .collect();
    for p in [
        "import numpy as np\n",
        "The three primary colors are",
        "<start_of_turn>user\nWrite a haiku about Rust.<end_of_turn>\n<start_of_turn>model\n",
        "1, 1, 2, 3, 5, 8, 13,",
        "Once upon a time, in a land far away,",
        "def is_palindrome(s: str) -> bool:\n",
        "SELECT COUNT(*) FROM orders WHERE",
        "x",
        "Translate to French: Good morning, how are you?\n",
        "fn fib(n: u64) -> u64 {\n    match n {\n",
        "The quick brown fox",
    ] {
        prompts.push(tok.encode_prompt(p).unwrap());
    }
    assert_eq!(prompts.len(), 24);
    let max_new = 10;
    let (alone, alone_time, together_time) =
        assert_batching_changes_no_token(model, &prompts, max_new, tok.eos_token_ids(), |t| {
            tok.decode(t, false)
        });
    eprintln!(
        "24 sequences of up to {max_new} tokens: {alone_time:.1?} one at a time, {together_time:.1?} together"
    );
    let full = alone.iter().filter(|a| a.len() == max_new).count();
    assert!(
        full >= 12,
        "only {full} of 24 sequences ran {max_new} tokens"
    );
}
