//! Memory at an 8B model's layer shapes without an 8B download: a GGUF file with Llama-3-8B's
//! layer shapes (hidden 4096, MLP 14336, 32 query heads over 8 KV heads of 128) in Q4_K_M's
//! formats, but 2 of its 32 layers and 8016 of its 128,256 tokens: exactly a sixteenth of the
//! real model's layers and vocabulary, so sixteen times what it costs is what the 8B would.
//!
//! The weights are random but valid K-quant blocks written straight to the file (quantizing
//! 300 MB with candle would take minutes). The test loads the file with the defaults
//! (`auto`), checks that the process grew by no more than the file and the KV cache (plus a
//! margin), i.e. that no f32 copy of the weights was made (that would be about 7x the file),
//! then loads it as `f32` (what an f32 copy costs) and as `quantized`, which computes the
//! K-quants in the same int8 arithmetic as `auto`: the two give bit-identical logits.
//!
//! One test, so that no other test's allocations land in the RSS it measures.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use half::f16;
use sluice_model::{KvCache, LlamaModel, LoadOptions, StepBatch, WeightsKind};

const HIDDEN: usize = 4096;
const INTERMEDIATE: usize = 14336;
const HEADS: usize = 32;
const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;
/// Of Llama-3-8B's 32.
const LAYERS: usize = 2;
/// Llama-3's 128,256 tokens / 16, as 2 layers are 32 / 16.
const VOCAB: usize = 8016;
/// How many times this model the 8B is.
const SCALE: usize = 16;
/// Context the KV cache is sized for.
const KV_TOKENS: usize = 8192;
const BLOCK: usize = 16;
const MIB: f64 = (1 << 20) as f64;

/// GGML block types as GGUF numbers them, with their block geometry.
#[derive(Clone, Copy)]
enum Dtype {
    F32,
    /// 256 weights in 144 bytes: f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins,
    /// 128 bytes of 4-bit quants (candle-core's `BlockQ4K`, llama.cpp's `block_q4_K`).
    Q4K,
    /// 256 weights in 210 bytes: 128 bytes of low 4 bits, 64 of high 2 bits, 16 i8 scales,
    /// f16 d (`BlockQ6K`, `block_q6_K`).
    Q6K,
}

impl Dtype {
    fn ggml_id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::Q4K => 12,
            Self::Q6K => 14,
        }
    }

    fn bytes(self, elements: usize) -> usize {
        match self {
            Self::F32 => 4 * elements,
            Self::Q4K => elements / 256 * 144,
            Self::Q6K => elements / 256 * 210,
        }
    }
}

struct TensorSpec {
    name: String,
    /// `[rows, cols]`, or `[n]`: row-major as the loader sees it (GGUF stores them reversed).
    shape: Vec<usize>,
    dtype: Dtype,
}

impl TensorSpec {
    fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    fn bytes(&self) -> usize {
        self.dtype.bytes(self.elements())
    }
}

/// The tensors of the model: Q4_K_M's choice of formats (Q4_K, with Q6_K for V, the MLP's down
/// projection and the output; llama.cpp gives only some layers' V and down Q6_K, so this file is
/// a little larger than the real one's sixteenth), an untied output as Llama 3's.
fn tensors() -> Vec<TensorSpec> {
    let t = |name: String, shape: &[usize], dtype| TensorSpec {
        name,
        shape: shape.to_vec(),
        dtype,
    };
    let mut ts = vec![
        t("token_embd.weight".into(), &[VOCAB, HIDDEN], Dtype::Q4K),
        t("output.weight".into(), &[VOCAB, HIDDEN], Dtype::Q6K),
        t("output_norm.weight".into(), &[HIDDEN], Dtype::F32),
    ];
    for i in 0..LAYERS {
        let b = |s: &str| format!("blk.{i}.{s}");
        ts.extend([
            t(b("attn_norm.weight"), &[HIDDEN], Dtype::F32),
            t(b("attn_q.weight"), &[HEADS * HEAD_DIM, HIDDEN], Dtype::Q4K),
            t(
                b("attn_k.weight"),
                &[KV_HEADS * HEAD_DIM, HIDDEN],
                Dtype::Q4K,
            ),
            t(
                b("attn_v.weight"),
                &[KV_HEADS * HEAD_DIM, HIDDEN],
                Dtype::Q6K,
            ),
            t(
                b("attn_output.weight"),
                &[HIDDEN, HEADS * HEAD_DIM],
                Dtype::Q4K,
            ),
            t(b("ffn_norm.weight"), &[HIDDEN], Dtype::F32),
            t(b("ffn_gate.weight"), &[INTERMEDIATE, HIDDEN], Dtype::Q4K),
            t(b("ffn_up.weight"), &[INTERMEDIATE, HIDDEN], Dtype::Q4K),
            t(b("ffn_down.weight"), &[HIDDEN, INTERMEDIATE], Dtype::Q6K),
        ]);
    }
    ts
}

