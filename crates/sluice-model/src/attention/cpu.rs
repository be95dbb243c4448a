//! Paged attention for CPU tensors that reads K/V blocks where they lie: no gather, no repeat
//! of K/V over the query heads of a group, one pass of online softmax per block of keys.
//!
//! Work is split into items of (sequence, KV head, run of queries) and spread over rayon's pool:
//! a decode step of B sequences gives `B * num_kv_heads` items, a long prefill chunk gives many
//! query runs. Within an item each key block is loaded once and used by every query head of the
//! group and every query of the run while it is hot in cache. The cache layout
//! ([`KvLayout`]) makes a block's scores a sweep of broadcast-FMAs over `block_size` lanes, and
//! the exponentials are computed a block at a time with a vectorizable polynomial.

use std::cell::RefCell;

use candle_core::{Device, Storage, Tensor};
use rayon::prelude::*;

use super::AttentionShape;
use crate::batch::StepBatch;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvLayout;

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
    if !matches!(&*storage, Storage::Cpu(_)) {
        return Err(ModelError::InvalidBatch(format!(
            "{what} is not on the CPU; use the reference attention backend"
        )));
    }
    Ok((storage, layout.start_offset()))
}

fn as_f32(storage: &Storage) -> Result<&[f32]> {
    match storage {
        Storage::Cpu(cpu) => Ok(cpu.as_slice::<f32>()?),
        _ => Err(ModelError::InvalidBatch(
            "attention input is not on the CPU".into(),
        )),
    }
}

pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    layout: &KvLayout,
    batch: &StepBatch,
    shape: &AttentionShape,
) -> Result<Tensor> {
    let q = q.contiguous()?;
    let (h, kvh, d) = (shape.num_heads, layout.num_kv_heads, layout.head_dim);
    let t = batch.num_tokens();
    if q.dims() != [t, h, d] || batch.block_size != layout.block_size || h % kvh != 0 {
        return Err(ModelError::InvalidBatch(format!(
            "q {:?} does not fit [{t}, {h}, {d}] over a cache of {kvh} KV heads and blocks of {}",
            q.dims(),
            layout.block_size
        )));
    }
    let (q_store, q_off) = cpu_f32(&q, "q")?;
    let (k_store, k_off) = cpu_f32(k_cache, "the K cache")?;
    let (v_store, v_off) = cpu_f32(v_cache, "the V cache")?;
    let kernel = Kernel {
        q: &as_f32(&q_store)?[q_off..],
        k: &as_f32(&k_store)?[k_off..],
        v: &as_f32(&v_store)?[v_off..],
        batch,
        layout,
        heads: h,
        scale: shape.scale,
    };

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
    items.par_iter().for_each(|item| {
        SCRATCH.with(|scratch| kernel.run(item, &mut scratch.borrow_mut(), out_ptr));
    });
    Ok(Tensor::from_vec(out, (t, h * d), &Device::Cpu)?)
}

struct Kernel<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    batch: &'a StepBatch,
    layout: &'a KvLayout,
    heads: usize,
    scale: f32,
}

