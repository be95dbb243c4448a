//! Cost of the scheduler's per-step bookkeeping with a mock model: `schedule`, filling the
//! `StepBatch`, `commit`, and the engine's finish checks. Target: < 1 ms per step at 256 running
//! sequences. Run with `cargo bench -p sluice-engine --bench scheduler`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use sluice_engine::testing::xorshift;
use sluice_engine::{KvGroupSpec, Scheduler, SchedulerConfig, WindowPool};
use sluice_model::StepBatch;

fn tokens(seed: u64, len: usize) -> Vec<u32> {
    xorshift(seed)
        .take(len)
        .map(|x| (x % 32_000) as u32)
        .collect()
}

struct Timings(Vec<Duration>);

impl Timings {
    fn report(&mut self, name: &str, extra: &str) {
        self.0.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let mean = self.0.iter().sum::<Duration>() / self.0.len() as u32;
        let pct = |p: f64| self.0[((self.0.len() - 1) as f64 * p) as usize];
        println!(
            "{name}: {} steps, mean {:.1} us/step, p50 {:.1} us, p99 {:.1} us, max {:.1} us{extra}",
            self.0.len(),
            us(mean),
            us(pct(0.5)),
            us(pct(0.99)),
            us(*self.0.last().unwrap()),
        );
    }
}

/// One engine step minus the forward: returns (tokens computed, sequences scheduled).
fn step(
    s: &mut Scheduler,
    batch: &mut StepBatch,
    sampled: &mut Vec<u32>,
    finished: &mut Vec<sluice_engine::SeqId>,
    tick: u32,
) -> (usize, usize) {
    let out = s.schedule();
    let (num_tokens, num_seqs) = (out.num_tokens(), out.scheduled().len());
    s.fill_step_batch(batch);
    black_box(&*batch);
    sampled.clear();
    sampled.extend(
        (0..s.output().num_samples() as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) ^ tick) % 32_000),
    );
    s.commit(sampled).unwrap();
    finished.clear();
    for row in s.output().sampling() {
        let seq = s.scheduled_sequence(row).unwrap();
        if seq.num_generated() >= seq.max_tokens() {
            finished.push(row.seq_id);
        }
    }
    for &id in finished.iter() {
        s.finish(id);
    }
    (num_tokens, num_seqs)
}

/// 256 sequences decoding, contexts growing from 128 to ~1.1k tokens; with `window`, as a
/// model whose sliding-window layers have a pool of their own (blocks given back as the
/// windows move on).
fn steady_decode(window: Option<usize>) {
    let (max_num_seqs, max_num_batched_tokens, block_size) = (256, 8192, 16);
    let cfg = SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens,
        block_size,
        num_blocks: 256 * 80,
        max_model_len: 4096,
        speculation: None,
        kv_groups: window
            .map(|window| {
                KvGroupSpec::SlidingWindow(WindowPool {
                    num_blocks: WindowPool::blocks_for_all(
                        window,
                        max_num_seqs,
                        max_num_batched_tokens,
                        block_size,
                    ),
                    window,
                })
            })
            .into_iter()
            .collect(),
        max_loras: 0,
    };
    let mut s = Scheduler::new(cfg).unwrap();
    let mut batch = StepBatch::new(16);
    let (mut sampled, mut finished) = (Vec::new(), Vec::new());
    for r in 0..256 {
        s.add_request(r, tokens(r, 128), 1100, 1);
    }
    for tick in 0..8 {
        step(&mut s, &mut batch, &mut sampled, &mut finished, tick);
    }
    assert_eq!(s.num_running(), 256);
    let mut t = Timings(Vec::with_capacity(1000));
    for tick in 0..1000 {
        let start = Instant::now();
        let (num_tokens, num_seqs) = step(&mut s, &mut batch, &mut sampled, &mut finished, tick);
        t.0.push(start.elapsed());
        assert_eq!((num_tokens, num_seqs), (256, 256));
    }
    match window {
        None => t.report("steady decode, 256 running", ""),
        Some(w) => t.report(
            &format!("steady decode, 256 running, a window pool of {w} tokens"),
            "",
        ),
    }
}

/// 256 in flight with arrivals replacing finished requests: prompts of 64..512 tokens sharing
/// a 64-token system prompt, 16..128 new tokens, chunked prefill mixed with decodes, and a pool
/// that is tight enough to preempt.
fn churn() {
    let cfg = SchedulerConfig {
        max_num_seqs: 256,
        max_num_batched_tokens: 2048,
        block_size: 16,
        num_blocks: 256 * 16,
        max_model_len: 4096,
        speculation: None,
        kv_groups: Vec::new(),
        max_loras: 0,
    };
    let mut s = Scheduler::new(cfg).unwrap();
    let mut batch = StepBatch::new(16);
    let (mut sampled, mut finished) = (Vec::new(), Vec::new());
    let system = tokens(u64::MAX, 64);
    let mut next = 0u64;
    let mut add = |s: &mut Scheduler| {
        let r = next;
        next += 1;
        let mut p = system.clone();
        p.extend(tokens(r, (r as usize * 97) % 448));
        s.add_request(r, p, 16 + (r as usize * 31) % 112, 1);
    };
    let mut t = Timings(Vec::with_capacity(2000));
    let (mut total_tokens, mut total_seqs) = (0, 0);
    for tick in 0..2300 {
        while s.num_running() + s.num_waiting() < 300 {
            add(&mut s);
        }
        let start = Instant::now();
        let (num_tokens, num_seqs) = step(&mut s, &mut batch, &mut sampled, &mut finished, tick);
        if tick >= 300 {
            t.0.push(start.elapsed());
            total_tokens += num_tokens;
            total_seqs += num_seqs;
        }
    }
    let n = t.0.len();
    let stats = s.prefix_cache_stats();
    let extra = format!(
        "; per step {:.0} tokens over {:.0} sequences; {} preemptions; prefix hits {:.0}%",
        total_tokens as f64 / n as f64,
        total_seqs as f64 / n as f64,
        s.num_preemptions(),
        100.0 * stats.hits as f64 / stats.queries.max(1) as f64
    );
    t.report("churn, ~256 running", &extra);
}

fn main() {
    steady_decode(None);
    steady_decode(Some(128));
    churn();
}
