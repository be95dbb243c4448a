//! The batched, paged forward on tiny random-weight models written by the test: batching,
//! chunking and paging must not change any logit, and bad input must be an error.

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use sluice_model::attention::{self, AttentionShape};
use sluice_model::testing::TinyModelSpec;
use sluice_model::{
    Architecture, AttentionBackend, KvDtype, KvLayout, LlamaModel, LoadOptions, ModelError,
    StepBatch, WeightsKind,
};

fn tiny_path(spec: &TinyModelSpec, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-forward-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    spec.write_gguf(&path).unwrap();
    path
}

fn load(path: &PathBuf, weights: WeightsKind, attention: AttentionBackend) -> LlamaModel {
    load_with_kv(path, weights, attention, LoadOptions::default().kv_dtype)
}

fn load_with_kv(
    path: &PathBuf,
    weights: WeightsKind,
    attention: AttentionBackend,
    kv_dtype: KvDtype,
) -> LlamaModel {
    let options = LoadOptions {
        weights,
        attention: Some(attention),
        kv_dtype,
        ..LoadOptions::default()
    };
    LlamaModel::load(path, &options).unwrap()
}

/// The attention backend that serves, as `LoadOptions { attention: None, .. }` picks on a CPU:
/// the CPU kernel, which takes every head size and grouping (its portable path where the CPU
/// has no vector one).
fn serving_backend(spec: &TinyModelSpec) -> AttentionBackend {
    let head_dim = spec.head_dim.unwrap_or(spec.hidden_size / spec.num_heads);
    assert!(attention::cpu::supports(
        head_dim,
        spec.num_heads / spec.num_kv_heads
    ));
    AttentionBackend::Cpu
}

fn largest_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// A deterministic pseudo-random sequence for inputs.
fn lcg(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed;
    move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s >> 33
    }
}

/// Hands out blocks from a pool, interleaved across sequences so tables are not contiguous.
struct Pool {
    next: u32,
    stride: u32,
    num_blocks: u32,
}

impl Pool {
    fn take(&mut self) -> u32 {
        let b = self.next;
        self.next = (self.next + self.stride) % self.num_blocks;
        b
    }
}

/// One sequence: its tokens (prompt then forced continuation) and where it stands.
struct Seq {
    tokens: Vec<u32>,
    prompt_len: usize,
    computed: usize,
    table: Vec<u32>,
}

/// Runs each sequence alone, one-shot prefill then one decode step per continuation token,
/// returning the logits after the prompt and after each continuation token.
fn run_alone(
    model: &LlamaModel,
    tokens: &[u32],
    prompt_len: usize,
    block_size: usize,
) -> Vec<Tensor> {
    let blocks = tokens.len().div_ceil(block_size);
    let mut kv = model.new_kv_cache(blocks + 3, block_size).unwrap();
    // Reverse order, so even alone the table is not the identity.
    let table: Vec<u32> = (0..blocks as u32).rev().map(|b| b + 3).collect();
    let mut batch = StepBatch::new(block_size);
    let mut out = Vec::new();
    batch.push_sequence(&tokens[..prompt_len], 0, &table, true);
    out.push(model.forward(&batch, &mut kv).unwrap());
    for pos in prompt_len..tokens.len() {
        batch.clear();
        batch.push_sequence(&tokens[pos..pos + 1], pos, &table, true);
        out.push(model.forward(&batch, &mut kv).unwrap());
    }
    out
}

