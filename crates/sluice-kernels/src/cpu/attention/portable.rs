//! Paged attention in plain Rust, for CPUs and shapes the AVX-512 kernel does not cover. It
//! reads the same blocks in place, and computes each query on its own: its scores, softmax and
//! weighted sum take the same operations in the same order whatever else is in the step, so a
//! sequence decoded one token at a time gets exactly what recomputing it in one prefill gets
//! (the candle reference, whose matmuls sum in an order that depends on the row count, does
//! not). The inner loops run along keys or along the head dimension, which the compiler
//! vectorizes.

use super::{Kernel, KvElem, WorkItem};
use crate::disjoint::DisjointSlice;
use crate::paged::KvLayout;

/// How the portable kernel reads one cache element as f32, for each way a cache holds them.
pub(super) trait KvRead: Sync {
    /// Dimension `i` of the key at `off` in the block and head whose values start at `base`
    /// ([`KvLayout::block_head_offset`]).
    fn key(&self, base: usize, i: usize, off: usize) -> f32;
    /// Dimension `i` of the value at `off` in the block and head starting at `base`.
    fn value(&self, base: usize, off: usize, i: usize) -> f32;
}

/// A cache of f32 or f16 elements in [`KvLayout`] order.
pub(super) struct Plain<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    pub layout: &'a KvLayout,
}

impl<E: KvElem> KvRead for Plain<'_, E> {
    fn key(&self, base: usize, i: usize, off: usize) -> f32 {
        self.k[base + i * self.layout.block_size + off].into()
    }

    fn value(&self, base: usize, off: usize, i: usize) -> f32 {
        self.v[base + off * self.layout.head_dim + i].into()
    }
}

impl Kernel<'_> {
    /// One work item's rows of the output, as [`Kernel::run`] computes them with AVX-512.
    pub(super) fn run_portable(
        &self,
        item: &WorkItem,
        kv: &impl KvRead,
        scratch: &mut Vec<f32>,
        out: DisjointSlice<'_, f32>,
    ) {
        let s = &self.sequences[item.seq];
        let table = s.block_table(self.block_tables);
        let (d, bs) = (self.layout.head_dim, self.layout.block_size);
        let group = self.heads / self.layout.num_kv_heads;
        let first_pos = s.context_len - s.query_len;
        // Keys `lowest..end` are the ones any query of the item sees (a sliding window's
        // start for the first one, the last one's end: ends never decrease).
        let lowest = self.window_start(first_pos + item.query_begin);
        let last = item.query_end - 1;
        let end = self.key_end(s.query_start + last, first_pos + last);
        let keys = end - lowest;
        // This KV head's keys dimension-major (`kf[i * keys + j]`) and values key-major, in f32,
        // key `lowest + j` at `j`.
        scratch.resize(2 * keys * d + keys + d, 0.0);
        let (kf, rest) = scratch.split_at_mut(keys * d);
        let (vf, rest) = rest.split_at_mut(keys * d);
        let (scores, acc) = rest.split_at_mut(keys);
        for j in 0..keys {
            let key = lowest + j;
            let base = self
                .layout
                .block_head_offset(table[key / bs] as usize, item.kv_head);
            let off = key % bs;
            for i in 0..d {
                kf[i * keys + j] = kv.key(base, i, off);
            }
            for (i, x) in vf[j * d..][..d].iter_mut().enumerate() {
                *x = kv.value(base, off, i);
            }
        }
        for query in item.query_begin..item.query_end {
            let pos = first_pos + query;
            // This query's keys, as indices of the gathered ones.
            let token = s.query_start + query;
            let seen = self.window_start(pos) - lowest..self.key_end(token, pos) - lowest;
            for g in 0..group {
                let head = item.kv_head * group + g;
                let q = &self.q[(token * self.heads + head) * d..][..d];
                let scores = &mut scores[..seen.len()];
                scores.fill(0.0);
                for (i, &x) in q.iter().enumerate() {
                    for (sc, &key) in scores.iter_mut().zip(&kf[i * keys..][seen.clone()]) {
                        *sc += x * key;
                    }
                }
                // A sink (a key without a value) counts in the maximum and the sum.
                let sink = self.sinks.map(|s| s[head]);
                let mut max = sink.unwrap_or(f32::NEG_INFINITY);
                for sc in scores.iter_mut() {
                    *sc *= self.scale;
                    max = max.max(*sc);
                }
                let mut sum = sink.map_or(0.0, |s| (s - max).exp());
                for sc in scores.iter_mut() {
                    *sc = (*sc - max).exp();
                    sum += *sc;
                }
                acc.fill(0.0);
                for (j, &p) in scores.iter().enumerate() {
                    for (a, &x) in acc.iter_mut().zip(&vf[(seen.start + j) * d..][..d]) {
                        *a += p * x;
                    }
                }
                // SAFETY: the row is inside `out` (`paged_attention` checked its size against
                // the tokens and heads), and only this item writes this (token, head) row.
                let dst = unsafe { out.slice_mut((token * self.heads + head) * d, d) };
                for (o, a) in dst.iter_mut().zip(acc.iter()) {
                    *o = a / sum;
                }
            }
        }
    }
}
