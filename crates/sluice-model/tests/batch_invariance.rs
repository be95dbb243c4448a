//! Batching is invisible, exactly (docs/design.md, "one arithmetic per weight format"): a row's
//! logits are a function of its weights' format and the weight kind chosen, never of the
//! step's size, the other rows, how its prompt was cut into steps, or which kernel ran. Every
//! check here is bit for bit: a tolerance would let a step size that picks another kernel
//! through.
//!
//! For every GGUF format our kernels read and every weight kind, on a model wide enough for
//! the K-quants' 256-input super-blocks, and on mixtures of experts (qwen3moe in five formats
//! under every kind; qwen2moe with its shared expert and Mixtral in Q4_K), whose experts each
//! multiply however many rows of the step chose them, on Gemma 3's and gpt-oss's layers with a
//! sliding window (Q4_K under `auto` and `exact`), and on the Qwen3.5 hybrids' Gated DeltaNet
//! layers, whose recurrent state moves with each sequence's own tokens (their tiny Q4_K_M files,
//! under `auto` and `exact`):
//! - a sequence's decode row alone equals it inside steps of 1 to 128 rows, which cross every
//!   row threshold a kernel has (the int8 kernels' tiles of 4 and 8 rows, the packed kernel's
//!   6-row tiles and its dequantize-once path from 12 rows, AMX's 16);
//! - a prompt's logits are the same whether its prefill ran in one step, in chunks (at block
//!   boundaries, as a prefix-cache hit leaves it, and not), or beside another prompt's rows;
//! - on a CPU with more than one kernel for a format (AVX2 and AVX-512; AVX-512 VNNI; AMX),
//!   each one this CPU can run, forced in turn, gives the same bits
//!   (`sluice_kernels::cpu::limit_kernels`). This binary holds only these tests: forcing a
//!   kernel is process-wide.

use candle_core::quantized::GgmlDType;
use sluice_kernels::cpu::KernelTier;
use sluice_model::testing::{TinyModelSpec, TinyMoe};
use sluice_model::{Architecture, LlamaModel, LoadOptions, StepBatch, WeightsKind};

const BLOCK: usize = 16;
/// Step sizes around every kernel's row threshold.
const SIZES: [usize; 22] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16, 17, 24, 31, 32, 33, 64, 65, 100, 128,
];
/// Prompt length: two whole blocks and a partial one.
const PROMPT: usize = 37;
/// Ways to cut the prompt into prefill steps: one step; at a block boundary (a prefix-cache
/// hit's cut); a last chunk shorter than a block; chunks of one token.
const CHUNKINGS: [&[usize]; 5] = [&[37], &[32, 5], &[16, 21], &[7, 7, 7, 7, 9], &[1; 37]];

fn spec(dtype: GgmlDType) -> TinyModelSpec {
    TinyModelSpec {
        hidden_size: 256,
        intermediate_size: 512,
        num_heads: 4,
        num_kv_heads: 2,
        dtype,
        ..TinyModelSpec::default()
    }
}

/// A mixture of 8 experts of 256, 2 a token (so a step of 128 rows spreads over every expert
/// in uneven groups), in place of the MLP.
fn moe_spec(architecture: Architecture, dtype: GgmlDType) -> TinyModelSpec {
    TinyModelSpec {
        architecture,
        moe: Some(TinyMoe::new(architecture, 8, 2, 256)),
        ..spec(dtype)
    }
}

/// One model of the test: a name for `SLUICE_INVARIANCE_CASES`, its file's spec, its kinds.
struct Case {
    name: String,
    source: Source,
    kinds: &'static [WeightsKind],
}

/// Where a case's model comes from.
enum Source {
    /// Written here.
    Spec(TinyModelSpec),
    /// A file a script makes (skipped, saying so, without it).
    File(Option<std::path::PathBuf>),
}