/// Runs all sequences together: each step, every unfinished sequence contributes its next
/// prefill chunk (of a per-sequence chunk size) or its next decode token.
fn run_together(
    model: &LlamaModel,
    seqs: &mut [Seq],
    chunk: &[usize],
    block_size: usize,
) -> Vec<Vec<Tensor>> {
    let total_blocks: usize = seqs
        .iter()
        .map(|s| s.tokens.len().div_ceil(block_size))
        .sum();
    let mut pool = Pool {
        next: 0,
        stride: 7,
        num_blocks: total_blocks as u32 + 1,
    };
    assert_ne!(
        pool.num_blocks % 7,
        0,
        "stride must cycle through every block"
    );
    let mut kv = model
        .new_kv_cache(pool.num_blocks as usize, block_size)
        .unwrap();
    let mut results: Vec<Vec<Tensor>> = seqs.iter().map(|_| Vec::new()).collect();
    let mut batch = StepBatch::new(block_size);
    loop {
        batch.clear();
        let mut samplers = Vec::new();
        for (i, s) in seqs.iter_mut().enumerate() {
            if s.computed == s.tokens.len() {
                continue;
            }
            let n = if s.computed < s.prompt_len {
                chunk[i].min(s.prompt_len - s.computed)
            } else {
                1
            };
            let end = s.computed + n;
            while s.table.len() * block_size < end {
                s.table.push(pool.take());
            }
            let sample = end >= s.prompt_len;
            batch.push_sequence(&s.tokens[s.computed..end], s.computed, &s.table, sample);
            if sample {
                samplers.push(i);
            }
            s.computed = end;
        }
        if batch.is_empty() {
            break;
        }
        let logits = model.forward(&batch, &mut kv).unwrap();
        assert_eq!(logits.dim(0).unwrap(), samplers.len());
        for (row, &i) in samplers.iter().enumerate() {
            results[i].push(logits.narrow(0, row, 1).unwrap());
        }
    }
    results
}

fn check_batching_is_invisible(spec: TinyModelSpec, name: &str, backend: AttentionBackend) {
    let path = tiny_path(&spec, name);
    check_batching_is_invisible_on(&load(&path, WeightsKind::F32, backend), &spec, name);
}

fn check_batching_is_invisible_on(model: &LlamaModel, spec: &TinyModelSpec, name: &str) {
    let vocab = spec.vocab_size() as u64;
    let mut rnd = lcg(42);
    // Prompt lengths straddle block boundaries; continuations are forced tokens.
    let shapes = [(1usize, 4usize), (16, 3), (17, 5), (40, 2), (5, 9), (33, 1)];
    let block_size = 16;
    let mut seqs: Vec<Seq> = shapes
        .iter()
        .map(|&(p, c)| Seq {
            tokens: (0..p + c).map(|_| (rnd() % vocab) as u32).collect(),
            prompt_len: p,
            computed: 0,
            table: Vec::new(),
        })
        .collect();
    let alone: Vec<Vec<Tensor>> = seqs
        .iter()
        .map(|s| run_alone(model, &s.tokens, s.prompt_len, block_size))
        .collect();
    // The 40-token prompt prefills in three chunks (14 + 14 + 12) while others decode.
    let together = run_together(model, &mut seqs, &[64, 7, 5, 14, 64, 11], block_size);
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.len(), b.len(), "sequence {i}: number of sampled steps");
        for (step, (x, y)) in a.iter().zip(b).enumerate() {
            let diff = max_abs_diff(x, y);
            // Our packed kernel sums every output in the same order alone and in a batch. Without
            // AVX-512 the linear layers run on candle's gemm, whose summation order depends on the
            // number of rows: still f32 rounding, so bounded relative to the logits (measured: 9e-6
            // of the largest logit on an AVX2-only CPU).
            let scale = largest_abs(x);
            let bound = if sluice_kernels::cpu::gemm::available() {
                1e-4
            } else {
                1e-4f32.max(2e-5 * scale)
            };
            assert!(
                diff < bound,
                "{name}: sequence {i} step {step}: logits differ by {diff} (bound {bound})"
            );
        }
    }
}

#[test]
fn batching_is_invisible_llama_gqa() {
    let spec = TinyModelSpec::default();
    let backend = serving_backend(&spec);
    check_batching_is_invisible(spec, "llama.gguf", backend);
}

