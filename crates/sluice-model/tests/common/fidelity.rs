//! The comparison with llama.cpp's greedy fixtures that `tests/fixtures/README.md` prescribes,
//! for any model: SmolLM2 (`fidelity.rs`) and Qwen2.5-Coder (`qwen_fidelity.rs`).

use candle_core::{Tensor, D};
use sluice_model::{LlamaModel, StepBatch};

const BLOCK: usize = 16;

/// One step's log-probabilities (`[vocab]`) and the top five `(id, logprob)`.
pub struct Step {
    pub logprobs: Vec<f32>,
    pub top5: Vec<(u32, f32)>,
}

pub fn step_of(logits: &Tensor) -> Step {
    let logprobs = candle_nn::ops::log_softmax(&logits.flatten_all().unwrap(), D::Minus1)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let mut order: Vec<u32> = (0..logprobs.len() as u32).collect();
    order.sort_by(|&a, &b| logprobs[b as usize].total_cmp(&logprobs[a as usize]));
    let top5 = order[..5]
        .iter()
        .map(|&i| (i, logprobs[i as usize]))
        .collect();
    Step { logprobs, top5 }
}

/// Greedy generation of one sequence, following `forced` tokens (the fixture's) so that each
/// step's distribution can be compared with the fixture's at the same prefix.
pub fn greedy_steps(model: &LlamaModel, prompt: &[u32], forced: &[u32]) -> Vec<Step> {
    greedy_steps_with_adapter(model, prompt, forced, 0)
}

/// [`greedy_steps`] with every row under the LoRA adapter in `slot` (0: the base model).
pub fn greedy_steps_with_adapter(
    model: &LlamaModel,
    prompt: &[u32],
    forced: &[u32],
    slot: u16,
) -> Vec<Step> {
    let slots = |n: usize| if slot == 0 { Vec::new() } else { vec![slot; n] };
    let total = prompt.len() + forced.len();
    let blocks = total.div_ceil(BLOCK);
    let mut kv = model.new_kv_cache(blocks, BLOCK).unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut batch = StepBatch::new(BLOCK);
    batch.groups = kv.step_groups();
    batch.push_sequence(prompt, 0, &table, true);
    super::push_state(&kv, &mut batch, 0);
    batch.lora_slots = slots(prompt.len());
    let mut steps = vec![step_of(&model.forward(&batch, &mut kv).unwrap())];
    for (i, &tok) in forced
        .iter()
        .enumerate()
        .take(forced.len().saturating_sub(1))
    {
        batch.clear();
        batch.push_sequence(&[tok], prompt.len() + i, &table, true);
        super::push_state(&kv, &mut batch, 0);
        batch.lora_slots = slots(1);
        steps.push(step_of(&model.forward(&batch, &mut kv).unwrap()));
    }
    steps
}

/// The comparison of `tests/fixtures/README.md`: equal tokens until the first disagreement,
/// where each side's choice is in the other's top five; agreeing logprobs within `tol`.
/// Returns how many tokens agreed and how far apart their logprobs were. The model runs from the row's `prompt_ids` (for chat rows,
/// the template as llama.cpp rendered and tokenized it), so only the forward is compared.
pub fn compare_with_fixture(model: &LlamaModel, row: &serde_json::Value, tol: f32) -> Agreement {
    compare_with_fixture_under(model, row, tol, 0)
}

/// [`compare_with_fixture`] with every row under the LoRA adapter in `slot`.
pub fn compare_with_fixture_under(
    model: &LlamaModel,
    row: &serde_json::Value,
    tol: f32,
    slot: u16,
) -> Agreement {
    let prompt = super::ids(&row["prompt_ids"]);
    let expected = super::ids(&row["ids"]);
    let fixture_steps = row["steps"].as_array().unwrap();
    let ours = greedy_steps_with_adapter(model, &prompt, &expected, slot);
    let name = row["prompt"].as_str().unwrap();
    let mut max_logprob_diff = 0f32;
    for (i, (step, want)) in ours.iter().zip(fixture_steps).enumerate() {
        let our_tok = step.top5[0].0;
        let fixture_tok = expected[i];
        let fixture_top5: Vec<u32> = want["top"]
            .as_array()
            .or(want["top_logprobs"].as_array())
            .unwrap()
            .iter()
            .map(|p| p[0].as_u64().unwrap() as u32)
            .collect();
        if our_tok != fixture_tok {
            let our_top5: Vec<u32> = step.top5.iter().map(|p| p.0).collect();
            assert!(
                fixture_top5.contains(&our_tok) && our_top5.contains(&fixture_tok),
                "{name:?} step {i}: we chose {our_tok} (top5 {our_top5:?}), llama.cpp {fixture_tok} (top5 {fixture_top5:?})"
            );
            let fixture_lp = |k: usize| {
                want["top"]
                    .as_array()
                    .or(want["top_logprobs"].as_array())
                    .unwrap()[k][1]
                    .as_f64()
                    .unwrap() as f32
            };
            return Agreement {
                agreed: i,
                max_logprob_diff,
                divergence_margin: Some(fixture_lp(0) - fixture_lp(1)),
            };
        }
        let want_lp = want["logprob"].as_f64().unwrap() as f32;
        let got_lp = step.logprobs[our_tok as usize];
        max_logprob_diff = max_logprob_diff.max((got_lp - want_lp).abs());
        assert!(
            (got_lp - want_lp).abs() <= tol,
            "{name:?} step {i}: logprob of token {our_tok} is {got_lp}, llama.cpp says {want_lp} (tolerance {tol})"
        );
    }
    Agreement {
        agreed: expected.len(),
        max_logprob_diff,
        divergence_margin: None,
    }
}