/// SplitMix64: deterministic bytes without a dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }
}

/// One block of `dtype` with random quants and scales. The f16 scales are fixed so that a
/// weight's spread is about 1/sqrt(4096) (Q4_K: d * sc * q - dmin * m with sc, m, q random;
/// dmin = 7.5 d centres it; Q6_K: d * sc * (q - 32) with sc in -8..8), which keeps every
/// activation of the two layers finite and the logits spread out.
fn write_block(w: &mut impl Write, dtype: Dtype, rng: &mut Rng) -> std::io::Result<()> {
    match dtype {
        Dtype::F32 => unreachable!("vectors are written whole"),
        Dtype::Q4K => {
            let mut b = [0u8; 144];
            b[0..2].copy_from_slice(&f16::from_f32(1e-4).to_le_bytes());
            b[2..4].copy_from_slice(&f16::from_f32(7.5e-4).to_le_bytes());
            // Every bit pattern of the 12 scale bytes and 128 quant bytes is a valid block.
            rng.fill(&mut b[4..]);
            w.write_all(&b)
        }
        Dtype::Q6K => {
            let mut b = [0u8; 210];
            rng.fill(&mut b[..192]);
            for s in &mut b[192..208] {
                *s = ((rng.next_u64() % 17) as i8 - 8) as u8;
            }
            b[208..210].copy_from_slice(&f16::from_f32(1e-4).to_le_bytes());
            w.write_all(&b)
        }
    }
}