/// The 8-bit KV cache: a sequence gets the same logits alone and in any batch, and they stay
/// within the cache's quantization error of the f32 cache's.
#[test]
fn q8_kv_cache_keeps_batching_invisible_and_tracks_f32() {
    let spec = TinyModelSpec {
        hidden_size: 128, // head_dim 32: one scale per head and token
        ..TinyModelSpec::default()
    };
    let path = tiny_path(&spec, "q8kv.gguf");
    let q8 = load_with_kv(
        &path,
        WeightsKind::F32,
        AttentionBackend::Cpu,
        KvDtype::Q8_0,
    );
    assert_eq!(q8.kv_dtype(), KvDtype::Q8_0);
    check_batching_is_invisible_on(&q8, &spec, "q8kv.gguf");
    let f32_cache = load_with_kv(&path, WeightsKind::F32, AttentionBackend::Cpu, KvDtype::F32);
    let tokens: Vec<u32> = (0..70u32).map(|i| (i * 37 + 11) % 256).collect();
    let a = run_alone(&q8, &tokens, 40, 16);
    let b = run_alone(&f32_cache, &tokens, 40, 16);
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        let (diff, scale) = (max_abs_diff(x, y), largest_abs(y));
        assert!(
            diff > 0.0 && diff < 0.02 * scale,
            "step {step}: q8 logits differ from f32 by {diff} (largest {scale})"
        );
    }
    // The reference backend reads float caches only: a clear error, not a panic.
    let reference = load_with_kv(
        &path,
        WeightsKind::F32,
        AttentionBackend::Reference,
        KvDtype::Q8_0,
    );
    let mut kv = reference.new_kv_cache(4, 16).unwrap();
    let mut batch = StepBatch::new(16);
    batch.push_sequence(&[1, 2, 3], 0, &[0], true);
    let err = reference.forward(&batch, &mut kv).unwrap_err().to_string();
    assert!(err.contains("q8_0"), "{err}");
}

#[test]
fn batching_is_invisible_with_reference_attention() {
    check_batching_is_invisible(
        TinyModelSpec::default(),
        "llama-ref.gguf",
        AttentionBackend::Reference,
    );
}

#[test]
fn batching_is_invisible_qwen2_biases() {
    let spec = TinyModelSpec {
        architecture: Architecture::Qwen2,
        num_heads: 6,
        num_kv_heads: 2,
        hidden_size: 96,
        ..TinyModelSpec::default()
    };
    let backend = serving_backend(&spec);
    check_batching_is_invisible(spec, "qwen2.gguf", backend);
}

/// Gemma 3's layer (post-norms, GeGLU, QK-norm, scaled embeddings) with a sliding window of 8
/// keys on its local layer, crossed by the test's prompts of up to 40 tokens: a sequence gets
/// the same logits alone and in any batch, and the kernel agrees with the reference attention.
#[test]
fn batching_is_invisible_gemma3_sliding_window() {
    let spec = TinyModelSpec {
        architecture: Architecture::Gemma3,
        head_dim: Some(32),
        ..TinyModelSpec::default()
    };
    let backend = serving_backend(&spec);
    let path = tiny_path(&spec, "gemma3.gguf");
    let model = load(&path, WeightsKind::F32, backend);
    let config = model.config();
    assert_eq!(
        (0..config.num_layers)
            .map(|i| config.window_of_layer(i))
            .collect::<Vec<_>>(),
        [Some(sluice_model::testing::TINY_GEMMA_WINDOW), None],
        "the pattern of 2: a local layer, then a global one"
    );
    assert_eq!(config.final_logit_softcap, Some(30.0));
    check_batching_is_invisible_on(&model, &spec, "gemma3.gguf");
    // The CPU kernel against the candle reference on the whole model, over 40 tokens (five
    // windows).
    let reference = load(&path, WeightsKind::F32, AttentionBackend::Reference);
    let tokens: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 256).collect();
    let a = run_alone(&model, &tokens, 25, 16);
    let b = run_alone(&reference, &tokens, 25, 16);
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        let diff = max_abs_diff(x, y);
        assert!(
            diff < 1e-4,
            "step {step}: kernel and reference differ by {diff}"
        );
        // Capped: every logit within the cap.
        assert!(largest_abs(x) < 30.0);
    }
}

