//! Paged attention for CPU tensors that reads K/V blocks where they lie: no gather, no repeat
//! of K/V over the query heads of a group, one pass of online softmax per block of keys.
//!
//! Work is split into items of (sequence, KV head, run of queries) and spread over rayon's pool:
//! a decode step of B sequences gives `B * num_kv_heads` items, a long prefill chunk gives many
//! query runs. Within an item, each key block is loaded once and used by every query head of
//! the group and every query of the run while it is hot in cache.

use std::cell::RefCell;

use candle_core::{Device, Storage, Tensor};
use rayon::prelude::*;

use super::AttentionShape;
use crate::batch::StepBatch;
use crate::error::{ModelError, Result};

/// Queries of one sequence handled by one work item: enough to reuse each key block several
/// times, few enough that a long prompt still spreads over all cores.
const QUERY_RUN: usize = 16;

#[derive(Clone, Copy)]
struct WorkItem {
    seq: usize,
    kv_head: usize,
    query_begin: usize,
    query_end: usize,
}

/// The output buffer, written by many threads at disjoint offsets.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn cpu_f32<'a>(t: &'a Tensor, what: &str) -> Result<(candle_core::StorageRef<'a>, usize)> {
    let (storage, layout) = t.storage_and_layout();
    if !layout.is_contiguous() {
        return Err(ModelError::InvalidBatch(format!(
            "{what} must be contiguous for the CPU attention kernel"
        )));
    }
    match &*storage {
        Storage::Cpu(_) => {}
        _ => {
            return Err(ModelError::InvalidBatch(format!(
                "{what} is not on the CPU; use the reference attention backend"
            )))
        }
    }
    Ok((storage, layout.start_offset()))
}

fn as_f32(storage: &Storage) -> Result<&[f32]> {
    match storage {
        Storage::Cpu(cpu) => Ok(cpu.as_slice::<f32>()?),
        _ => unreachable!("checked by cpu_f32"),
    }
}

pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    batch: &StepBatch,
    shape: &AttentionShape,
) -> Result<Tensor> {
    let q = q.contiguous()?;
    let (h, kvh, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
    let t = batch.num_tokens();
    if q.dims() != [t, h, d] {
        return Err(ModelError::InvalidBatch(format!(
            "q has shape {:?}, expected [{t}, {h}, {d}]",
            q.dims()
        )));
    }
    let (q_store, q_off) = cpu_f32(&q, "q")?;
    let (k_store, k_off) = cpu_f32(k_cache, "the K cache")?;
    let (v_store, v_off) = cpu_f32(v_cache, "the V cache")?;
    let q_data = &as_f32(&q_store)?[q_off..];
    let k_data = &as_f32(&k_store)?[k_off..];
    let v_data = &as_f32(&v_store)?[v_off..];

    let items: Vec<WorkItem> = batch
        .sequences
        .iter()
        .enumerate()
        .flat_map(|(seq, s)| {
            (0..kvh).flat_map(move |kv_head| {
                (0..s.query_len)
                    .step_by(QUERY_RUN)
                    .map(move |query_begin| WorkItem {
                        seq,
                        kv_head,
                        query_begin,
                        query_end: (query_begin + QUERY_RUN).min(s.query_len),
                    })
            })
        })
        .collect();

    let mut out = vec![0f32; t * h * d];
    let out_ptr = OutPtr(out.as_mut_ptr());
    let kernel = Kernel {
        q: q_data,
        k: k_data,
        v: v_data,
        batch,
        heads: h,
        kv_heads: kvh,
        head_dim: d,
        scale: shape.scale,
    };
    items.par_iter().for_each(|item| {
        SCRATCH.with(|scratch| kernel.run(item, &mut scratch.borrow_mut(), out_ptr));
    });
    drop((q_store, k_store, v_store));
    Ok(Tensor::from_vec(out, (t, h * d), &Device::Cpu)?)
}

struct Kernel<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    batch: &'a StepBatch,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
}

impl Kernel<'_> {
    fn run(&self, item: &WorkItem, scratch: &mut Vec<f32>, out: OutPtr) {
        let d = self.head_dim;
        let group = self.heads / self.kv_heads;
        let bs = self.batch.block_size;
        let seq = &self.batch.sequences[item.seq];
        let table = self.batch.block_table(seq);
        let first_pos = seq.context_len - seq.query_len;
        let rows = (item.query_end - item.query_begin) * group;

        // Per (query, head) row: running max, running sum, accumulator; then the block's scores.
        scratch.clear();
        scratch.resize(rows * (2 + d) + bs, 0.0);
        let (state, scores) = scratch.split_at_mut(rows * (2 + d));
        let (maxes, rest) = state.split_at_mut(rows);
        let (sums, accs) = rest.split_at_mut(rows);
        maxes.fill(f32::NEG_INFINITY);

        let last_pos = first_pos + item.query_end - 1;
        for (b, &block) in table.iter().enumerate().take(last_pos / bs + 1) {
            let key_base = b * bs;
            for qi in item.query_begin..item.query_end {
                let pos = first_pos + qi;
                if pos < key_base {
                    continue;
                }
                let n_keys = (pos + 1 - key_base).min(bs);
                let token = seq.query_start + qi;
                for g in 0..group {
                    let head = item.kv_head * group + g;
                    let qv = &self.q[(token * self.heads + head) * d..][..d];
                    let row = (qi - item.query_begin) * group + g;
                    let mut block_max = f32::NEG_INFINITY;
                    for (slot_off, s) in scores[..n_keys].iter_mut().enumerate() {
                        let slot = block as usize * bs + slot_off;
                        let kv = &self.k[(slot * self.kv_heads + item.kv_head) * d..][..d];
                        *s = dot(qv, kv) * self.scale;
                        block_max = block_max.max(*s);
                    }
                    let acc = &mut accs[row * d..][..d];
                    let new_max = maxes[row].max(block_max);
                    if maxes[row] != new_max {
                        let correction = (maxes[row] - new_max).exp();
                        sums[row] *= correction;
                        acc.iter_mut().for_each(|a| *a *= correction);
                        maxes[row] = new_max;
                    }
                    for (slot_off, &s) in scores[..n_keys].iter().enumerate() {
                        let p = (s - new_max).exp();
                        sums[row] += p;
                        let slot = block as usize * bs + slot_off;
                        axpy(
                            acc,
                            p,
                            &self.v[(slot * self.kv_heads + item.kv_head) * d..][..d],
                        );
                    }
                }
            }
        }

        for qi in item.query_begin..item.query_end {
            let token = seq.query_start + qi;
            for g in 0..group {
                let row = (qi - item.query_begin) * group + g;
                let head = item.kv_head * group + g;
                let inv = 1.0 / sums[row];
                // SAFETY: every (token, head) output row belongs to exactly one work item, and
                // `out` outlives the parallel loop that calls us.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(out.0.add((token * self.heads + head) * d), d)
                };
                for (o, a) in dst.iter_mut().zip(&accs[row * d..][..d]) {
                    *o = a * inv;
                }
            }
        }
    }
}

/// Lane-wise partial sums so the compiler emits wide FMAs (a plain fold is a serial chain).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let chunks = a.len() / LANES;
    for c in 0..chunks {
        let (ca, cb) = (&a[c * LANES..][..LANES], &b[c * LANES..][..LANES]);
        for l in 0..LANES {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * LANES..a.len() {
        sum += a[i] * b[i];
    }
    sum
}

#[inline(always)]
fn axpy(acc: &mut [f32], p: f32, v: &[f32]) {
    for (a, x) in acc.iter_mut().zip(v) {
        *a += p * x;
    }
}