fn cases() -> Vec<Case> {
    let mut cases: Vec<Case> = FORMATS
        .into_iter()
        .map(|dtype| Case {
            name: format!("{dtype:?}"),
            source: Source::Spec(spec(dtype)),
            kinds: &KINDS,
        })
        .collect();
    for dtype in MOE_FORMATS {
        cases.push(Case {
            name: format!("qwen3moe-{dtype:?}"),
            source: Source::Spec(moe_spec(Architecture::Qwen3Moe, dtype)),
            kinds: &KINDS,
        });
    }
    for (arch, name) in [
        (Architecture::Qwen2Moe, "qwen2moe"),
        (Architecture::Llama, "mixtral"),
    ] {
        cases.push(Case {
            name: format!("{name}-Q4K"),
            source: Source::Spec(moe_spec(arch, GgmlDType::Q4K)),
            kinds: &[WeightsKind::Auto],
        });
    }
    // Gemma 3's layers (post-norms, GeGLU, QK-norm) with a local layer whose window of 8 keys
    // the 37-token prompt crosses several times.
    cases.push(Case {
        name: "gemma3-Q4K".into(),
        source: Source::Spec(TinyModelSpec {
            architecture: Architecture::Gemma3,
            ..spec(GgmlDType::Q4K)
        }),
        kinds: &[WeightsKind::Auto, WeightsKind::Exact],
    });
    // SmolLM3's layers: the fourth attends without RoPE.
    cases.push(Case {
        name: "smollm3-Q4K".into(),
        source: Source::Spec(TinyModelSpec {
            architecture: Architecture::SmolLm3,
            num_layers: 4,
            ..spec(GgmlDType::Q4K)
        }),
        kinds: &[WeightsKind::Auto, WeightsKind::Exact],
    });
    // gpt-oss's layers (biases, sinks, YaRN, the top k's softmax, the clamped SwiGLU) with a
    // window of 8 keys on every other layer.
    cases.push(Case {
        name: "gpt-oss-Q4K".into(),
        source: Source::Spec(moe_spec(Architecture::GptOss, GgmlDType::Q4K)),
        kinds: &[WeightsKind::Auto, WeightsKind::Exact],
    });
    // The Qwen3.5 hybrids' Gated DeltaNet layers, each sequence in a recurrent state of its
    // own (the tiny files of scripts/make-qwen35-models.sh: Q4_K, Q6_K, Q8_0 and Q5_0).
    for arch in ["qwen35", "qwen35moe", "qwen3next"] {
        cases.push(Case {
            name: format!("{arch}-Q4_K_M"),
            source: Source::File(sluice_model::testing::optional_model(
                &format!("tiny-qwen35/{arch}-q4_k_m.gguf"),
                "scripts/make-qwen35-models.sh",
            )),
            kinds: &[WeightsKind::Auto, WeightsKind::Exact],
        });
    }
    cases
}

