//! Paged attention for CPU tensors that reads K/V blocks where they lie: no gather, no repeat
//! of K/V over the query heads of a group, one pass of online softmax per chunk of keys.
//!
//! Work is split into items of (sequence, KV head, run of queries) and spread over rayon's pool:
//! a decode step of B sequences gives `B * num_kv_heads` items, a long prefill chunk gives many
//! query runs. Within an item each key chunk (16 keys, one register wide) is loaded once and
//! used by every query head of the group and every query of the run while it is in L1.
//!
//! At decode the kernel is bound by reading the cache (64 sequences x 256 tokens is ~25 MB per
//! layer in f32), which is why the cache may hold f16: half the bytes, converted in registers.
//! The [`KvLayout`] makes a chunk's scores `head_dim` broadcast-FMAs over 16 lanes with no
//! horizontal sums, and its values contiguous rows.
//!
//! Needs AVX-512 (F, BW, F16C) and a head dimension that is a multiple of 16; [`supports`] says
//! whether this machine and shape can use it, and the model picks the reference otherwise.

use std::cell::RefCell;

use candle_core::{DType, Device, Storage, Tensor};
use half::f16;
use rayon::prelude::*;

use super::AttentionShape;
use crate::batch::StepBatch;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvLayout;

/// Queries of one sequence handled by one work item: enough to reuse each key chunk several
/// times, few enough that a long prompt still spreads over all cores.
const QUERY_RUN: usize = 16;
/// Keys per chunk: one AVX-512 register of f32.
const LANES: usize = 16;
/// Largest query-heads-per-KV-head group with a specialised kernel.
const MAX_GROUP: usize = 8;

/// Whether the kernel runs on this CPU for heads of `head_dim` in groups of `group`.
pub fn supports(head_dim: usize, group: usize) -> bool {
    cpu_features() && head_dim.is_multiple_of(LANES) && (1..=MAX_GROUP).contains(&group)
}

fn cpu_features() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

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

fn cpu_storage<'a>(t: &'a Tensor, what: &str) -> Result<(candle_core::StorageRef<'a>, usize)> {
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

/// The cache's element type: f32 or f16.
enum Cache<'a> {
    F32(&'a [f32], &'a [f32]),
    F16(&'a [f16], &'a [f16]),
}

pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    layout: &KvLayout,
    batch: &StepBatch,
    shape: &AttentionShape,
) -> Result<Tensor> {
    let q = q.to_dtype(DType::F32)?.contiguous()?;
    let (h, kvh, d) = (shape.num_heads, layout.num_kv_heads, layout.head_dim);
    let t = batch.num_tokens();
    if q.dims() != [t, h, d] || batch.block_size != layout.block_size || h % kvh != 0 {
        return Err(ModelError::InvalidBatch(format!(
            "q {:?} does not fit [{t}, {h}, {d}] over a cache of {kvh} KV heads and blocks of {}",
            q.dims(),
            layout.block_size
        )));
    }
    if !supports(d, h / kvh) {
        return Err(ModelError::InvalidBatch(format!(
            "the CPU attention kernel needs AVX-512, head_dim a multiple of {LANES} (got {d}) and at most \
             {MAX_GROUP} query heads per KV head (got {}); use the reference backend",
            h / kvh
        )));
    }
    let (q_store, q_off) = cpu_storage(&q, "q")?;
    let (k_store, k_off) = cpu_storage(k_cache, "the K cache")?;
    let (v_store, v_off) = cpu_storage(v_cache, "the V cache")?;
    let (Storage::Cpu(qc), Storage::Cpu(kc), Storage::Cpu(vc)) = (&*q_store, &*k_store, &*v_store)
    else {
        unreachable!("checked by cpu_storage")
    };
    let n = layout.values_per_layer();
    let cache = match k_cache.dtype() {
        DType::F32 => Cache::F32(
            &kc.as_slice::<f32>()?[k_off..][..n],
            &vc.as_slice::<f32>()?[v_off..][..n],
        ),
        DType::F16 => Cache::F16(
            &kc.as_slice::<f16>()?[k_off..][..n],
            &vc.as_slice::<f16>()?[v_off..][..n],
        ),
        other => {
            return Err(ModelError::InvalidBatch(format!(
                "KV cache of {other:?} is not supported"
            )))
        }
    };
    let kernel = Kernel {
        q: &qc.as_slice::<f32>()?[q_off..][..t * h * d],
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
        SCRATCH.with(|scratch| {
            let scratch = &mut scratch.borrow_mut();
            match cache {
                Cache::F32(k, v) => kernel.run(item, k, v, scratch, out_ptr),
                Cache::F16(k, v) => kernel.run(item, k, v, scratch, out_ptr),
            }
        })
    });
    Ok(Tensor::from_vec(out, (t, h * d), &Device::Cpu)?)
}

