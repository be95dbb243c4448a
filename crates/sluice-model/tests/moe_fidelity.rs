//! Mixtures of experts against llama.cpp (an independent implementation) on the same files:
//! the tiny random-weight qwen3moe, qwen2moe and Mixtral models that
//! `scripts/make-moe-models.sh` writes with the PyPI `gguf` package (F32 and Q8_0) and
//! llama.cpp's `llama-quantize` (Q4_K_M, and that file dequantized back to F32), whose greedy
//! tokens and top-5 logprobs llama.cpp's server recorded in `tests/fixtures/moe/`
//! (`scripts/moe-fixtures.sh`, with an f32 KV cache and flash attention off: its attention is
//! then f32 throughout, as sluice's is with an f32 cache, which these tests load).
//!
//! Compared by the fixtures' rule (`tests/fixtures/README.md`): equal tokens until the first
//! disagreement, where each side's choice is in the other's top five. Where both sides compute
//! in f32 (the F32 files; `exact` on the Q4_K_M file against llama.cpp's F32 run of its
//! dequantized copy) the rule is tighter: every token, logprobs within `TINY_F32_TOLERANCE`, a
//! disagreement only at a near-tie of llama.cpp's own top two (`TINY_NEAR_TIE`). On quantized
//! files both sides round activations to int8 (llama.cpp's Q8_0/Q8_K blocks, number for
//! number), and these random models amplify a rounding that differs by one ulp (summation
//! order) into tenths of a nat later on: there the rule alone holds, and every row's first
//! token must agree. Without the files the tests say that they skipped and which script makes
//! them (scripts/test.sh runs it, so CI does).

mod common;

use std::path::PathBuf;

use common::fidelity::check_tiny_file;
use sluice_model::testing::optional_model;
use sluice_model::WeightsKind;

const ARCHS: [&str; 3] = ["qwen3moe", "qwen2moe", "mixtral"];

fn model(name: &str) -> Option<PathBuf> {
    optional_model(&format!("tiny-moe/{name}"), "scripts/make-moe-models.sh")
}

/// Every row of `fixture` against `file` served with `weights` (`check_tiny_file`).
fn check(file: &str, fixture: &str, weights: WeightsKind, in_f32: bool) {
    let Some(path) = model(file) else { return };
    check_tiny_file(&path, &format!("moe/{fixture}"), weights, in_f32, |model| {
        assert!(model.config().moe.is_some(), "{file}: not a mixture")
    });
}

/// F32 files: f32's arithmetic on both sides, `auto` (f32 panels) and `exact` alike.
#[test]
fn f32_files_match_llama_cpp() {
    for arch in ARCHS {
        for weights in [WeightsKind::Auto, WeightsKind::Exact] {
            let fixture = format!("{arch}-f32-greedy.jsonl");
            check(&format!("{arch}-f32.gguf"), &fixture, weights, true);
        }
    }
}

/// The Q4_K_M file under `exact` (its K-quant experts dequantized in registers, f32's
/// arithmetic) against llama.cpp's F32 run of the file llama-quantize dequantized from it:
/// the experts' blocks are read as llama.cpp reads them.
#[test]
fn q4_k_m_files_in_f32_match_llama_cpp_on_their_dequantized_copy() {
    for arch in ARCHS {
        let fixture = format!("{arch}-q4_k_m-f32-greedy.jsonl");
        check(
            &format!("{arch}-q4_k_m.gguf"),
            &fixture,
            WeightsKind::Exact,
            true,
        );
    }
}

/// Q8_0 files: llama.cpp's integer arithmetic (activations in Q8_0 blocks) on both sides
/// under `auto`.
#[test]
fn q8_0_files_match_llama_cpp() {
    for arch in ARCHS {
        let fixture = format!("{arch}-q8_0-greedy.jsonl");
        check(
            &format!("{arch}-q8_0.gguf"),
            &fixture,
            WeightsKind::Auto,
            false,
        );
    }
}

/// Q4_K_M files as llama-quantize wrote them (Q4_K experts, Q6_K where it gives more bits):
/// the K-quants' integer arithmetic (activations in Q8_K blocks) under `auto`.
#[test]
fn q4_k_m_files_match_llama_cpp() {
    for arch in ARCHS {
        let fixture = format!("{arch}-q4_k_m-greedy.jsonl");
        check(
            &format!("{arch}-q4_k_m.gguf"),
            &fixture,
            WeightsKind::Auto,
            false,
        );
    }
}

/// gpt-oss (biases everywhere, sinks, a window of 16 keys on every other layer, YaRN, the top
/// k's softmax and the clamped SwiGLU) in F32: f32's arithmetic on both sides, over prompts
/// that cross the window up to 19 times.
#[test]
fn gpt_oss_f32_file_matches_llama_cpp() {
    for weights in [WeightsKind::Auto, WeightsKind::Exact] {
        check(
            "gpt-oss-f32.gguf",
            "gpt-oss-f32-greedy.jsonl",
            weights,
            true,
        );
    }
}

/// gpt-oss with its experts in MXFP4, as the real files hold them: under `exact` (the blocks
/// dequantized in registers, f32's arithmetic) it is the F32 file's model, whose experts are
/// rounded to MXFP4's grid, so llama.cpp's F32 run is the oracle; under `auto` both sides
/// multiply the blocks' integers by int8 activations.
#[test]
fn gpt_oss_mxfp4_file_matches_llama_cpp() {
    check(
        "gpt-oss-mxfp4.gguf",
        "gpt-oss-f32-greedy.jsonl",
        WeightsKind::Exact,
        true,
    );
    check(
        "gpt-oss-mxfp4.gguf",
        "gpt-oss-mxfp4-greedy.jsonl",
        WeightsKind::Auto,
        false,
    );
}