impl Kernel<'_> {
    fn run(&self, item: &WorkItem, scratch: &mut Vec<f32>, out: OutPtr) {
        let (d, bs) = (self.layout.head_dim, self.layout.block_size);
        let group = self.heads / self.layout.num_kv_heads;
        let seq = &self.batch.sequences[item.seq];
        let table = self.batch.block_table(seq);
        let first_pos = seq.context_len - seq.query_len;
        let rows = (item.query_end - item.query_begin) * group;

        // Per (query, head) row: running max, running sum, accumulator; then one block's scores.
        scratch.clear();
        scratch.resize(rows * (2 + d) + bs, 0.0);
        let (state, scores) = scratch.split_at_mut(rows * (2 + d));
        let (maxes, rest) = state.split_at_mut(rows);
        let (sums, accs) = rest.split_at_mut(rows);
        maxes.fill(f32::NEG_INFINITY);

        let last_pos = first_pos + item.query_end - 1;
        for (b, &block) in table.iter().enumerate().take(last_pos / bs + 1) {
            let key_base = b * bs;
            let run = self.layout.block_head_offset(block as usize, item.kv_head);
            let k_block = &self.k[run..][..d * bs]; // [d][bs]
            let v_block = &self.v[run..][..bs * d]; // [bs][d]
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

                    block_scores(qv, k_block, bs, self.scale, scores);
                    let valid = &mut scores[..n_keys];
                    let block_max = max_of(valid);
                    let acc = &mut accs[row * d..][..d];
                    let new_max = maxes[row].max(block_max);
                    if maxes[row] != new_max {
                        let correction = exp_scalar(maxes[row] - new_max);
                        sums[row] *= correction;
                        acc.iter_mut().for_each(|a| *a *= correction);
                        maxes[row] = new_max;
                    }
                    valid.iter_mut().for_each(|s| *s -= new_max);
                    exp_in_place(valid);
                    sums[row] += valid.iter().sum::<f32>();
                    accumulate_values(acc, valid, v_block, d);
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

/// Lanes the inner loops are written in: one AVX-512 register of f32.
const LANES: usize = 16;

/// `out[t] = scale * q . k_t` for the `bs` keys of a block stored dimension-major. For blocks
/// of 16 keys the scores live in one register through the whole sweep over dimensions.
#[inline(always)]
fn block_scores(q: &[f32], k_block: &[f32], bs: usize, scale: f32, out: &mut [f32]) {
    if bs == LANES && q.len().is_multiple_of(4) {
        // Four independent FMA chains over interleaved dimensions hide the FMA latency.
        let mut s = [[0f32; LANES]; 4];
        for (dims, qd) in k_block.chunks_exact(4 * LANES).zip(q.chunks_exact(4)) {
            for (j, chain) in s.iter_mut().enumerate() {
                let row: &[f32; LANES] =
                    dims[j * LANES..][..LANES].try_into().expect("a block row");
                for t in 0..LANES {
                    chain[t] = qd[j].mul_add(row[t], chain[t]);
                }
            }
        }
        for t in 0..LANES {
            out[t] = ((s[0][t] + s[1][t]) + (s[2][t] + s[3][t])) * scale;
        }
    } else {
        let out = &mut out[..bs];
        out.fill(0.0);
        for (dim, &qd) in q.iter().enumerate() {
            for (o, k) in out.iter_mut().zip(&k_block[dim * bs..][..bs]) {
                *o = qd.mul_add(*k, *o);
            }
        }
        out.iter_mut().for_each(|o| *o *= scale);
    }
}

/// `acc += sum_t p[t] * v_t` over a block's values stored key-major, `head_dim` at a time in
/// register-wide chunks.
#[inline(always)]
fn accumulate_values(acc: &mut [f32], p: &[f32], v_block: &[f32], d: usize) {
    // Four register-wide chunks of the accumulator at a time: independent FMA chains, and
    // each value row is read once per chunk group.
    const GROUP: usize = 4 * LANES;
    let mut groups = acc.chunks_exact_mut(GROUP);
    for (g, group) in (&mut groups).enumerate() {
        let mut a = [[0f32; LANES]; 4];
        for (c, chunk) in a.iter_mut().enumerate() {
            chunk.copy_from_slice(&group[c * LANES..][..LANES]);
        }
        for (t, &pt) in p.iter().enumerate() {
            let v = &v_block[t * d + g * GROUP..][..GROUP];
            for (c, chunk) in a.iter_mut().enumerate() {
                let v: &[f32; LANES] = v[c * LANES..][..LANES].try_into().expect("a chunk");
                for l in 0..LANES {
                    chunk[l] = pt.mul_add(v[l], chunk[l]);
                }
            }
        }
        for (c, chunk) in a.iter().enumerate() {
            group[c * LANES..][..LANES].copy_from_slice(chunk);
        }
    }
    let done = d - d % GROUP;
    for (i, a) in groups.into_remainder().iter_mut().enumerate() {
        for (t, &pt) in p.iter().enumerate() {
            *a = pt.mul_add(v_block[t * d + done + i], *a);
        }
    }
}

/// The largest value, lane-wise so it vectorizes (`f32::max` keeps NaN rules that do not).
#[inline(always)]
fn max_of(xs: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for l in 0..LANES {
            m[l] = if chunk[l] > m[l] { chunk[l] } else { m[l] };
        }
    }
    for (l, &x) in chunks.remainder().iter().enumerate() {
        m[l] = if x > m[l] { x } else { m[l] };
    }
    m.iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })
}

/// `e^x` for `x <= 0` to about 2 ulp: range reduction by powers of two and a degree-6
/// polynomial (Cephes' expf), written branch-free so a loop over it vectorizes.
#[inline(always)]
fn exp_scalar(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    let x = x.max(-87.0);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[inline(always)]
fn exp_in_place(xs: &mut [f32]) {
    for x in xs {
        *x = exp_scalar(*x);
    }
}

#[cfg(test)]
mod tests {
    use super::exp_scalar;

    #[test]
    fn polynomial_exp_is_accurate_where_softmax_uses_it() {
        let mut worst = 0f32;
        for i in 0..=200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            let rel = ((exp_scalar(x) - x.exp()) / x.exp()).abs();
            worst = worst.max(rel);
        }
        assert!(worst < 1e-6, "relative error {worst}");
        assert_eq!(exp_scalar(0.0), 1.0);
        assert!(exp_scalar(f32::NEG_INFINITY) < 1e-37);
    }
}