struct Kernel<'a> {
    q: &'a [f32],
    batch: &'a StepBatch,
    layout: &'a KvLayout,
    heads: usize,
    scale: f32,
}

impl Kernel<'_> {
    fn run<E: x86::KvElem>(
        &self,
        item: &WorkItem,
        k: &[E],
        v: &[E],
        scratch: &mut Vec<f32>,
        out: OutPtr,
    ) {
        let (d, bs) = (self.layout.head_dim, self.layout.block_size);
        let group = self.heads / self.layout.num_kv_heads;
        let seq = &self.batch.sequences[item.seq];
        let table = self.batch.block_table(seq);
        let first_pos = seq.context_len - seq.query_len;
        let rows = (item.query_end - item.query_begin) * group;

        // Per (query, head) row: running max, running sum, and the f32 accumulator.
        scratch.clear();
        scratch.resize(rows * (2 + d), 0.0);
        let (maxes, rest) = scratch.split_at_mut(rows);
        let (sums, accs) = rest.split_at_mut(rows);
        maxes.fill(f32::NEG_INFINITY);

        let last_pos = first_pos + item.query_end - 1;
        let num_blocks = last_pos / bs + 1;
        let run_len = d * bs;
        for (b, &block) in table.iter().enumerate().take(num_blocks) {
            let run = self.layout.block_head_offset(block as usize, item.kv_head);
            // Blocks lie anywhere in the pool, out of reach of the hardware prefetcher: ask for
            // the next block's keys and values while this one is computed (decode is bound by
            // reading the cache).
            if let Some(&next) = table.get(b + 1).filter(|_| b + 1 < num_blocks) {
                let next = self.layout.block_head_offset(next as usize, item.kv_head);
                x86::prefetch(&k[next..next + run_len]);
                x86::prefetch(&v[next..next + run_len]);
            }
            for chunk in (0..bs).step_by(LANES) {
                let key0 = b * bs + chunk;
                if key0 > last_pos {
                    break;
                }
                let chunk_keys = LANES.min(bs - chunk);
                for qi in item.query_begin..item.query_end {
                    let pos = first_pos + qi;
                    if pos < key0 {
                        continue;
                    }
                    let n_keys = chunk_keys.min(pos + 1 - key0);
                    let token = seq.query_start + qi;
                    let row = (qi - item.query_begin) * group;
                    let chunk_args = Chunk {
                        q: &self.q[(token * self.heads + item.kv_head * group) * d..][..group * d],
                        k: &k[run + chunk..],
                        k_stride: bs,
                        v: &v[run + chunk * d..],
                        head_dim: d,
                        n_keys,
                        scale: self.scale,
                    };
                    let state = RowState {
                        maxes: &mut maxes[row..row + group],
                        sums: &mut sums[row..row + group],
                        accs: &mut accs[row * d..(row + group) * d],
                    };
                    // SAFETY: `supports` checked the CPU features and shapes the kernel needs.
                    unsafe { x86::chunk_for_group(group, &chunk_args, state) };
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

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    use super::{Chunk, RowState};

    pub trait KvElem {}
    impl KvElem for f32 {}
    impl KvElem for half::f16 {}

    pub unsafe fn chunk_for_group<E: KvElem>(_: usize, _: &Chunk<'_, E>, _: RowState<'_>) {
        unreachable!("supports() is false off x86_64")
    }

    pub fn prefetch<E>(_: &[E]) {}
}

/// One chunk of up to 16 keys of one block and KV head, for the queries of one group.
struct Chunk<'a, E> {
    /// The group's query heads, `[group][head_dim]`.
    q: &'a [f32],
    /// Key `j`'s dimension `i` is at `k[i * k_stride + j]`.
    k: &'a [E],
    k_stride: usize,
    /// Key `j`'s values are `v[j * head_dim..][..head_dim]`.
    v: &'a [E],
    head_dim: usize,
    n_keys: usize,
    scale: f32,
}

/// Online-softmax state of the group's rows: `[group]`, `[group]`, `[group][head_dim]`.
struct RowState<'a> {
    maxes: &'a mut [f32],
    sums: &'a mut [f32],
    accs: &'a mut [f32],
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{Chunk, RowState, LANES, MAX_GROUP};
    use crate::simd::x86::{exp, exp_scalar};

    /// How the cache's element type becomes 16 f32 lanes.
    pub trait KvElem: Copy + Send + Sync {
        /// Loads `min(16, lanes)` values from `p` (zero past them).
        unsafe fn load(p: *const Self, mask: u16) -> __m512;
    }

    impl KvElem for f32 {
        #[inline(always)]
        unsafe fn load(p: *const f32, mask: u16) -> __m512 {
            _mm512_maskz_loadu_ps(mask, p)
        }
    }

    impl KvElem for f16 {
        #[inline(always)]
        unsafe fn load(p: *const f16, mask: u16) -> __m512 {
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p as *const i16))
        }
    }

    /// Hints the cache lines of `data` into L2.
    #[inline(always)]
    pub fn prefetch<E>(data: &[E]) {
        let bytes = std::mem::size_of_val(data);
        let p = data.as_ptr() as *const i8;
        for line in (0..bytes).step_by(64) {
            // SAFETY: a prefetch never faults, and the address is inside `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(line)) };
        }
    }

    /// Dispatches to a kernel specialised for the group size, so the group's accumulators live
    /// in registers.
    #[inline(always)]
    pub unsafe fn chunk_for_group<E: KvElem>(group: usize, c: &Chunk<'_, E>, s: RowState<'_>) {
        match group {
            1 => chunk::<E, 1>(c, s),
            2 => chunk::<E, 2>(c, s),
            3 => chunk::<E, 3>(c, s),
            4 => chunk::<E, 4>(c, s),
            5 => chunk::<E, 5>(c, s),
            6 => chunk::<E, 6>(c, s),
            7 => chunk::<E, 7>(c, s),
            8 => chunk::<E, 8>(c, s),
            _ => unreachable!("group sizes above {MAX_GROUP} are refused by supports()"),
        }
    }

    // Several register arrays are indexed by the same head `g` and key `t`; index loops say
    // that more plainly than zipped iterators.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
    unsafe fn chunk<E: KvElem, const G: usize>(c: &Chunk<'_, E>, s: RowState<'_>) {
        let d = c.head_dim;
        let mask: u16 = if c.n_keys >= LANES {
            u16::MAX
        } else {
            (1u16 << c.n_keys) - 1
        };
        let kp = c.k.as_ptr();
        let qp = c.q.as_ptr();

        // Scores: two FMA chains per head (even and odd dimensions) to cover FMA latency; one
        // load of each key row serves every head of the group.
        let mut even = [_mm512_setzero_ps(); G];
        let mut odd = [_mm512_setzero_ps(); G];
        let mut dim = 0;
        while dim < d {
            let k0 = E::load(kp.add(dim * c.k_stride), mask);
            let k1 = E::load(kp.add((dim + 1) * c.k_stride), mask);
            for g in 0..G {
                even[g] = _mm512_fmadd_ps(_mm512_set1_ps(*qp.add(g * d + dim)), k0, even[g]);
                odd[g] = _mm512_fmadd_ps(_mm512_set1_ps(*qp.add(g * d + dim + 1)), k1, odd[g]);
            }
            dim += 2;
        }

        let mut probs = [[0f32; LANES]; G];
        for g in 0..G {
            let scores = _mm512_mul_ps(_mm512_add_ps(even[g], odd[g]), _mm512_set1_ps(c.scale));
            let scores = _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), mask, scores);
            let new_max = s.maxes[g].max(_mm512_reduce_max_ps(scores));
            if new_max > s.maxes[g] {
                let correction = exp_scalar(s.maxes[g] - new_max);
                s.sums[g] *= correction;
                let acc = s.accs.as_mut_ptr().add(g * d);
                let cv = _mm512_set1_ps(correction);
                for j in (0..d).step_by(LANES) {
                    _mm512_storeu_ps(acc.add(j), _mm512_mul_ps(_mm512_loadu_ps(acc.add(j)), cv));
                }
                s.maxes[g] = new_max;
            }
            let p = _mm512_maskz_mov_ps(mask, exp(_mm512_sub_ps(scores, _mm512_set1_ps(new_max))));
            s.sums[g] += _mm512_reduce_add_ps(p);
            _mm512_storeu_ps(probs[g].as_mut_ptr(), p);
        }

        // Values: one load of each value row chunk serves every head of the group.
        let vp = c.v.as_ptr();
        for j in (0..d).step_by(LANES) {
            let mut acc = [_mm512_setzero_ps(); G];
            for g in 0..G {
                acc[g] = _mm512_loadu_ps(s.accs.as_ptr().add(g * d + j));
            }
            for t in 0..c.n_keys {
                let v = E::load(vp.add(t * d + j), u16::MAX);
                for g in 0..G {
                    acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(probs[g][t]), v, acc[g]);
                }
            }
            for g in 0..G {
                _mm512_storeu_ps(s.accs.as_mut_ptr().add(g * d + j), acc[g]);
            }
        }
    }
}
