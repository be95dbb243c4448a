//! A LoRA adapter against llama.cpp (an independent implementation): the default model,
//! SmolLM2-135M-Instruct Q4_1, with the random rank-16 adapter of `scripts/tiny-lora.py` on all
//! seven projections of every layer, as llama.cpp's server runs it with `--lora` on the F32
//! file dequantized from the Q4_1 one (`tests/fixtures/lora/`): greedy tokens and top-5
//! logprobs compared by the fixtures' rule, and teacher-forced on every fixture token.
//! The adapter's PEFT copy gives the GGUF copy's logits bit for bit. Without the adapter files
//! the tests say that they skipped and which script makes them (scripts/test.sh runs it, so CI
//! does).

mod common;

use std::sync::Arc;

use common::fidelity::{
    check_agreement, compare_with_fixture_under, greedy_steps_with_adapter, Expect,
};
use sluice_model::testing::optional_model;
use sluice_model::{KvDtype, LlamaModel, LoadOptions, WeightsKind};

const MAX_RANK: usize = 64;
/// Both sides in f32: agreeing tokens' logprobs within this, a divergence only at a near-tie.
const F32_TOLERANCE: f32 = 1e-2;
const NEAR_TIE: f32 = 1e-2;
/// Largest logprob difference of an agreeing token where one side rounds activations to int8
/// (as `tests/fidelity.rs` allows the base model).
const QUANTIZED_TOLERANCE: f32 = 0.35;
/// Largest teacher-forced logprob difference (every fixture step, also past a divergence, in
/// flat distributions) where one side rounds activations to int8. Measured: two orders of the
/// f32 update that agree within 5e-5 in f32 moved these logprobs by up to 0.55 under `auto`
/// (int8 rounding flips, amplified by this strong random adapter), so a bound below that would
/// test the luck of the rounding, not the update; the update itself is held to 1e-2 in f32.
const QUANTIZED_TEACHER_FORCED_TOLERANCE: f32 = 0.6;

/// The base model with the GGUF adapter in slot 1 and its PEFT copy in slot 2.
fn model(weights: WeightsKind) -> Option<LlamaModel> {
    let gguf = optional_model("lora/smollm2-r16.gguf", "scripts/make-lora-adapters.sh")?;
    let peft = optional_model(
        "lora/smollm2-r16-peft/adapter_model.safetensors",
        "scripts/make-lora-adapters.sh",
    )?;
    let mut model = LlamaModel::load(
        common::model_path(),
        &LoadOptions {
            weights,
            kv_dtype: KvDtype::F32,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let from_gguf = model.load_adapter(&gguf, MAX_RANK).unwrap();
    let from_peft = model
        .load_adapter(peft.parent().unwrap(), MAX_RANK)
        .unwrap();
    assert_eq!((from_gguf.rank(), from_gguf.scale()), (16, 2.0));
    model.set_adapter(1, Some(Arc::new(from_gguf))).unwrap();
    model.set_adapter(2, Some(Arc::new(from_peft))).unwrap();
    Some(model)
}

/// `tol` bounds the logprobs of greedy tokens that agree, `forced_tol` those teacher-forced on
/// every fixture step.
fn check(weights: WeightsKind, tol: f32, forced_tol: f32, expect: Expect) {
    let Some(model) = model(weights) else { return };
    let (mut agreed, mut total, mut worst) = (0, 0, 0f32);
    for row in common::read_jsonl("lora/smollm2-r16-greedy.jsonl") {
        let a = compare_with_fixture_under(&model, &row, tol, 1);
        check_agreement(&a, expect, &format!("{weights}: {}", row["prompt"]));
        agreed += a.agreed;
        total += row["ids"].as_array().unwrap().len();
        worst = worst.max(a.max_logprob_diff);
        // The PEFT copy: the same numbers in Hugging Face's row order.
        let prompt = common::ids(&row["prompt_ids"]);
        let forced = common::ids(&row["ids"]);
        let tops = |slot| -> Vec<Vec<(u32, u32)>> {
            greedy_steps_with_adapter(&model, &prompt, &forced, slot)
                .into_iter()
                .map(|s| s.top5.iter().map(|&(t, l)| (t, l.to_bits())).collect())
                .collect()
        };
        assert!(
            tops(1) == tops(2),
            "{}: GGUF and PEFT copies differ",
            row["prompt"]
        );
    }
    eprintln!(
        "LoRA under {weights}: {agreed}/{total} greedy tokens identical to llama.cpp's --lora \
         before any divergence, largest logprob difference {worst}"
    );
    // Teacher-forced on the fixture's tokens, every step: the adapted model's logprob of
    // llama.cpp's token is within the tolerance, and (in f32, where the bound is tight) the base
    // model's is not: the adapter is strong enough that the comparison would catch one that did
    // nothing.
    let (mut adapted_worst, mut base_worst) = (0f32, 0f32);
    for row in common::read_jsonl("lora/smollm2-r16-greedy.jsonl") {
        let prompt = common::ids(&row["prompt_ids"]);
        let forced = common::ids(&row["ids"]);
        let want = row["steps"].as_array().unwrap();
        for slot in [1u16, 0] {
            let steps = greedy_steps_with_adapter(&model, &prompt, &forced, slot);
            for ((step, &token), want) in steps.iter().zip(&forced).zip(want) {
                let diff = (step.logprobs[token as usize]
                    - want["logprob"].as_f64().unwrap() as f32)
                    .abs();
                let worst = if slot == 1 {
                    &mut adapted_worst
                } else {
                    &mut base_worst
                };
                *worst = worst.max(diff);
            }
        }
    }
    eprintln!(
        "LoRA under {weights}, teacher-forced: largest logprob difference {adapted_worst} with \
         the adapter, {base_worst} without"
    );
    assert!(adapted_worst <= forced_tol, "{adapted_worst}");
    if matches!(expect, Expect::F32 { .. }) {
        assert!(
            base_worst > 3.0 * forced_tol,
            "the adapter moves the logprobs only {base_worst}"
        );
    }
}

/// `exact` and `f32`: the Q4_1 file's numbers in f32 arithmetic, as llama.cpp's run on the
/// F32 file llama-quantize dequantized from it: every token, logprobs within 1e-2.
#[test]
fn lora_matches_llama_cpp_in_f32() {
    for weights in [WeightsKind::Exact, WeightsKind::F32] {
        let expect = Expect::F32 { near_tie: NEAR_TIE };
        check(weights, F32_TOLERANCE, F32_TOLERANCE, expect);
    }
}

/// `auto`, as it serves: the base matmuls with int8 activations against llama.cpp's f32 run;
/// the update in f32 on both sides. The rule for greedy tokens, and the teacher-forced bound of
/// int8 activations.
#[test]
fn lora_matches_llama_cpp_auto() {
    check(
        WeightsKind::Auto,
        QUANTIZED_TOLERANCE,
        QUANTIZED_TEACHER_FORCED_TOLERANCE,
        Expect::Rounded,
    );
}
