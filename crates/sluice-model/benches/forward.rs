//! Forward-step time of the real model: decode batches of B sequences at 256 tokens of context,
//! and a prefill of one prompt (512 tokens unless told), for each weight kind. Prints a table;
//! asserts nothing.
//!
//! `SLUICE_BENCH_WEIGHTS=f32,auto` picks the weight kinds (`auto-amx`: auto with its f32
//! panels' steps from 16 rows on AMX tiles, `LoadOptions::amx_min_rows`; `auto/q8_0`: auto with an 8-bit KV cache instead of f16); `SLUICE_BENCH_BATCHES=1,64`
//! the sizes; `SLUICE_BENCH_PREFILL=2048` the prompt's length (`0` skips the prefill);
//! `SLUICE_BENCH_VERIFY=1,2,5` steps of one sequence computing that many tokens with a logits
//! row each (speculative decoding's verification of `n - 1` guesses; empty by default);
//! `SLUICE_BENCH_TIER=avx2` (`avx512`, `vnni`, `amx`) keeps every kernel at or below that tier,
//! to time what a CPU with only those instructions runs.
//! `SLUICE_BENCH_LORA=a.gguf,b.gguf` loads those LoRA adapters into slots 1.. and gives
//! decode sequence `s` the adapter `s % n` (the prefill and verification steps the first):
//! the low-rank update's cost is the difference from the same run without.
//! Times are the median and the fastest run (the shared 2-core host is often busy). For a
//! mixture of experts the last column is the share of the experts' weights a step read (experts
//! at least one row chose, over every layer's experts); `-` for a dense model.

