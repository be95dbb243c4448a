//! Paged attention on the CPU, f16 cache, 2 threads of rayon's pool: a prefill of one prompt
//! (every query attends causally to the keys before it) and decode steps (64 sequences at 256
//! tokens of context, 16 at 2048),
//! on the head shapes of SmolLM2-135M (9 query heads over 3 KV heads of 64), Qwen2.5-0.5B (14
//! over 2 of 64), Qwen2.5-1.5B (12 over 2 of 128) and Qwen2.5-3B (16 over 2 of 128). Prints ms per call and GFLOP/s (4 x head_dim FLOP per
//! query head and key it sees); asserts nothing. `SLUICE_BENCH_PREFILL=512,2048` picks the
//! prompt lengths, `SLUICE_BENCH_ONLY=SmolLM2` the shapes whose name starts so.

use std::time::Instant;

use half::f16;
use sluice_kernels::cpu::attention::paged_attention;
use sluice_kernels::testing::random_values;
use sluice_kernels::{AttentionShape, KvLayout, SequenceSlice};

const BLOCK: usize = 16;

/// Median seconds per call of `f` over at least 5 calls and half a second.
fn median_seconds(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < 5 || start.elapsed().as_secs_f64() < 0.5 {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// One step of `sequences` given as (query tokens, context length) on a cache of random
/// values: ms per call and GFLOP/s.
fn bench(
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    sequences: &[(usize, usize)],
) -> (f64, f64) {
    let blocks: usize = sequences.iter().map(|&(_, c)| c.div_ceil(BLOCK)).sum();
    let layout = KvLayout {
        num_blocks: blocks,
        block_size: BLOCK,
        num_kv_heads: kv_heads,
        head_dim,
    };
    let (mut slices, mut tables, mut query_start, mut flop) = (Vec::new(), Vec::new(), 0, 0.0);
    for &(query_len, context_len) in sequences {
        let table_len = context_len.div_ceil(BLOCK);
        slices.push(SequenceSlice {
            query_start,
            query_len,
            context_len,
            block_table_start: tables.len(),
            block_table_len: table_len,
        });
        tables.extend((tables.len()..tables.len() + table_len).map(|b| b as u32));
        query_start += query_len;
        let seen: usize = (context_len - query_len + 1..=context_len).sum();
        flop += (4 * heads * head_dim * seen) as f64;
    }
    let shape = AttentionShape {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window: None,
    };
    let n = layout.values_per_layer();
    let k: Vec<f16> = random_values(n, 2)
        .iter()
        .map(|&x| f16::from_f32(x))
        .collect();
    let v: Vec<f16> = random_values(n, 3)
        .iter()
        .map(|&x| f16::from_f32(x))
        .collect();
    let q = random_values(query_start * heads * head_dim, 1);
    let mut out = vec![0f32; q.len()];
    let seconds = median_seconds(|| {
        paged_attention(
            &q,
            &k,
            &v,
            &layout,
            &slices,
            &[],
            &tables,
            &shape,
            None,
            &mut out,
        )
        .unwrap();
    });
    (seconds * 1e3, flop / seconds / 1e9)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build_global()
        .unwrap();
    let prefills: Vec<usize> = std::env::var("SLUICE_BENCH_PREFILL")
        .unwrap_or_else(|_| "512,2048".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("SLUICE_BENCH_PREFILL: token counts")
        })
        .collect();
    let shapes = [
        ("SmolLM2-135M", 9, 3, 64),
        ("Qwen2.5-0.5B", 14, 2, 64),
        ("Qwen2.5-1.5B", 12, 2, 128),
        ("Qwen2.5-3B", 16, 2, 128),
    ];
    println!("| heads (query/KV x dim) | step | ms/call (median) | GFLOP/s |");
    println!("| --- | --- | ---: | ---: |");
    let only = std::env::var("SLUICE_BENCH_ONLY").unwrap_or_default();
    for (name, heads, kv_heads, head_dim) in shapes {
        if !name.starts_with(&only) {
            continue;
        }
        let label = format!("{name} {heads}/{kv_heads}x{head_dim}");
        for &p in &prefills {
            let (ms, gflops) = bench(heads, kv_heads, head_dim, &[(p, p)]);
            println!("| {label} | prefill {p} | {ms:.2} | {gflops:.1} |");
        }
        for (seqs, context) in [(64, 256), (16, 2048)] {
            let (ms, gflops) = bench(heads, kv_heads, head_dim, &vec![(1, context); seqs]);
            println!("| {label} | decode {seqs} x ctx {context} | {ms:.2} | {gflops:.1} |");
        }
    }
}
