//! The 8-bit KV cache (`--kv-cache-dtype q8_0`): keys and values as int8 in [`KvLayout`]
//! order, each run of 32 values along the head dimension with its own f32 scale (absmax /
//! 127, as GGUF's q8_0 blocks; the scale in f32 rather than f16). Decode attention reads the
//! cache once per token, so this halves what a 64-sequence decode step reads against f16
//! (1.125 bytes a value with the scales, against 2) and fits 1.8x the sequences per GiB.
//!
//! The attention work is [`paged_attention`](super::paged_attention)'s: the same work items,
//! the same online softmax; a chunk's scores are summed per 32-dimension group in int8 units
//! and scaled once per group, and each value row's weight is the probability times the row's
//! group scale. AVX2 where the CPU has it (also on AVX-512 CPUs), portable Rust elsewhere.

use super::portable::KvRead;
use super::{
    check_heads, check_rows, cpu_features, AttentionError, ChunkAt, Kernel, RowState, WorkItem,
    MAX_GROUP,
};
use crate::disjoint::DisjointSlice;
use crate::paged::{AttentionShape, KvLayout, SequenceSlice};

/// Values per scale, along the head dimension.
pub const Q8_GROUP: usize = 32;

/// One layer of an 8-bit cache. `k` and `v` hold int8 values in [`KvLayout`] order; the K
/// scales are `[block][kv_head][head_dim / 32][block_size]` (the scales of one group of a
/// chunk's keys lie together, as the keys do) and the V scales `[block][kv_head][block_size]
/// [head_dim / 32]` (a value row's scales together).
#[derive(Clone, Copy)]
pub struct Q8Cache<'a> {
    pub k: &'a [i8],
    pub k_scales: &'a [f32],
    pub v: &'a [i8],
    pub v_scales: &'a [f32],
}

/// [`Q8Cache`] for writing.
pub struct Q8CacheMut<'a> {
    pub k: &'a mut [i8],
    pub k_scales: &'a mut [f32],
    pub v: &'a mut [i8],
    pub v_scales: &'a mut [f32],
}

impl Q8Cache<'_> {
    /// Scales one layer holds for K (and as many for V).
    pub fn scales_per_layer(layout: &KvLayout) -> usize {
        layout.values_per_layer() / Q8_GROUP
    }
}

fn check_layout(
    layout: &KvLayout,
    k: usize,
    ks: usize,
    v: usize,
    vs: usize,
) -> Result<(), AttentionError> {
    let (n, ns) = (layout.values_per_layer(), Q8Cache::scales_per_layer(layout));
    if !layout.head_dim.is_multiple_of(Q8_GROUP) {
        return Err(AttentionError::Unsupported {
            head_dim: layout.head_dim,
            group: 1,
        });
    }
    if k < n || v < n || ks < ns || vs < ns {
        return Err(AttentionError::Shape(format!(
            "an 8-bit cache of {n} values and {ns} scales per layer got {k} and {v} values, {ks} and {vs} scales"
        )));
    }
    Ok(())
}

/// Quantizes one group of 32 values: returns the scale and writes the integers.
#[inline]
fn quantize_group(x: &[f32], mut put: impl FnMut(usize, i8)) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for (i, v) in x.iter().enumerate() {
        put(i, (v * inv).round().clamp(-127.0, 127.0) as i8);
    }
    scale
}

/// Writes the step's new keys and values `k, v: [T, num_kv_heads, head_dim]` (f32) into their
/// slots of an 8-bit cache layer, quantized per group of 32.
pub fn write_q8(
    layout: &KvLayout,
    slots: &[u32],
    k: &[f32],
    v: &[f32],
    cache: Q8CacheMut<'_>,
) -> Result<(), AttentionError> {
    check_layout(
        layout,
        cache.k.len(),
        cache.k_scales.len(),
        cache.v.len(),
        cache.v_scales.len(),
    )?;
    check_rows(layout, slots, k, v)?;
    let (kvh, d, bs) = (layout.num_kv_heads, layout.head_dim, layout.block_size);
    let groups = d / Q8_GROUP;
    for (t, &slot) in slots.iter().enumerate() {
        let (block, off) = (slot as usize / bs, slot as usize % bs);
        for head in 0..kvh {
            let base = layout.block_head_offset(block, head);
            let scales = (block * kvh + head) * groups * bs;
            let row = (t * kvh + head) * d;
            for g in 0..groups {
                let at = g * Q8_GROUP;
                cache.k_scales[scales + g * bs + off] =
                    quantize_group(&k[row + at..][..Q8_GROUP], |i, q| {
                        cache.k[base + (at + i) * bs + off] = q
                    });
                cache.v_scales[scales + off * groups + g] =
                    quantize_group(&v[row + at..][..Q8_GROUP], |i, q| {
                        cache.v[base + off * d + at + i] = q
                    });
            }
        }
    }
    Ok(())
}