#[test]
fn chunked_prefill_equals_one_shot() {
    let spec = TinyModelSpec::default();
    let path = tiny_path(&spec, "chunks.gguf");
    let model = load(&path, WeightsKind::F32, serving_backend(&spec));
    let mut rnd = lcg(9);
    let tokens: Vec<u32> = (0..45).map(|_| (rnd() % 200) as u32).collect();
    let block_size = 8;
    let table: Vec<u32> = vec![5, 0, 3, 1, 6, 2];
    let one_shot = {
        let mut kv = model.new_kv_cache(7, block_size).unwrap();
        let mut b = StepBatch::new(block_size);
        b.push_sequence(&tokens, 0, &table, true);
        model.forward(&b, &mut kv).unwrap()
    };
    let mut kv = model.new_kv_cache(7, block_size).unwrap();
    let mut last = None;
    for (start, end) in [(0, 13), (13, 30), (30, 45)] {
        let mut b = StepBatch::new(block_size);
        b.push_sequence(&tokens[start..end], start, &table, end == 45);
        last = Some(model.forward(&b, &mut kv).unwrap());
    }
    let diff = max_abs_diff(&one_shot, &last.unwrap());
    assert!(
        diff < 1e-4,
        "three-chunk prefill differs from one-shot by {diff}"
    );
}

#[test]
fn cpu_kernel_matches_reference_on_random_inputs() {
    let mut rnd = lcg(1234);
    let mut rand_f32 = move || (rnd() % 20001) as f32 / 10000.0 - 1.0;
    for &(heads, kv_heads) in &[(4usize, 4usize), (4, 2), (6, 2), (8, 1), (9, 3), (16, 2)] {
        for &block_size in &[1usize, 3, 16, 32, 20] {
            let head_dim = 32;
            // (prefill chunk or decode length, tokens already cached), incl. block boundaries.
            let shapes = [
                (1usize, 0usize),
                (1, 15),
                (1, 16),
                (3, 13),
                (17, 0),
                (20, 31),
                (1, 47),
                (16, 16),
                (40, 0),
            ];
            let num_blocks: usize = shapes
                .iter()
                .map(|(q, c)| (q + c).div_ceil(block_size))
                .sum::<usize>()
                + 2;
            let layout = KvLayout {
                num_blocks,
                block_size,
                num_kv_heads: kv_heads,
                head_dim,
            };
            let n = layout.values_per_layer();
            let k_cache = Tensor::from_vec(
                (0..n).map(|_| rand_f32()).collect::<Vec<_>>(),
                n,
                &Device::Cpu,
            )
            .unwrap();
            let v_cache = Tensor::from_vec(
                (0..n).map(|_| rand_f32()).collect::<Vec<_>>(),
                n,
                &Device::Cpu,
            )
            .unwrap();
            let mut batch = StepBatch::new(block_size);
            let mut next_block = num_blocks as u32;
            for &(q_len, cached) in &shapes {
                let blocks = (q_len + cached).div_ceil(block_size);
                let table: Vec<u32> = (0..blocks)
                    .map(|_| {
                        next_block -= 1;
                        next_block
                    })
                    .collect();
                batch.push_sequence(&vec![0u32; q_len], cached, &table, true);
            }
            let t = batch.num_tokens();
            let q = Tensor::from_vec(
                (0..t * heads * head_dim)
                    .map(|_| rand_f32() * 2.0)
                    .collect::<Vec<_>>(),
                (t, heads, head_dim),
                &Device::Cpu,
            )
            .unwrap();
            // Full attention, and sliding windows that start inside chunks, on chunk and block
            // edges, and past every context (16 keys a chunk).
            for window in [None, Some(1), Some(7), Some(16), Some(23), Some(100)] {
                let shape = AttentionShape {
                    num_heads: heads,
                    num_kv_heads: kv_heads,
                    head_dim,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    window,
                };
                // gpt-oss's sinks: one logit a head in every softmax's denominator.
                let sink_logits: Vec<f32> = (0..heads).map(|h| h as f32 * 0.7 - 1.0).collect();
                // The same inputs held as f32 and as f16: the kernel must match the reference
                // on both, with and without sinks.
                for (dtype, sinks) in [DType::F32, DType::F16]
                    .into_iter()
                    .flat_map(|d| [(d, None), (d, Some(&sink_logits[..]))])
                {
                    let (k, v) = (
                        k_cache.to_dtype(dtype).unwrap(),
                        v_cache.to_dtype(dtype).unwrap(),
                    );
                    let fast = attention::cpu::paged_attention(
                        &q,
                        &k,
                        &v,
                        &layout,
                        &batch,
                        &batch.block_tables,
                        &shape,
                        sinks,
                    )
                    .unwrap();
                    let reference = attention::reference::paged_attention(
                        &q,
                        &k,
                        &v,
                        &layout,
                        &batch,
                        &batch.block_tables,
                        &shape,
                        sinks,
                    )
                    .unwrap();
                    let diff = max_abs_diff(&fast, &reference);
                    assert!(diff < 1e-5, "heads {heads}/{kv_heads}, block {block_size}, window {window:?}, {dtype:?}: sinks {}: kernel differs from reference by {diff}", sinks.is_some());
                }
            }
        }
    }
}