// getrusage through libc, for the CPU-time mode.
#![allow(unsafe_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sluice_kernels::cpu::KernelTier;
use sluice_model::{
    KvCache, KvDtype, LlamaModel, LoadOptions, LoraAdapter, StepBatch, StepScratch, WeightsKind,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BLOCK: usize = 16;
const CONTEXT: usize = 256;

fn model_path() -> PathBuf {
    std::env::var_os("SLUICE_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}

fn list<T: std::str::FromStr>(var: &str, default: &str) -> Vec<T>
where
    T::Err: std::fmt::Debug,
{
    std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect()
}

/// CPU time this process has used (all threads).
fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// CPU milliseconds per call of the last [`time`]: unlike wall time, barely moved by other
/// processes on the machine, so it compares builds on a busy host.
static CPU_MS: std::sync::Mutex<f64> = std::sync::Mutex::new(0.0);

/// Median and fastest time of `f` over enough runs to fill about two seconds (at least 3).
fn time(mut f: impl FnMut()) -> (Duration, Duration) {
    f(); // warm-up: first-touch of buffers, rayon pool start
    let mut samples = Vec::new();
    let cpu_start = cpu_time();
    let start = Instant::now();
    while samples.len() < 3 || (start.elapsed() < Duration::from_secs(2) && samples.len() < 50) {
        let t = Instant::now();
        f();
        samples.push(t.elapsed());
    }
    *CPU_MS.lock().unwrap() = (cpu_time() - cpu_start).as_secs_f64() * 1e3 / samples.len() as f64;
    samples.sort();
    (samples[samples.len() / 2], samples[0])
}

fn main() {
    let path = model_path();
    assert!(
        path.is_file(),
        "model not found at {}: run scripts/fetch-model.sh",
        path.display()
    );
    let kinds: Vec<String> = list("SLUICE_BENCH_WEIGHTS", "f32,quantized,auto");
    let batches: Vec<usize> = list("SLUICE_BENCH_BATCHES", "1,8,32,64");
    let prefill: usize = list("SLUICE_BENCH_PREFILL", "512")[0];
    let verify: Vec<usize> = list("SLUICE_BENCH_VERIFY", "");
    // Every kernel at or below a tier, chosen before any model loads (matrices pick their
    // kernel at load): what a CPU with only those instructions runs.
    if let Some(tier) = std::env::var("SLUICE_BENCH_TIER")
        .ok()
        .filter(|t| !t.is_empty())
    {
        let tier = match tier.as_str() {
            "avx2" => KernelTier::Avx2,
            "avx512" => KernelTier::Avx512,
            "vnni" => KernelTier::Avx512Vnni,
            "amx" => KernelTier::Amx,
            other => panic!("SLUICE_BENCH_TIER: unknown tier {other} (avx2, avx512, vnni, amx)"),
        };
        sluice_kernels::cpu::limit_kernels(tier);
        println!("kernels limited to {tier:?}");
    }
    println!("threads: {}", rayon::current_num_threads());
    println!("| weights | step | tokens | ms/step (median) | tokens/s | ms/step (fastest) | tokens/s | CPU ms/step | experts read |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for kind in kinds {
        // `KIND/q8_0`: the weight kind with an 8-bit KV cache (f16 otherwise).
        let (weights_name, kv_dtype) = match kind.split_once('/') {
            Some((w, "q8_0")) => (w, KvDtype::Q8_0),
            Some((w, "f32")) => (w, KvDtype::F32),
            Some((_, other)) => panic!("unknown KV cache type {other} (f32 or q8_0)"),
            None => (kind.as_str(), LoadOptions::default().kv_dtype),
        };
        let (weights, amx_min_rows) = match weights_name {
            "auto-amx" => (
                WeightsKind::Auto,
                Some(sluice_model::weights::AUTO_AMX_MIN_ROWS),
            ),
            k => (k.parse().unwrap(), None),
        };
        let mut model = LlamaModel::load(
            &path,
            &LoadOptions {
                weights,
                amx_min_rows,
                kv_dtype,
                ..LoadOptions::default()
            },
        )
        .unwrap();
        let loras: Vec<PathBuf> = list("SLUICE_BENCH_LORA", "");
        for (i, path) in loras.iter().enumerate() {
            let adapter = LoraAdapter::load(path, model.config(), sluice_model::lora::MAX_RANK)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            model
                .set_adapter(i as u16 + 1, Some(std::sync::Arc::new(adapter)))
                .unwrap();
        }
        // The adapter slot of a step's sequence `s`; rows repeat their sequence's slot.
        let slot = |s: usize| (s % loras.len().max(1)) as u16 + 1;
        let lora_rows = |batch: &mut StepBatch, slots: &[u16]| {
            if loras.is_empty() {
                return;
            }
            batch.lora_slots.clear();
            batch.lora_slots.extend_from_slice(slots);
        };
        let blocks_per_seq = (CONTEXT + 1).div_ceil(BLOCK);
        let max_b = batches.iter().copied().max().unwrap_or(1);
        let mut kv = model
            .new_kv_cache((max_b * blocks_per_seq).max(prefill.div_ceil(BLOCK)), BLOCK)
            .unwrap();
        let mut batch = StepBatch::new(BLOCK);
        // A hybrid's recurrent states: sequence `s` of a step in state `s` (the cache holds one
        // a block).
        batch.groups = kv.step_groups();
        let recurrent = kv.recurrent_group();
        let state = |batch: &mut StepBatch, s: usize| {
            if let Some(g) = recurrent {
                batch.push_group_state(g, s as u32);
            }
        };
        // Buffers kept across steps, as the engine keeps them.
        let mut scratch = StepScratch::default();
        for &b in &batches {
            // Cache contents do not change the work, so the contexts are not prefilled.
            batch.clear();
            for s in 0..b {
                let table: Vec<u32> = (0..blocks_per_seq)
                    .map(|i| (s * blocks_per_seq + i) as u32)
                    .collect();
                batch.push_sequence(&[(100 + s) as u32], CONTEXT, &table, true);
                state(&mut batch, s);
            }
            let slots: Vec<u16> = (0..b).map(slot).collect();
            lora_rows(&mut batch, &slots);
            time_step(
                &model,
                &batch,
                &mut kv,
                &mut scratch,
                &kind,
                &format!("decode B={b} @ctx {CONTEXT}"),
                b,
            );
        }
        for &n in &verify {
            batch.clear();
            let tokens: Vec<u32> = (0..n as u32).map(|i| 100 + i).collect();
            let table: Vec<u32> = (0..blocks_per_seq as u32).collect();
            batch.push_sequence_rows(&tokens, CONTEXT - n, &table, n);
            state(&mut batch, 0);
            lora_rows(&mut batch, &vec![slot(0); n]);
            time_step(
                &model,
                &batch,
                &mut kv,
                &mut scratch,
                &kind,
                &format!("verify {n} @ctx {CONTEXT}"),
                n,
            );
        }
        if prefill == 0 {
            continue;
        }
        batch.clear();
        let tokens: Vec<u32> = (0..prefill as u32).map(|i| 100 + i % 1000).collect();
        let table: Vec<u32> = (0..prefill.div_ceil(BLOCK) as u32).collect();
        batch.push_sequence(&tokens, 0, &table, true);
        state(&mut batch, 0);
        lora_rows(&mut batch, &vec![slot(0); prefill]);
        time_step(
            &model,
            &batch,
            &mut kv,
            &mut scratch,
            &kind,
            &format!("prefill {prefill}"),
            prefill,
        );
    }
}

/// Times `batch` (of `tokens` tokens) and prints its table row.
fn time_step(
    model: &LlamaModel,
    batch: &StepBatch,
    kv: &mut KvCache,
    scratch: &mut StepScratch,
    kind: &str,
    step: &str,
    tokens: usize,
) {
    let (t, fastest) = time(|| {
        model.forward_step_in(batch, kv, scratch).unwrap();
    });
    let share = scratch
        .expert_share()
        .map_or_else(|| "-".to_string(), |s| format!("{:.1}%", s * 100.0));
    println!(
        "| {kind} | {step} | {tokens} | {:.2} | {:.1} | {:.2} | {:.1} | {:.1} | {share} |",
        t.as_secs_f64() * 1e3,
        tokens as f64 / t.as_secs_f64(),
        fastest.as_secs_f64() * 1e3,
        tokens as f64 / fastest.as_secs_f64(),
        *CPU_MS.lock().unwrap()
    );
}