fn tokens(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// The bits of each logits row of a step.
fn rows(model: &LlamaModel, batch: &StepBatch, kv: &mut sluice_model::KvCache) -> Vec<Vec<u32>> {
    model
        .forward(batch, kv)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
        .into_iter()
        .map(|r| r.into_iter().map(f32::to_bits).collect())
        .collect()
}

/// What one sequence computes: the logits after its prompt, and after one more token.
#[derive(PartialEq, Eq)]
struct Logits {
    prompt: Vec<u32>,
    next: Vec<u32>,
}

/// The sequence's prompt prefilled in chunks of `chunks` (each step beside a `filler`-row
/// prompt of another sequence when `filler > 0`), then its next token decoded beside a
/// `decode_filler`-row prompt of another sequence.
fn run(
    model: &LlamaModel,
    prompt: &[u32],
    next: u32,
    chunks: &[usize],
    filler: usize,
    decode_filler: usize,
) -> Logits {
    let vocab = model.config().vocab_size;
    // Blocks 0..3 for the sequence; fillers take fresh blocks from 4 on, each step its own.
    let filler_blocks = filler.max(decode_filler).div_ceil(BLOCK).max(1);
    let steps = chunks.len() + 1;
    let mut kv = model
        .new_kv_cache(4 + steps * filler_blocks, BLOCK)
        .unwrap();
    let table: Vec<u32> = (0..4).collect();
    let mut batch = StepBatch::new(BLOCK);
    // A hybrid's states: the sequence's is 0, each step's filler a fresh one of its own.
    batch.groups = kv.step_groups();
    let recurrent = kv.recurrent_group();
    // Another sequence's prompt of `n` rows in the step, on blocks of its own.
    let filler_at = |batch: &mut StepBatch, n: usize, step: usize| {
        let t: Vec<u32> = (0..filler_blocks)
            .map(|b| (4 + step * filler_blocks + b) as u32)
            .collect();
        batch.push_sequence(&tokens(n, 1000 + step as u64, vocab), 0, &t, true);
        if let Some(g) = recurrent {
            batch.push_group_state(g, 1 + step as u32);
        }
    };
    // One step: the sequence's `ids` from `pos`, beside `n` filler rows, which go first on odd
    // steps (the sequence's row is not always row 0). Its logits row.
    let mut step = 0;
    let mut one_step = |ids: &[u32], pos: usize, n: usize| {
        batch.clear();
        let filler_first = n > 0 && step % 2 == 1;
        if filler_first {
            filler_at(&mut batch, n, step);
        }
        batch.push_sequence(ids, pos, &table, true);
        if let Some(g) = recurrent {
            batch.push_group_state(g, 0);
        }
        if n > 0 && !filler_first {
            filler_at(&mut batch, n, step);
        }
        let out = rows(model, &batch, &mut kv);
        step += 1;
        out[usize::from(filler_first)].clone()
    };
    let mut done = 0;
    let mut last = Vec::new();
    for &c in chunks {
        last = one_step(&prompt[done..done + c], done, filler);
        done += c;
    }
    let next = one_step(&[next], prompt.len(), decode_filler);
    Logits { prompt: last, next }
}

/// Every check of the module docs on one loaded model; `what` names it in failures.
fn check(model: &LlamaModel, what: &str) -> Logits {
    let vocab = model.config().vocab_size;
    let prompt = tokens(PROMPT, 1, vocab);
    let next = tokens(1, 2, vocab)[0];
    let alone = run(model, &prompt, next, &[PROMPT], 0, 0);
    for n in SIZES {
        let got = run(model, &prompt, next, &[PROMPT], 0, n - 1);
        assert!(
            got.next == alone.next,
            "{what}: the decode row differs inside a step of {n} rows"
        );
    }
    for chunks in CHUNKINGS {
        for filler in [0, 20] {
            let got = run(model, &prompt, next, chunks, filler, 0);
            assert!(
                got.prompt == alone.prompt,
                "{what}: the prompt's logits differ prefilled in chunks {chunks:?} beside {filler} rows"
            );
            assert!(
                got.next == alone.next,
                "{what}: the next token's logits differ after chunks {chunks:?} beside {filler} rows"
            );
        }
    }
    alone
}

const FORMATS: [GgmlDType; 10] = [
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// The mixtures' formats: both forms of the int8 arithmetic (legacy blocks of 32, K-quant
/// super-blocks of 256), each in two formats, and f32.
const MOE_FORMATS: [GgmlDType; 5] = [
    GgmlDType::F32,
    GgmlDType::Q4_0,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q6K,
];

const KINDS: [WeightsKind; 6] = [
    WeightsKind::Auto,
    WeightsKind::Exact,
    WeightsKind::F32,
    WeightsKind::Quantized,
    WeightsKind::F16,
    WeightsKind::Bf16,
];

fn load(path: &std::path::Path, weights: WeightsKind) -> LlamaModel {
    LlamaModel::load(
        path,
        &LoadOptions {
            weights,
            ..LoadOptions::default()
        },
    )
    .unwrap()
}

/// Whether `SLUICE_INVARIANCE_CASES` (unset: every case) names this case and kind:
/// `Q4K:auto,Q4_1,qwen3moe-Q8_0` is Q4_K under `auto`, Q4_1 under every kind and the qwen3moe
/// mixture in Q8_0 under every kind. For a slow CPU, such as the emulated AVX2-only one of
/// `scripts/avx2-check.sh`.
fn wanted(case: &str, kind: WeightsKind) -> bool {
    let Ok(cases) = std::env::var("SLUICE_INVARIANCE_CASES") else {
        return true;
    };
    cases.split(',').any(|wanted| {
        let mut parts = wanted.trim().splitn(2, ':');
        parts.next() == Some(case) && parts.next().is_none_or(|k| k == kind.to_string())
    })
}

/// The one test of this binary (kernel forcing is process-wide): every format, every kind,
/// every kernel tier this CPU has.
#[test]
fn a_rows_logits_never_depend_on_its_step_or_kernel() {
    let dir = std::env::temp_dir().join(format!("sluice-invariance-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tiers = KernelTier::available();
    eprintln!("kernel tiers on this CPU: {tiers:?}");
    let mut ran = 0;
    for case in cases() {
        let name = &case.name;
        if !case.kinds.iter().any(|&kind| wanted(name, kind)) {
            continue;
        }
        let path = match &case.source {
            Source::Spec(spec) => {
                let path = dir.join(format!("{name}.gguf"));
                spec.write_gguf(&path).unwrap();
                path
            }
            Source::File(Some(path)) => path.clone(),
            Source::File(None) => continue,
        };
        for &kind in case.kinds.iter().filter(|&&kind| wanted(name, kind)) {
            ran += 1;
            let mut first: Option<(KernelTier, Logits)> = None;
            for &tier in &tiers {
                sluice_kernels::cpu::limit_kernels(tier);
                let model = load(&path, kind);
                let what = format!("{name} weights as {kind} on {tier:?} kernels");
                let got = check(&model, &what);
                match &first {
                    None => first = Some((tier, got)),
                    Some((t0, want)) => {
                        assert!(*want == got, "{what}: logits differ from {t0:?} kernels'")
                    }
                }
            }
            sluice_kernels::cpu::limit_kernels(*tiers.last().expect("one tier at least"));
            eprintln!("{name} as {kind}: invariant on {} tier(s)", tiers.len());
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        ran > 0,
        "SLUICE_INVARIANCE_CASES names no format and kind of this test"
    );
}