#[test]
fn weight_kinds_agree() {
    // With f32 tensors in the file, every weight path computes with the same numbers.
    let path = tiny_path(&TinyModelSpec::default(), "kinds.gguf");
    let tokens: Vec<u32> = (0..21).map(|i| (i * 11 % 250) as u32).collect();
    let run = |kind| {
        let model = load(&path, kind, serving_backend(&TinyModelSpec::default()));
        let mut kv = model.new_kv_cache(2, 16).unwrap();
        let mut b = StepBatch::new(16);
        b.push_sequence(&tokens, 0, &[1, 0], true);
        model.forward(&b, &mut kv).unwrap()
    };
    let f32_logits = run(WeightsKind::F32);
    assert!(max_abs_diff(&f32_logits, &run(WeightsKind::Quantized)) < 1e-4);
    // f32 tensors have no quantized panels: `auto` runs every step on AMX tiles where the CPU
    // has them, whose split-bf16 products keep about 16 bits (measured: 4e-6 of the largest
    // logit here).
    let auto_diff = max_abs_diff(&f32_logits, &run(WeightsKind::Auto));
    let largest = largest_abs(&f32_logits);
    let bound = if sluice_kernels::cpu::amx::available() {
        2e-5 * largest
    } else {
        1e-4
    };
    assert!(
        auto_diff < bound,
        "auto differs from f32 by {auto_diff} (bound {bound})"
    );
    assert!(max_abs_diff(&f32_logits, &run(WeightsKind::F16)) < 5e-2);
    // bf16 keeps 8 bits of mantissa (f16 11): a coarser bound, still far below the logits.
    let bf16_diff = max_abs_diff(&f32_logits, &run(WeightsKind::Bf16));
    eprintln!("bf16 weights: {bf16_diff} of {largest}");
    assert!(bf16_diff < 5e-3 * largest, "bf16 differs by {bf16_diff}");

    // Q8_0 weights: the quantized matmul also quantizes activations, so only close.
    let spec = TinyModelSpec {
        dtype: GgmlDType::Q8_0,
        ..TinyModelSpec::default()
    };
    let path = tiny_path(&spec, "kinds-q8.gguf");
    let f = {
        let model = load(
            &path,
            WeightsKind::F32,
            serving_backend(&TinyModelSpec::default()),
        );
        let mut kv = model.new_kv_cache(2, 16).unwrap();
        let mut b = StepBatch::new(16);
        b.push_sequence(&tokens, 0, &[1, 0], true);
        model.forward(&b, &mut kv).unwrap()
    };
    let model = load(
        &path,
        WeightsKind::Quantized,
        serving_backend(&TinyModelSpec::default()),
    );
    let mut kv = model.new_kv_cache(2, 16).unwrap();
    let mut b = StepBatch::new(16);
    b.push_sequence(&tokens, 0, &[1, 0], true);
    let q = model.forward(&b, &mut kv).unwrap();
    assert!(
        max_abs_diff(&f, &q) < 0.1,
        "Q8_0 quantized path strays from its dequantized weights"
    );
}

