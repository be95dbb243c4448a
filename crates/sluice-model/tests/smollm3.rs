//! SmolLM3: what its layers without RoPE do, on tiny models written here (a SmolLM3 of three
//! layers is llama exactly; of four, it is not, and only from the fourth layer on); then
//! against llama.cpp (an independent implementation) on the same files: the tiny
//! random-weight SmolLM3 (4 layers, of which the last, layer 3, attends without RoPE) that
//! `scripts/make-smollm3-models.sh` writes with the PyPI `gguf` package (F32 and Q8_0) and
//! llama.cpp's `llama-quantize` (Q4_K_M, and that file dequantized back to F32), whose greedy
//! tokens and top-5 logprobs llama.cpp's server recorded in `tests/fixtures/smollm3/`
//! (`scripts/smollm3-fixtures.sh`, with an f32 KV cache and flash attention off, as for the
//! mixtures of `moe_fidelity.rs`).
//!
//! The rules of `moe_fidelity.rs`: where both sides compute in f32 (the F32 files; `exact` on
//! the quantized files against llama.cpp's F32 run of the same numbers) every token, logprobs
//! within `TINY_F32_TOLERANCE`, a disagreement only at a near-tie of llama.cpp's own top two
//! (`TINY_NEAR_TIE`); on quantized files under `auto` both sides round activations to int8, and
//! the rule alone holds, with every row's first token equal. Without the files the tests say
//! that they skipped and which script makes them (scripts/test.sh runs it, so CI does).

mod common;

use std::path::PathBuf;

use common::fidelity::check_tiny_file;
use common::prefill_logit_bits;
use sluice_model::arch::Rotary;
use sluice_model::testing::{optional_model, TinyModelSpec};
use sluice_model::{Architecture, LlamaModel, LoadOptions, WeightsKind};

fn model(name: &str) -> Option<PathBuf> {
    optional_model(
        &format!("tiny-smollm3/{name}"),
        "scripts/make-smollm3-models.sh",
    )
}

/// Every row of `fixture` against `file` served with `weights` (`check_tiny_file`).
fn check(file: &str, fixture: &str, weights: WeightsKind, in_f32: bool) {
    let Some(path) = model(file) else { return };
    check_tiny_file(
        &path,
        &format!("smollm3/{fixture}"),
        weights,
        in_f32,
        |model| {
            assert_eq!(
                model.config().architecture.name(),
                "smollm3",
                "{file}: not read as SmolLM3"
            )
        },
    );
}

/// The F32 file: f32's arithmetic on both sides, `auto` (f32 panels) and `exact` alike.
#[test]
fn f32_file_matches_llama_cpp() {
    for weights in [WeightsKind::Auto, WeightsKind::Exact] {
        check(
            "smollm3-f32.gguf",
            "smollm3-f32-greedy.jsonl",
            weights,
            true,
        );
    }
}

/// The Q4_K_M file dequantized back to F32 by llama-quantize: f32's arithmetic on both sides.
#[test]
fn q4_k_m_f32_file_matches_llama_cpp() {
    for weights in [WeightsKind::Auto, WeightsKind::Exact] {
        check(
            "smollm3-q4_k_m-f32.gguf",
            "smollm3-q4_k_m-f32-greedy.jsonl",
            weights,
            true,
        );
    }
}

/// The quantized files under `exact` (their blocks dequantized in registers, f32's
/// arithmetic) against llama.cpp's F32 run of the same numbers: the Q8_0 file is the F32
/// file's model (its matrices are rounded to Q8_0's grid), and the Q4_K_M file's blocks are
/// read as llama.cpp reads them for its dequantized copy.
#[test]
fn quantized_files_in_f32_match_llama_cpp_on_their_dequantized_copy() {
    check(
        "smollm3-q8_0.gguf",
        "smollm3-f32-greedy.jsonl",
        WeightsKind::Exact,
        true,
    );
    check(
        "smollm3-q4_k_m.gguf",
        "smollm3-q4_k_m-f32-greedy.jsonl",
        WeightsKind::Exact,
        true,
    );
}

/// The Q8_0 file: llama.cpp's integer arithmetic (activations in Q8_0 blocks) on both sides
/// under `auto`.
#[test]
fn q8_0_file_matches_llama_cpp() {
    check(
        "smollm3-q8_0.gguf",
        "smollm3-q8_0-greedy.jsonl",
        WeightsKind::Auto,
        false,
    );
}

/// The Q4_K_M file as llama-quantize wrote it (Q4_K, Q6_K where it gives more bits): the
/// K-quants' integer arithmetic (activations in Q8_K blocks) under `auto`.
#[test]
fn q4_k_m_file_matches_llama_cpp() {
    check(
        "smollm3-q4_k_m.gguf",
        "smollm3-q4_k_m-greedy.jsonl",
        WeightsKind::Auto,
        false,
    );
}

/// The logits bits of every position of a 23-token prompt of the model `spec` writes.
fn prefill_logits(spec: &TinyModelSpec, name: &str) -> Vec<Vec<u32>> {
    let dir = std::env::temp_dir().join(format!("sluice-smollm3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    spec.write_gguf(&path).unwrap();
    let model = LlamaModel::load(&path, &LoadOptions::default()).unwrap();
    let tokens: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 200).collect();
    prefill_logit_bits(&model, &tokens)
}

#[test]
fn only_every_fourth_layer_goes_without_rope() {
    let tiny = |architecture, num_layers| TinyModelSpec {
        architecture,
        num_layers,
        ..TinyModelSpec::default()
    };
    // The same weights (the writer's draws depend on the seed and the tensor names only).
    let three = prefill_logits(&tiny(Architecture::SmolLm3, 3), "smollm3-3");
    assert_eq!(
        three,
        prefill_logits(&tiny(Architecture::Llama, 3), "llama-3"),
        "three SmolLM3 layers all rotate: llama's logits, bit for bit"
    );
    let spec = tiny(Architecture::SmolLm3, 4);
    let path =
        std::env::temp_dir().join(format!("sluice-smollm3-plan-{}.gguf", std::process::id()));
    spec.write_gguf(&path).unwrap();
    let model = LlamaModel::load(&path, &LoadOptions::default()).unwrap();
    let plans: Vec<Rotary> = (0..4)
        .map(|i| model.config().layer_plan(i).rotary)
        .collect();
    assert_eq!(
        plans,
        [Rotary::Global, Rotary::Global, Rotary::Global, Rotary::None]
    );
    let four = prefill_logits(&spec, "smollm3-4");
    let llama = prefill_logits(&tiny(Architecture::Llama, 4), "llama-4");
    assert_eq!(
        four[0], llama[0],
        "position 0 rotates by nothing either way"
    );
    let differ = (1..four.len()).filter(|&p| four[p] != llama[p]).count();
    assert_eq!(
        differ,
        four.len() - 1,
        "a fourth layer without RoPE changes every later position's logits"
    );
}
