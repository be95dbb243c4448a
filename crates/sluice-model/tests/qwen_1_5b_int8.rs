//! Qwen2.5-Coder-1.5B-Instruct (Q4_K_M: Q4_K and Q6_K matrices, k of 1536 and 8960) with
//! `amx_int8`, every step on AMX tiles (`amx_min_rows` 1): its K-quant matrices multiply int8
//! activations on int8 tiles. Skips (saying so) without `scripts/fetch-qwen-1.5b.sh`'s model
//! or without AMX-INT8 on this CPU.

mod common;

use std::sync::OnceLock;
use std::time::Instant;

use common::decode::{assert_batching_changes_no_token, greedy_alone};
use common::python::assert_fibonacci_body;
use sluice_model::{LlamaModel, LoadOptions, ModelSource, WeightsKind};
use sluice_tokenizer::Tokenizer;

const GGUF: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
const FETCH: &str = "scripts/fetch-qwen-1.5b.sh";

/// The model with every step on int8 tiles, and its tokenizer; `None` (said why) where the
/// model or the CPU's int8 tiles are missing.
fn model() -> Option<&'static (LlamaModel, Tokenizer)> {
    static MODEL: OnceLock<(LlamaModel, Tokenizer)> = OnceLock::new();
    if !sluice_kernels::cpu::amx::int8_available() {
        eprintln!(
            "skipped: no AMX-INT8 (or AVX-512 VBMI) on this CPU, `amx_int8` does nothing here"
        );
        return None;
    }
    let path = common::optional_model(GGUF, FETCH)?;
    Some(MODEL.get_or_init(|| {
        let started = Instant::now();
        let options = LoadOptions {
            weights: WeightsKind::Auto,
            amx_min_rows: Some(1),
            amx_int8: true,
            ..LoadOptions::default()
        };
        let mut source = ModelSource::open(&path).unwrap();
        let tokenizer = source.tokenizer().unwrap();
        let model = source.load_model(&options).unwrap();
        eprintln!(
            "auto weights with amx_int8 loaded in {:.1?}",
            started.elapsed()
        );
        (model, tokenizer)
    }))
}

/// Every K-quant matrix is on int8 tiles: Q, K and V (fused), O, gate and up, down, per layer,
/// and the lm_head.
#[test]
fn every_k_quant_matrix_takes_the_int8_tiles() {
    let Some((model, _)) = model() else {
        return;
    };
    let (int8, all) = model.int8_tile_matrices();
    assert!(all > 28 * 4, "{all} matrices");
    assert_eq!(int8, all, "{int8} of {all} matrices on int8 tiles");
}

/// A coherent greedy continuation with the activations rounded to int8: a Python body that
/// returns, recursing or using `n`.
#[test]
fn fibonacci_continues_with_python() {
    let Some((model, tok)) = model() else {
        return;
    };
    let prompt = "def fibonacci(n):";
    let ids = tok.encode_prompt(prompt).unwrap();
    let started = Instant::now();
    let out = greedy_alone(model, &ids, 48, tok.eos_token_ids());
    let text = format!("{prompt}{}", tok.decode(&out, true));
    eprintln!(
        "{text}\n({} tokens in {:.1?})",
        out.len(),
        started.elapsed()
    );
    assert_fibonacci_body(&text);
}

/// Eight sequences decoded together (joining over four steps, so prefills share steps with
/// decodes) give exactly the greedy tokens each gives alone: each row is quantized alone and
/// its integer sums and float steps do not depend on the rows beside it.
#[test]
fn batching_changes_no_token() {
    let Some((model, tok)) = model() else {
        return;
    };
    let prompts: Vec<Vec<u32>> = [
        "def is_prime(n: int) -> bool:\n",
        "The capital of France is",
        "// Binary search in Rust\nfn binary_search(xs: &[i32], x: i32) -> Option<usize> {\n",
        "SELECT name, COUNT(*) FROM",
        "import numpy as np\n\ndef softmax(x):\n",
        "Once upon a time",
        "#include <stdio.h>\n\nint main(void) {\n",
        "x",
    ]
    .iter()
    .map(|p| tok.encode(p).unwrap())
    .collect();
    let (eos, max_new) = (tok.eos_token_ids(), 8);
    let (alone, _, _) =
        assert_batching_changes_no_token(model, &prompts, max_new, eos, |t| tok.decode(t, false));
    assert!(alone.iter().filter(|a| a.len() == max_new).count() >= 4);
}