/// The GGUF formats our kernels read in place.
const KERNEL_FORMATS: [GgmlDType; 8] = [
    GgmlDType::Q4_1,
    GgmlDType::Q8_0,
    GgmlDType::Q4_0,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// A tiny model in `dtype`: K-quants need rows of whole 256-weight super-blocks.
fn spec_in(dtype: GgmlDType) -> TinyModelSpec {
    let k_quant = dtype.block_size() == 256;
    TinyModelSpec {
        dtype,
        hidden_size: if k_quant { 256 } else { 64 },
        intermediate_size: if k_quant { 512 } else { 128 },
        ..TinyModelSpec::default()
    }
}

/// `auto` computes every format our kernels read in llama.cpp's integer arithmetic, exactly as
/// `quantized` does: the K-quants per 256 activations, the legacy formats per 32, prefill and
/// decode alike.
#[test]
fn auto_weights_equal_their_formats_reference_bit_for_bit() {
    for dtype in KERNEL_FORMATS {
        let path = tiny_path(&spec_in(dtype), &format!("auto-{dtype:?}.gguf"));
        let reference = WeightsKind::Quantized;
        let reference_model = load(&path, reference, serving_backend(&TinyModelSpec::default()));
        let auto_model = load(
            &path,
            WeightsKind::Auto,
            serving_backend(&TinyModelSpec::default()),
        );
        // A prefill of more rows than a kernel's pass takes (8), then decode steps of one.
        let prefill = 14;
        let tokens: Vec<u32> = (0..prefill + 2).map(|i| (i * 13 % 250) as u32).collect();
        let steps = |model: &LlamaModel| -> Vec<Vec<f32>> {
            let mut kv = model.new_kv_cache(3, 16).unwrap();
            let mut out = Vec::new();
            let mut b = StepBatch::new(16);
            b.push_sequence(&tokens[..prefill], 0, &[2, 0], true);
            out.push(
                model
                    .forward(&b, &mut kv)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap(),
            );
            for pos in prefill..prefill + 2 {
                b.clear();
                b.push_sequence(&tokens[pos..pos + 1], pos, &[2, 0], true);
                out.push(
                    model
                        .forward(&b, &mut kv)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap(),
                );
            }
            out
        };
        let (a, b) = (steps(&reference_model), steps(&auto_model));
        for (step, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{dtype:?} step {step}: auto differs from {reference}"
            );
        }
    }
}

/// `exact` regroups every format's blocks into panels dequantized in registers for small
/// steps and once per call for large ones; both must give the f32 path's numbers exactly.
#[test]
fn exact_weights_equal_f32_bit_for_bit() {
    for dtype in KERNEL_FORMATS {
        let path = tiny_path(&spec_in(dtype), &format!("exact-{dtype:?}.gguf"));
        let backend = serving_backend(&TinyModelSpec::default());
        let (f32_model, exact) = (
            load(&path, WeightsKind::F32, backend),
            load(&path, WeightsKind::Exact, backend),
        );
        // A prefill long enough to dequantize each panel once (12 rows and more), then decode
        // steps of one row (in registers).
        let tokens: Vec<u32> = (0..16).map(|i| (i * 13 % 250) as u32).collect();
        let steps = |model: &LlamaModel| -> Vec<Vec<f32>> {
            let mut kv = model.new_kv_cache(3, 16).unwrap();
            let mut b = StepBatch::new(16);
            let mut out = Vec::new();
            for (pos, len) in [(0, 14), (14, 1), (15, 1)] {
                b.clear();
                b.push_sequence(&tokens[pos..pos + len], pos, &[2, 0], true);
                let logits = model.forward(&b, &mut kv).unwrap();
                out.push(logits.flatten_all().unwrap().to_vec1::<f32>().unwrap());
            }
            out
        };
        let (a, b) = (steps(&f32_model), steps(&exact));
        for (step, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{dtype:?} step {step}: exact differs from f32"
            );
        }
    }
}

/// `quantized` (int8 activations, our kernels) stays close to the f32 path in every format, prefill and decode alike, and a
/// sequence's logits do not depend on the rows beside it where our kernels run.
#[test]
fn quantized_weights_track_f32_in_every_format() {
    for dtype in KERNEL_FORMATS {
        let path = tiny_path(&spec_in(dtype), &format!("quantized-{dtype:?}.gguf"));
        let backend = serving_backend(&TinyModelSpec::default());
        let tokens: Vec<u32> = (0..19).map(|i| (i * 13 % 250) as u32).collect();
        let logits = |kind| {
            let model = load(&path, kind, backend);
            let mut kv = model.new_kv_cache(3, 16).unwrap();
            let mut b = StepBatch::new(16);
            b.push_sequence(&tokens[..17], 0, &[2, 0], true);
            let prefill = model.forward(&b, &mut kv).unwrap();
            b.clear();
            b.push_sequence(&tokens[17..18], 17, &[2, 0], true);
            (prefill, model.forward(&b, &mut kv).unwrap())
        };
        let (f_prefill, f_decode) = logits(WeightsKind::F32);
        let (q_prefill, q_decode) = logits(WeightsKind::Quantized);
        for (step, f, q) in [
            ("prefill", &f_prefill, &q_prefill),
            ("decode", &f_decode, &q_decode),
        ] {
            let diff = max_abs_diff(f, q);
            // Measured: 0.15% to 0.3% of the largest logit, from rounding activations to int8.
            let bound = 0.005 * largest_abs(f);
            assert!(
                diff < bound,
                "{dtype:?} {step}: quantized strays from f32 by {diff} (bound {bound})"
            );
        }
    }
}