fn gguf_string(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

enum Meta {
    U32(u32),
    F32(f32),
    Str(&'static str),
}

/// Writes the model as GGUF v3 by hand, streaming each tensor block by block, so that the test
/// process holds none of it in memory when it measures the load (candle's writer takes every
/// tensor in memory at once, and the allocator could keep those pages in the RSS afterwards).
/// Returns the file's size.
fn write_gguf(path: &Path, tensors: &[TensorSpec]) -> std::io::Result<u64> {
    const ALIGN: usize = 32;
    let meta: Vec<(&str, Meta)> = vec![
        ("general.architecture", Meta::Str("llama")),
        ("general.alignment", Meta::U32(ALIGN as u32)),
        ("llama.embedding_length", Meta::U32(HIDDEN as u32)),
        ("llama.block_count", Meta::U32(LAYERS as u32)),
        ("llama.feed_forward_length", Meta::U32(INTERMEDIATE as u32)),
        ("llama.attention.head_count", Meta::U32(HEADS as u32)),
        ("llama.attention.head_count_kv", Meta::U32(KV_HEADS as u32)),
        ("llama.context_length", Meta::U32(KV_TOKENS as u32)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("llama.rope.freq_base", Meta::F32(500_000.0)),
        ("llama.vocab_size", Meta::U32(VOCAB as u32)),
    ];
    let mut w = BufWriter::with_capacity(1 << 20, File::create(path)?);
    w.write_all(&0x4655_4747u32.to_le_bytes())?; // "GGUF"
    w.write_all(&3u32.to_le_bytes())?;
    w.write_all(&(tensors.len() as u64).to_le_bytes())?;
    w.write_all(&(meta.len() as u64).to_le_bytes())?;
    let mut pos = 24;
    for (key, value) in &meta {
        gguf_string(&mut w, key)?;
        pos += 8 + key.len() + 4;
        match value {
            Meta::U32(v) => {
                w.write_all(&4u32.to_le_bytes())?;
                w.write_all(&v.to_le_bytes())?;
                pos += 4;
            }
            Meta::F32(v) => {
                w.write_all(&6u32.to_le_bytes())?;
                w.write_all(&v.to_le_bytes())?;
                pos += 4;
            }
            Meta::Str(s) => {
                w.write_all(&8u32.to_le_bytes())?;
                gguf_string(&mut w, s)?;
                pos += 8 + s.len();
            }
        }
    }
    let padded = |n: usize| n.div_ceil(ALIGN) * ALIGN;
    let mut offset = 0;
    for t in tensors {
        gguf_string(&mut w, &t.name)?;
        w.write_all(&(t.shape.len() as u32).to_le_bytes())?;
        // GGUF lists dimensions innermost first.
        for &d in t.shape.iter().rev() {
            w.write_all(&(d as u64).to_le_bytes())?;
        }
        w.write_all(&t.dtype.ggml_id().to_le_bytes())?;
        w.write_all(&(offset as u64).to_le_bytes())?;
        pos += 8 + t.name.len() + 4 + 8 * t.shape.len() + 4 + 8;
        offset += padded(t.bytes());
    }
    w.write_all(&vec![0u8; padded(pos) - pos])?;
    let mut rng = Rng(0x5EED);
    for t in tensors {
        match t.dtype {
            // Norm weights near 1, as trained models have them.
            Dtype::F32 => {
                for _ in 0..t.elements() {
                    let x = 1.0 + (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 0.2 - 0.1;
                    w.write_all(&x.to_le_bytes())?;
                }
            }
            dtype => {
                for _ in 0..t.elements() / 256 {
                    write_block(&mut w, dtype, &mut rng)?;
                }
            }
        }
        w.write_all(&vec![0u8; padded(t.bytes()) - t.bytes()])?;
    }
    w.into_inner()?.sync_all()?;
    std::fs::metadata(path).map(|m| m.len())
}

/// The process's resident memory now, and its peak, in bytes, from `/proc/self/status`.
#[derive(Clone, Copy, Debug)]
struct Rss {
    total: u64,
    /// Anonymous pages: the heap, where a loader's copies live.
    anon: u64,
    /// Pages of mapped files (a memory-mapped model shows here, not in `anon`).
    file: u64,
    /// VmHWM: the peak of `total` since the process started or [`reset_peak`].
    peak: u64,
}

fn rss() -> Rss {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/self/status"))
            * 1024
    };
    Rss {
        total: field("VmRSS:"),
        anon: field("RssAnon:"),
        file: field("RssFile:"),
        peak: field("VmHWM:"),
    }
}

/// Restarts VmHWM from the current RSS, so a peak measures one load (Linux 4.0+; where the
/// kernel refuses, peaks count from the start of the process and say so).
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

/// Logits of a short prompt (a prefill of 7 rows) and of one decode token after it: steps
/// small enough that `auto` runs them the way it runs decode, where reading the weights is
/// what costs.
fn logits(model: &LlamaModel, kv: &mut KvCache) -> Vec<f32> {
    let prompt = [1u32, 15, 300, 4095, 77, 8015, 2024];
    let table: Vec<u32> = (0..kv.num_blocks() as u32).collect();
    let mut batch = StepBatch::new(BLOCK);
    batch.push_sequence(&prompt, 0, &table, true);
    let mut out = model
        .forward(&batch, kv)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    batch.clear();
    batch.push_sequence(&[42], prompt.len(), &table, true);
    out.extend(
        model
            .forward(&batch, kv)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap(),
    );
    out
}

#[test]
fn eight_b_layer_shapes_load_without_an_f32_copy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llama-8b-shapes-2-layers-q4_k_m.gguf");
    let specs = tensors();
    let started = Instant::now();
    let file_bytes = write_gguf(&path, &specs).unwrap();
    let written_in = started.elapsed();
    let layer_file_bytes: usize = specs
        .iter()
        .filter(|t| t.name.starts_with("blk.0."))
        .map(TensorSpec::bytes)
        .sum();
    let kv_blocks = KV_TOKENS / BLOCK;

    // auto, as the server loads it.
    let peak_reset = reset_peak();
    let before = rss();
    let started = Instant::now();
    let model = LlamaModel::load(&path, &LoadOptions::default()).unwrap();
    let auto_load_time = started.elapsed();
    let loaded = rss();
    let config = model.config().clone();
    assert_eq!(
        (config.hidden_size, config.num_layers, config.vocab_size),
        (HIDDEN, LAYERS, VOCAB)
    );
    let kv_bytes = (model.kv_dtype().bytes_per_token(&config) * KV_TOKENS) as u64;
    let kv_dtype = model.kv_dtype();
    // Held until after the measurement: serving holds its whole cache all along.
    let mut kv = model.new_kv_cache(kv_blocks, BLOCK).unwrap();
    let started = Instant::now();
    let auto_logits = logits(&model, &mut kv);
    let auto_forward_time = started.elapsed();
    let after_forward = rss();
    drop((model, kv));

    // f32: the reference numbers, and what an f32 copy costs.
    let dropped = rss();
    reset_peak();
    let started = Instant::now();
    let options = LoadOptions {
        weights: WeightsKind::F32,
        ..LoadOptions::default()
    };
    let f32_model = LlamaModel::load(&path, &options).unwrap();
    let f32_load_time = started.elapsed();
    let f32_loaded = rss();
    drop(f32_model);
    // quantized: `auto`'s arithmetic for the K-quants, so its numbers bit for bit.
    let options = LoadOptions {
        weights: WeightsKind::Quantized,
        ..LoadOptions::default()
    };
    let quantized_model = LlamaModel::load(&path, &options).unwrap();
    let mut kv = quantized_model.new_kv_cache(kv_blocks, BLOCK).unwrap();
    let quantized_logits = logits(&quantized_model, &mut kv);
    drop((quantized_model, kv));

    let grown = loaded.total.saturating_sub(before.total);
    let grown_with_kv = after_forward.total.saturating_sub(before.total);
    let f32_grown = f32_loaded.total.saturating_sub(dropped.total);
    let budget = file_bytes + kv_bytes + file_bytes * 15 / 100 + (64 << 20);
    let peak_note = if peak_reset {
        ""
    } else {
        " (peaks since process start: /proc/self/clear_refs refused)"
    };
    eprintln!(
        "file {:.1} MiB ({} layers of {:.1} MiB, vocab tensors {:.1} MiB), written in {written_in:.1?}\n\
         KV cache for {KV_TOKENS} tokens ({:?}): {:.1} MiB\n\
         auto: loaded in {auto_load_time:.1?}, RSS +{:.1} MiB (anon +{:.1}, file +{:.1}), peak +{:.1} MiB{peak_note}; \
         with KV cache and a forward (in {auto_forward_time:.1?}) +{:.1} MiB; budget {:.1} MiB\n\
         f32: loaded in {f32_load_time:.1?}, RSS +{:.1} MiB, peak +{:.1} MiB\n\
         RSS growth per layer (with its share of the vocabulary tensors): auto {:.1} MiB, f32 {:.1} MiB, file {:.1} MiB\n\
         an 8B Q4_K_M (32 layers, vocab 128256; {SCALE}x this): file ~{:.2} GiB, auto ~{:.2} GiB resident, \
         f32 ~{:.2} GiB, KV cache {:.2} GiB for {KV_TOKENS} tokens",
        mib(file_bytes),
        LAYERS,
        layer_file_bytes as f64 / MIB,
        specs
            .iter()
            .filter(|t| !t.name.starts_with("blk."))
            .map(TensorSpec::bytes)
            .sum::<usize>() as f64
            / MIB,
        kv_dtype,
        mib(kv_bytes),
        mib(grown),
        mib(loaded.anon.saturating_sub(before.anon)),
        mib(loaded.file.saturating_sub(before.file)),
        mib(loaded.peak.saturating_sub(before.total)),
        mib(grown_with_kv),
        mib(budget),
        mib(f32_grown),
        mib(f32_loaded.peak.saturating_sub(dropped.total)),
        mib(grown) / LAYERS as f64,
        mib(f32_grown) / LAYERS as f64,
        mib(file_bytes) / LAYERS as f64,
        mib(file_bytes * SCALE as u64) / 1024.0,
        mib(grown * SCALE as u64) / 1024.0,
        mib(f32_grown * SCALE as u64) / 1024.0,
        mib(kv_bytes * SCALE as u64) / 1024.0,
    );

    let mut failures = Vec::new();
    let (lo, hi) = auto_logits
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    eprintln!("auto logits range from {lo} to {hi}");
    if let Some(x) = auto_logits.iter().find(|x| !x.is_finite()) {
        failures.push(format!("auto logits are not finite ({x})"));
    }
    // Logits all alike would make the comparison with quantized below say nothing.
    if hi - lo < 1e-2 {
        failures.push(format!("auto logits barely vary ({lo} to {hi})"));
    }
    if grown_with_kv > budget {
        failures.push(format!(
            "auto grew the process by {:.1} MiB, more than the file ({:.1} MiB) and the KV cache \
             ({:.1} MiB) with 15% + 64 MiB of margin ({:.1} MiB): the weights are held in a wider \
             format than the file's ({:.2}x the file)",
            mib(grown_with_kv),
            mib(file_bytes),
            mib(kv_bytes),
            mib(budget),
            grown as f64 / file_bytes as f64
        ));
    }
    let differing = auto_logits
        .iter()
        .zip(&quantized_logits)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    if differing > 0 {
        let max_diff = auto_logits
            .iter()
            .zip(&quantized_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        failures.push(format!(
            "{differing} of {} logits differ between auto and quantized (largest difference {max_diff})",
            auto_logits.len()
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