/// The portable kernel's reads of an 8-bit cache: the integer times its group's scale.
struct Q8Read<'a> {
    cache: Q8Cache<'a>,
    layout: &'a KvLayout,
}

impl KvRead for Q8Read<'_> {
    fn key(&self, base: usize, i: usize, off: usize) -> f32 {
        let (d, bs) = (self.layout.head_dim, self.layout.block_size);
        let bh = base / (d * bs);
        let scale = self.cache.k_scales[(bh * (d / Q8_GROUP) + i / Q8_GROUP) * bs + off];
        f32::from(self.cache.k[base + i * bs + off]) * scale
    }

    fn value(&self, base: usize, off: usize, i: usize) -> f32 {
        let (d, bs) = (self.layout.head_dim, self.layout.block_size);
        let (bh, groups) = (base / (d * bs), d / Q8_GROUP);
        let scale = self.cache.v_scales[(bh * bs + off) * groups + i / Q8_GROUP];
        f32::from(self.cache.v[base + off * d + i]) * scale
    }
}

/// [`super::paged_attention`] over an 8-bit cache layer.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_q8(
    q: &[f32],
    cache: &Q8Cache<'_>,
    layout: &KvLayout,
    sequences: &[SequenceSlice],
    key_ends: &[u32],
    block_tables: &[u32],
    shape: &AttentionShape,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), AttentionError> {
    let avx2 = cpu_features().1;
    run_q8_items(
        avx2,
        q,
        cache,
        layout,
        sequences,
        key_ends,
        block_tables,
        shape,
        sinks,
        out,
    )
}

/// [`paged_attention_q8`] on AVX2 (refused where the CPU lacks it) or in portable Rust.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_q8_items(
    avx2: bool,
    q: &[f32],
    cache: &Q8Cache<'_>,
    layout: &KvLayout,
    sequences: &[SequenceSlice],
    key_ends: &[u32],
    block_tables: &[u32],
    shape: &AttentionShape,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), AttentionError> {
    let group = check_heads(shape, layout)?;
    let d = layout.head_dim;
    check_layout(
        layout,
        cache.k.len(),
        cache.k_scales.len(),
        cache.v.len(),
        cache.v_scales.len(),
    )?;
    if avx2 && !(cpu_features().1 && (1..=MAX_GROUP).contains(&group)) {
        return Err(AttentionError::Unsupported { head_dim: d, group });
    }
    let kernel = Kernel::checked(
        q,
        out,
        sequences,
        key_ends,
        block_tables,
        layout,
        shape,
        sinks,
    )?;
    let read = Q8Read {
        cache: *cache,
        layout,
    };
    kernel.for_each_item(out, |item, scratch, out| {
        if !avx2 {
            return kernel.run_portable(item, &read, scratch, out);
        }
        // SAFETY: AVX2, FMA and F16C and the group size were checked, the head dim is a
        // multiple of 32 and the cache holds the layout's values and scales (`check_layout`),
        // the block tables fit the cache, and each work item writes only its own (token, head)
        // rows of `out`.
        unsafe { kernel.run_q8(item, cache, scratch, out) }
    });
    Ok(())
}