#[test]
fn tiny_models_carry_a_working_tokenizer() {
    let path = tiny_path(&TinyModelSpec::default(), "tokenizer.gguf");
    let file = sluice_model::GgufFile::open(&path).unwrap();
    let tok = file.tokenizer().unwrap();
    let ids = tok.encode("the the").unwrap();
    assert_eq!(
        ids.len(),
        2,
        "merges make `the` and ` the` single tokens: {ids:?}"
    );
    let ids = tok.encode("<|im_start|>the").unwrap();
    assert_eq!(ids.len(), 2, "a control token parses as one id: {ids:?}");
    assert_eq!(tok.decode(&ids, false), "<|im_start|>the");
    assert!(tok.chat_template().is_some());
}

#[test]
fn bad_files_are_clear_errors() {
    let missing = std::env::temp_dir().join("sluice-no-such-model.gguf");
    match LlamaModel::load(&missing, &LoadOptions::default()) {
        Err(ModelError::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("expected an Io error, got {:?}", other.err()),
    }

    let good = tiny_path(&TinyModelSpec::default(), "truncate-src.gguf");
    let bytes = std::fs::read(&good).unwrap();
    for cut in [10, 200, bytes.len() / 2, bytes.len() - 100] {
        let truncated = good.with_file_name(format!("truncated-{cut}.gguf"));
        std::fs::write(&truncated, &bytes[..cut]).unwrap();
        let err = LlamaModel::load(&truncated, &LoadOptions::default())
            .err()
            .expect("truncated file must not load");
        let msg = err.to_string();
        assert!(
            msg.contains("truncated-"),
            "error should name the file: {msg}"
        );
    }

    // A header edited after writing: a tensor of a type sluice cannot read (20 is IQ4_NL), and
    // a tensor whose shape needs more bytes than lie before the next tensor.
    let name = b"blk.0.attn_q.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("the tensor's info")
        + name.len();
    let dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let type_at = at + 4 + 8 * dims;
    let mut unknown = bytes.clone();
    unknown[type_at..type_at + 4].copy_from_slice(&20u32.to_le_bytes());
    let path = good.with_file_name("unknown-type.gguf");
    std::fs::write(&path, &unknown).unwrap();
    let msg = LlamaModel::load(&path, &LoadOptions::default())
        .err()
        .expect("an unknown type must not load")
        .to_string();
    for part in ["unknown-type.gguf", "blk.0.attn_q.weight", "type 20"] {
        assert!(msg.contains(part), "error should name {part}: {msg}");
    }
    // Twice the rows overlap the next tensor; 64 times run past the end of the file.
    for (factor, what) in [(2, "overlaps"), (64, "past the end")] {
        let mut oversized = bytes.clone();
        let rows_at = at + 4 + 8; // GGUF lists the row length first, then the rows
        let rows = u64::from_le_bytes(oversized[rows_at..rows_at + 8].try_into().unwrap());
        oversized[rows_at..rows_at + 8].copy_from_slice(&(rows * factor).to_le_bytes());
        let path = good.with_file_name(format!("oversized-{factor}.gguf"));
        std::fs::write(&path, &oversized).unwrap();
        let msg = LlamaModel::load(&path, &LoadOptions::default())
            .err()
            .expect("a tensor past its extent must not load")
            .to_string();
        for part in [
            &format!("oversized-{factor}.gguf"),
            "blk.0.attn_q.weight",
            "F32",
            what,
        ] {
            assert!(msg.contains(part), "error should name {part}: {msg}");
        }
    }

    let text = good.with_file_name("not-gguf.gguf");
    std::fs::write(&text, "this is not a model").unwrap();
    let err = LlamaModel::load(&text, &LoadOptions::default())
        .err()
        .unwrap();
    assert!(matches!(err, ModelError::Gguf { .. }), "{err}");
}

#[test]
fn unsupported_architecture_is_named() {
    let path = tiny_path(&TinyModelSpec::default(), "arch-src.gguf");
    let mut file = sluice_model::GgufFile::open(&path).unwrap();
    file.content.metadata.insert(
        "general.architecture".into(),
        candle_core::quantized::gguf_file::Value::String("mamba".into()),
    );
    let err = LlamaModel::from_gguf(&mut file, &LoadOptions::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("mamba"), "{err}");
}

#[test]
fn out_of_range_batches_are_errors_not_panics() {
    let spec = TinyModelSpec::default();
    let path = tiny_path(&spec, "bounds.gguf");
    let model = load(
        &path,
        WeightsKind::F32,
        serving_backend(&TinyModelSpec::default()),
    );
    let mut kv = model.new_kv_cache(4, 16).unwrap();
    let mut b = StepBatch::new(16);
    b.push_sequence(&[spec.vocab_size() as u32], 0, &[0], true);
    assert!(matches!(
        model.forward(&b, &mut kv),
        Err(ModelError::InvalidStep(_))
    ));
    let mut b = StepBatch::new(16);
    b.push_sequence(&[1], 0, &[9], true);
    assert!(matches!(
        model.forward(&b, &mut kv),
        Err(ModelError::InvalidStep(_))
    ));
    let mut b = StepBatch::new(16);
    b.push_sequence(&[1], spec.context_length, &[0; 40], true);
    assert!(model.forward(&b, &mut kv).is_err());
    assert!(matches!(
        model.forward(&StepBatch::new(16), &mut kv),
        Err(ModelError::InvalidStep(_))
    ));
}

#[test]
fn rows_the_model_samples_follow_the_rule_and_the_others_keep_their_logits() {
    use sluice_model::sampling::sample_row;
    use sluice_model::{PagedLlama, RowSampling, StepOutput};
    let spec = TinyModelSpec::default();
    let path = tiny_path(&spec, "model-sampling.gguf");
    let open = || {
        let model = load(&path, WeightsKind::F32, serving_backend(&spec));
        PagedLlama::new(model, 8, 16).unwrap()
    };
    let mut batch = StepBatch::new(16);
    batch.push_sequence(&[1, 2, 3], 0, &[0], true);
    batch.push_sequence(&[4, 5], 0, &[1], true);
    batch.push_sequence(&[6, 7, 8, 9], 0, &[2], true);
    let mut all = StepOutput::default();
    open().forward(&batch, &mut all).unwrap();
    let vocab = spec.vocab_size();
    assert_eq!(all.logits.len(), 3 * vocab);
    assert!(all.sampled.is_empty());

    let random = RowSampling {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.8,
        min_p: 0.0,
        uniform: 0.37,
        top_logprobs: 5,
    };
    batch.model_sampling = vec![Some(RowSampling::GREEDY), None, Some(random)];
    let mut split = StepOutput::default();
    let mut paged = open();
    assert!(
        !paged.samples_rows(),
        "the CPU model leaves sampling to the engine"
    );
    paged.forward(&batch, &mut split).unwrap();
    let row = |i: usize| &all.logits[i * vocab..][..vocab];
    assert_eq!(
        split.logits,
        row(1),
        "only the unsampled row's logits come back"
    );
    assert_eq!(
        split.sampled,
        vec![
            sample_row(row(0), &RowSampling::GREEDY),
            sample_row(row(2), &random)
        ]
    );
    let argmax = (0..vocab).fold(0, |b, i| if row(0)[i] > row(0)[b] { i } else { b });
    assert_eq!(split.sampled[0].token as usize, argmax);

    batch.model_sampling.pop();
    assert!(matches!(
        open().forward(&batch, &mut split),
        Err(ModelError::InvalidStep(_))
    ));
}