/// How one fixture row compared.
pub struct Agreement {
    /// Tokens equal to llama.cpp's before the first divergence (all of them when none).
    pub agreed: usize,
    /// The largest difference between our logprob and llama.cpp's over those tokens.
    pub max_logprob_diff: f32,
    /// Where the two diverged: how far llama.cpp's own first choice stood above its second
    /// (a small margin is a genuine near-tie, which summation order may decide either way).
    pub divergence_margin: Option<f32>,
}

/// What a row's comparison must reach, derived from the fixtures' rule.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// Both sides compute in f32 from the same weights: every token, unless llama.cpp's own top
    /// two stood within `near_tie` where the two diverged (a tie summation order decides).
    F32 { near_tie: f32 },
    /// One side rounds what the other does not (int8 activations against llama.cpp's f32 run,
    /// an 8-bit cache): the rule alone (each side's choice in the other's top five, which
    /// [`compare_with_fixture`] asserts), and the prompt's own next token equal.
    Rounded,
    /// [`Expect::Rounded`], where the prompt's own next token may differ only if llama.cpp's
    /// top two stood within `near_tie` there (a genuine tie that the rounding decides).
    RoundedNearTie { near_tie: f32 },
}

/// Asserts that `a`, the comparison of the fixture row named `what`, meets `expect`.
pub fn check_agreement(a: &Agreement, expect: Expect, what: &str) {
    match (a.divergence_margin, expect) {
        (None, _) => {}
        (Some(margin), Expect::RoundedNearTie { near_tie }) => assert!(
            a.agreed > 0 || margin < near_tie,
            "{what}: the prompt's next token differs where llama.cpp's top two were {margin} \
             apart (not a near-tie, under {near_tie})"
        ),
        (Some(margin), Expect::F32 { near_tie }) => assert!(
            margin < near_tie,
            "{what}: diverged at step {} where llama.cpp's top two were {margin} apart (not a \
             near-tie, under {near_tie})",
            a.agreed
        ),
        (Some(_), Expect::Rounded) => {
            assert!(a.agreed > 0, "{what}: the prompt's next token differs")
        }
    }
}

/// Largest logprob difference of an agreeing token on the tiny random-weight files
/// (`moe_fidelity.rs`, `smollm3.rs`) where both sides compute in f32.
pub const TINY_F32_TOLERANCE: f32 = 1e-3;
/// There, a divergence is allowed only where llama.cpp's top two logprobs were this close.
pub const TINY_NEAR_TIE: f32 = 1e-2;
/// Largest logprob difference of an agreeing token on their quantized files (measured up to
/// 0.25).
pub const TINY_QUANTIZED_TOLERANCE: f32 = 0.35;

/// Every row of the fixture `fixture` (a path under `tests/fixtures`) against the tiny file at
/// `path` served with `weights` and an f32 KV cache, as llama.cpp's fixtures were recorded:
/// where both sides compute in f32 (`in_f32`) every token, logprobs within
/// [`TINY_F32_TOLERANCE`], a divergence only at a near-tie; else the fixtures' rule with every
/// row's first token equal. `what_it_is` asserts what the file must load as first. Prints how
/// far the rows agreed.
pub fn check_tiny_file(
    path: &std::path::Path,
    fixture: &str,
    weights: sluice_model::WeightsKind,
    in_f32: bool,
    what_it_is: impl Fn(&LlamaModel),
) {
    let (tol, expect) = if in_f32 {
        (
            TINY_F32_TOLERANCE,
            Expect::F32 {
                near_tie: TINY_NEAR_TIE,
            },
        )
    } else {
        (TINY_QUANTIZED_TOLERANCE, Expect::Rounded)
    };
    check_tiny_file_by(path, fixture, weights, tol, expect, what_it_is)
}

/// [`check_tiny_file`] with the tolerance on agreeing logprobs and the rule each row must meet
/// given (the hybrids' quantized files, which rounding moves further: `qwen35.rs`).
pub fn check_tiny_file_by(
    path: &std::path::Path,
    fixture: &str,
    weights: sluice_model::WeightsKind,
    tol: f32,
    expect: Expect,
    what_it_is: impl Fn(&LlamaModel),
) {
    let model = LlamaModel::load(
        path,
        &sluice_model::LoadOptions {
            weights,
            kv_dtype: sluice_model::KvDtype::F32,
            ..sluice_model::LoadOptions::default()
        },
    )
    .unwrap();
    what_it_is(&model);
    let file = path.file_name().unwrap().to_string_lossy();
    let (mut agreed, mut total, mut worst) = (0, 0, 0f32);
    for row in super::read_jsonl(fixture) {
        let a = compare_with_fixture(&model, &row, tol);
        check_agreement(
            &a,
            expect,
            &format!("{file} as {weights}, {}", row["prompt"]),
        );
        agreed += a.agreed;
        total += row["ids"].as_array().unwrap().len();
        worst = worst.max(a.max_logprob_diff);
    }
    eprintln!(
        "{file} as {weights}: {agreed}/{total} greedy tokens identical to llama.cpp before any \
         divergence, largest logprob difference {worst}"
    );
}