impl Kernel<'_> {
    /// One work item's rows of the output from an 8-bit cache, on AVX2.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; the group is 1..=8 and the head dim a multiple of 32;
    /// `c` holds the layout's values and scales; the item's sequence fits its block table and
    /// the cache; no other task writes the item's rows of `out`.
    unsafe fn run_q8(
        &self,
        item: &WorkItem,
        c: &Q8Cache<'_>,
        scratch: &mut Vec<f32>,
        out: DisjointSlice<'_, f32>,
    ) {
        let (d, bs) = (self.layout.head_dim, self.layout.block_size);
        let kvh = self.layout.num_kv_heads;
        let (groups, group) = (d / Q8_GROUP, self.heads / kvh);
        // One query a call: `run_item` is given a tile of 1.
        let chunk = |at: &ChunkAt, q: &[f32], _queries: usize, state: RowState<'_>| {
            let run = self.layout.block_head_offset(at.block, item.kv_head);
            let scales = (at.block * kvh + item.kv_head) * groups * bs;
            let chunk_args = x86::Chunk {
                q,
                k: &c.k[run + at.chunk..],
                k_scales: &c.k_scales[scales + at.chunk..],
                k_stride: bs,
                v: &c.v[run + at.chunk * d..],
                v_scales: &c.v_scales[scales + at.chunk * groups..],
                head_dim: d,
                first_key: at.first_key,
                n_keys: at.n_keys,
                all_lanes_in_block: at.all_lanes_in_block,
                scale: self.scale,
            };
            // SAFETY: the caller's promise: the CPU features, the group size and head dim; the
            // chunk's keys, values and scales lie in the block.
            unsafe { x86::chunk_for_group(group, &chunk_args, state) }
        };
        // SAFETY: the caller's promise: no other task writes the item's rows.
        unsafe { self.run_item(item, 1, scratch, out, |_| {}, chunk) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    use super::super::RowState;

    pub struct Chunk<'a> {
        pub q: &'a [f32],
        pub k: &'a [i8],
        pub k_scales: &'a [f32],
        pub k_stride: usize,
        pub v: &'a [i8],
        pub v_scales: &'a [f32],
        pub head_dim: usize,
        pub first_key: usize,
        pub n_keys: usize,
        pub all_lanes_in_block: bool,
        pub scale: f32,
    }

    /// # Safety
    /// Never called: `cpu_features()` is false off x86_64.
    pub unsafe fn chunk_for_group(_: usize, _: &Chunk<'_>, _: RowState<'_>) {
        unreachable!("no AVX2 off x86_64")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::avx2::softmax_chunk;
    use super::super::{RowState, LANES, MAX_GROUP};
    use super::Q8_GROUP;

    /// One chunk of up to 16 keys of one block and KV head of an 8-bit cache.
    pub struct Chunk<'a> {
        /// The group's query heads, `[group][head_dim]`.
        pub q: &'a [f32],
        /// Key `j`'s dimension `i` is at `k[i * k_stride + j]`.
        pub k: &'a [i8],
        /// Key `j`'s scale of dimension group `g` is at `k_scales[g * k_stride + j]`.
        pub k_scales: &'a [f32],
        pub k_stride: usize,
        /// Key `j`'s values are `v[j * head_dim..][..head_dim]`.
        pub v: &'a [i8],
        /// Key `j`'s scale of group `g` is at `v_scales[j * head_dim / 32 + g]`.
        pub v_scales: &'a [f32],
        pub head_dim: usize,
        pub first_key: usize,
        pub n_keys: usize,
        /// Whether all 16 lanes of each key row lie in the block.
        pub all_lanes_in_block: bool,
        pub scale: f32,
    }

    /// 16 int8 lanes from `p` as two registers of f32 (a staged copy, zero past `n`, unless
    /// all 16 are in the block).
    ///
    /// # Safety
    /// The CPU has AVX2; `p[..n]` is readable, and `p[..16]` if `all`.
    #[inline(always)]
    unsafe fn load_i8x16(p: *const i8, n: usize, all: bool) -> (__m256, __m256) {
        // SAFETY: the caller's promise on `p`; the staged copy is 16 bytes.
        unsafe {
            let x = if all {
                _mm_loadu_si128(p as *const __m128i)
            } else {
                let mut staged = [0i8; LANES];
                std::ptr::copy_nonoverlapping(p, staged.as_mut_ptr(), n.min(LANES));
                _mm_loadu_si128(staged.as_ptr() as *const __m128i)
            };
            (
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(x))),
            )
        }
    }

    /// 16 f32 scales from `p` (a staged copy, zero past `n`, unless all 16 are in the block).
    ///
    /// # Safety
    /// The CPU has AVX; `p[..n]` is readable, and `p[..16]` if `all`.
    #[inline(always)]
    unsafe fn load_f32x16(p: *const f32, n: usize, all: bool) -> (__m256, __m256) {
        // SAFETY: the caller's promise on `p`; the staged copy is 16 floats.
        unsafe {
            if all {
                return (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
            }
            let mut staged = [0f32; LANES];
            std::ptr::copy_nonoverlapping(p, staged.as_mut_ptr(), n.min(LANES));
            (
                _mm256_loadu_ps(staged.as_ptr()),
                _mm256_loadu_ps(staged.as_ptr().add(8)),
            )
        }
    }

    /// # Safety
    /// As [`chunk`], and `group` is 1..=8.
    #[inline(always)]
    pub unsafe fn chunk_for_group(group: usize, c: &Chunk<'_>, s: RowState<'_>) {
        // SAFETY: forwarded: the caller makes `chunk`'s promise for this group size.
        unsafe {
            match group {
                1 => chunk::<1>(c, s),
                2 => chunk::<2>(c, s),
                3 => chunk::<3>(c, s),
                4 => chunk::<4>(c, s),
                5 => chunk::<5>(c, s),
                6 => chunk::<6>(c, s),
                7 => chunk::<7>(c, s),
                8 => chunk::<8>(c, s),
                _ => unreachable!("group sizes above {MAX_GROUP} are refused"),
            }
        }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `c.q` holds G heads of `c.head_dim` (a multiple of 32)
    /// values; `c.k` and `c.k_scales` the chunk's `c.n_keys` (1..=16) keys of every dimension
    /// and group at `c.k_stride` apart (all 16 if `c.all_lanes_in_block`), `c.v` and
    /// `c.v_scales` `c.n_keys` rows; `s` G rows.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk<const G: usize>(c: &Chunk<'_>, mut s: RowState<'_>) {
        // SAFETY: the CPU features and the sizes of `c` and `s` are the caller's promise;
        // every load and store below is inside them.
        unsafe {
            let d = c.head_dim;
            let groups = d / Q8_GROUP;
            let (kp, qp) = (c.k.as_ptr(), c.q.as_ptr());
            let all = c.all_lanes_in_block;

            // Scores: per group of 32 dimensions, the integer dot products, then times the
            // keys' scales of the group.
            let mut lo = [_mm256_setzero_ps(); G];
            let mut hi = [_mm256_setzero_ps(); G];
            for grp in 0..groups {
                let mut glo = [_mm256_setzero_ps(); G];
                let mut ghi = [_mm256_setzero_ps(); G];
                for dim in grp * Q8_GROUP..(grp + 1) * Q8_GROUP {
                    let (k0, k1) = load_i8x16(kp.add(dim * c.k_stride), c.n_keys, all);
                    for g in 0..G {
                        let qv = _mm256_broadcast_ss(&*qp.add(g * d + dim));
                        glo[g] = _mm256_fmadd_ps(qv, k0, glo[g]);
                        ghi[g] = _mm256_fmadd_ps(qv, k1, ghi[g]);
                    }
                }
                let (s0, s1) =
                    load_f32x16(c.k_scales.as_ptr().add(grp * c.k_stride), c.n_keys, all);
                for g in 0..G {
                    lo[g] = _mm256_fmadd_ps(glo[g], s0, lo[g]);
                    hi[g] = _mm256_fmadd_ps(ghi[g], s1, hi[g]);
                }
            }
            let probs = softmax_chunk::<G>(&lo, &hi, c.first_key, c.n_keys, c.scale, d, &mut s);

            // Values, 16 dimensions at a time: each row's weight is its probability times
            // the row's scale of the group.
            let (vp, accp) = (c.v.as_ptr(), s.accs.as_mut_ptr());
            for j in (0..d).step_by(LANES) {
                let grp = j / Q8_GROUP;
                let mut a0 = [_mm256_setzero_ps(); G];
                let mut a1 = [_mm256_setzero_ps(); G];
                for g in 0..G {
                    a0[g] = _mm256_loadu_ps(accp.add(g * d + j));
                    a1[g] = _mm256_loadu_ps(accp.add(g * d + j + 8));
                }
                for t in c.first_key..c.n_keys {
                    let vs = *c.v_scales.as_ptr().add(t * groups + grp);
                    let x = _mm_loadu_si128(vp.add(t * d + j) as *const __m128i);
                    let v0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
                    let v1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(x)));
                    for g in 0..G {
                        let w = _mm256_set1_ps(probs[g][t] * vs);
                        a0[g] = _mm256_fmadd_ps(w, v0, a0[g]);
                        a1[g] = _mm256_fmadd_ps(w, v1, a1[g]);
                    }
                }
                for g in 0..G {
                    _mm256_storeu_ps(accp.add(g * d + j), a0[g]);
                    _mm256_storeu_ps(accp.add(g * d + j + 8), a1[g]);
                }
            }
        }
    }
}
