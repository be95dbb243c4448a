//! The Gated DeltaNet mixer of the hybrid models (Qwen3.5/3.6, Qwen3-Next) on the CPU: the
//! causal depthwise conv over q, k and v with its rolling state, SiLU, L2-normalised q and k,
//! the gated delta rule over a fixed-size state per head, and the gated RMSNorm of its output.
//! The in- and out-projections are ordinary matmuls, outside.
//!
//! One arithmetic for every token: the recurrence runs in its sequential form, token after
//! token of a sequence, each token's update the same operations in the same order whether it
//! comes in a long prefill, a chunk of one or a decode step. Work is split over sequences'
//! tokens (the conv, the norms) and over value heads (the recurrence), never inside one
//! token's sums, so a sequence's values do not depend on what else the step holds. The dot
//! products sum in eight lanes and a fixed tree (vectorised by the compiler, no FMA
//! contraction: Rust does not contract), the same bits on every CPU.

use rayon::prelude::*;

/// Tokens from which the token-wise passes split over the pool.
const PARALLEL_ROWS: usize = 32;

/// The shape of one Gated DeltaNet layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaNetShape {
    /// Key (and query) heads (GGUF `ssm.group_count`).
    pub k_heads: usize,
    /// Value heads (`ssm.time_step_rank`), a multiple of `k_heads`.
    pub v_heads: usize,
    /// The size of every key and value head (`ssm.state_size`).
    pub head_dim: usize,
    /// Taps of the causal conv (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Value head `h` reads key head `h % k_heads` (llama.cpp's order: its converter reorders
    /// Qwen3.5's value heads so); else `h / (v_heads / k_heads)` (Hugging Face's, Qwen3-Next's).
    pub tiled: bool,
}

impl DeltaNetShape {
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.v_heads * self.head_dim
    }

    /// Channels of the conv: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Columns of the in-projection's rows, in this order: q, k, v (the conv's input), z (the
    /// output gate, `value_dim`), beta and alpha (one a value head each).
    pub fn in_cols(&self) -> usize {
        self.conv_dim() + self.value_dim() + 2 * self.v_heads
    }

    /// Values of a sequence's conv state: the last `conv_kernel - 1` inputs.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }

    /// Values of a sequence's state in one value head: `head_dim x head_dim`.
    pub fn head_state_len(&self) -> usize {
        self.head_dim * self.head_dim
    }

    /// The key head value head `h` reads.
    fn k_head_of(&self, h: usize) -> usize {
        if self.tiled {
            h % self.k_heads
        } else {
            h / (self.v_heads / self.k_heads)
        }
    }

    fn check(&self) {
        assert!(
            self.k_heads > 0
                && self.head_dim > 0
                && self.conv_kernel > 0
                && self.v_heads.is_multiple_of(self.k_heads),
            "{self:?}"
        );
    }
}

/// A layer's own small tensors.
#[derive(Debug, Clone, Copy)]
pub struct DeltaNetWeights<'a> {
    /// The conv's taps, `[conv_dim, conv_kernel]`, oldest input first.
    pub conv: &'a [f32],
    /// `[v_heads]`: the bias of alpha before the softplus.
    pub dt_bias: &'a [f32],
    /// `[v_heads]`: `-exp(A_log)`, the decay's rate.
    pub a: &'a [f32],
    /// `[head_dim]`: the output norm's weights.
    pub norm: &'a [f32],
    /// The model's RMSNorm epsilon (the output norm's, and the L2 norms').
    pub eps: f32,
}

/// One sequence of the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaNetSeq {
    /// Its first token's row in the step.
    pub start: usize,
    pub len: usize,
    /// Its state's index in [`DeltaNetStates`].
    pub state: usize,
    /// It starts at position 0: its state starts from zeros, whatever the slot held.
    pub fresh: bool,
    /// Its state starts as a copy of this one (a checkpoint of the prefix it skipped: a
    /// prefix-cache hit), whatever its own slot held.
    pub restore: Option<usize>,
    /// `(checkpoint, n)`: the state after its first `n` tokens of this step is copied into
    /// state `checkpoint` (a prefix's checkpoint at a block boundary), `1 <= n <= len`.
    pub save: Option<(usize, usize)>,
}

/// Every sequence's state in one layer.
pub struct DeltaNetStates<'a> {
    /// `[states, conv_kernel - 1, conv_dim]`.
    pub conv: &'a mut [f32],
    /// `[v_heads, states, head_dim (value row), head_dim (key column)]`: head-major, so that
    /// each head's task owns its part.
    pub ssm: &'a mut [f32],
}

/// A step's buffers, kept between steps.
#[derive(Default)]
pub struct DeltaNetScratch {
    /// `[T, conv_dim]`: the conv's output, q and k then normalised in place.
    conv_out: Vec<f32>,
    /// `[v_heads, T, head_dim]`: the rule's output before the norm.
    heads: Vec<f32>,
    /// Each token's sequence.
    token_seq: Vec<u32>,
}

/// The mixer for every sequence of a step: `mixed` holds the in-projection's rows `[T,
/// in_cols]`, `out` receives the gated norm's output `[T, value_dim]` (the out-projection's
/// input), and each sequence's states move past its tokens. Panics if a slice disagrees with
/// the shape, the sequences do not tile `T`, or a state index is past the states.
pub fn forward(
    shape: DeltaNetShape,
    w: DeltaNetWeights<'_>,
    seqs: &[DeltaNetSeq],
    mixed: &[f32],
    states: DeltaNetStates<'_>,
    scratch: &mut DeltaNetScratch,
    out: &mut [f32],
) {
    shape.check();
    let (in_cols, conv_dim, value_dim, s) = (
        shape.in_cols(),
        shape.conv_dim(),
        shape.value_dim(),
        shape.head_dim,
    );
    let t = mixed.len() / in_cols;
    assert_eq!(mixed.len(), t * in_cols, "in-projection rows");
    assert_eq!(out.len(), t * value_dim, "output rows");
    assert_eq!(w.conv.len(), conv_dim * shape.conv_kernel, "conv taps");
    assert!(w.dt_bias.len() == shape.v_heads && w.a.len() == shape.v_heads);
    assert_eq!(w.norm.len(), s, "norm weights");
    let conv_state = shape.conv_state_len();
    let num_states = states.conv.len() / conv_state.max(1);
    assert_eq!(
        states.ssm.len(),
        shape.v_heads * num_states * shape.head_state_len(),
        "ssm states"
    );
    let token_seq = &mut scratch.token_seq;
    token_seq.clear();
    let mut next = 0;
    for (i, q) in seqs.iter().enumerate() {
        assert!(q.start == next && q.len > 0, "sequences tile the step");
        assert!(q.state < num_states, "state {} of {num_states}", q.state);
        assert!(q.restore.is_none_or(|c| c < num_states && c != q.state));
        assert!(q
            .save
            .is_none_or(|(c, n)| c < num_states && c != q.state && (1..=q.len).contains(&n)));
        token_seq.extend(std::iter::repeat_n(i as u32, q.len));
        next += q.len;
    }
    assert_eq!(next, t, "sequences tile the step");

    // A fresh sequence's conv inputs before its first token are zeros; a restored one's are
    // its checkpoint's.
    for q in seqs {
        let own = q.state * conv_state..(q.state + 1) * conv_state;
        if let Some(c) = q.restore {
            states
                .conv
                .copy_within(c * conv_state..(c + 1) * conv_state, own.start);
        } else if q.fresh {
            states.conv[own].fill(0.0);
        }
    }
    let conv_out = sized(&mut scratch.conv_out, t * conv_dim);
    let conv_states: &[f32] = states.conv;
    let token_seq: &[u32] = token_seq;
    let conv_row = |ti: usize, row: &mut [f32]| {
        let q = &seqs[token_seq[ti] as usize];
        conv_token(
            shape,
            w,
            mixed,
            &conv_states[q.state * conv_state..][..conv_state],
            ti - q.start,
            q.start,
            row,
        );
    };
    if t < PARALLEL_ROWS {
        conv_out
            .chunks_exact_mut(conv_dim)
            .enumerate()
            .for_each(|(ti, row)| conv_row(ti, row));
    } else {
        conv_out
            .par_chunks_exact_mut(conv_dim)
            .enumerate()
            .for_each(|(ti, row)| conv_row(ti, row));
    }
    for q in seqs {
        if let Some((c, n)) = q.save {
            // The checkpoint's conv state: the sequence's as it stands after `n` tokens.
            states.conv.copy_within(
                q.state * conv_state..(q.state + 1) * conv_state,
                c * conv_state,
            );
            roll_conv_state(
                shape,
                mixed,
                q.start,
                n,
                &mut states.conv[c * conv_state..][..conv_state],
            );
        }
        roll_conv_state(
            shape,
            mixed,
            q.start,
            q.len,
            &mut states.conv[q.state * conv_state..][..conv_state],
        );
    }

    let heads = sized(&mut scratch.heads, shape.v_heads * t * s);
    let head_states = num_states * shape.head_state_len();
    let conv_out: &[f32] = conv_out;
    heads
        .par_chunks_exact_mut(t * s)
        .zip(states.ssm.par_chunks_exact_mut(head_states))
        .enumerate()
        .for_each(|(h, (o, st))| delta_rule_head(shape, w, seqs, mixed, conv_out, h, st, o));

    let heads: &[f32] = heads;
    let norm_row = |ti: usize, row: &mut [f32]| {
        let z = &mixed[ti * in_cols + conv_dim..][..value_dim];
        for (h, (dst, z)) in row.chunks_exact_mut(s).zip(z.chunks_exact(s)).enumerate() {
            gated_norm(&heads[(h * t + ti) * s..][..s], z, w.norm, w.eps, dst);
        }
    };
    if t < PARALLEL_ROWS {
        out.chunks_exact_mut(value_dim)
            .enumerate()
            .for_each(|(ti, row)| norm_row(ti, row));
    } else {
        out.par_chunks_exact_mut(value_dim)
            .enumerate()
            .for_each(|(ti, row)| norm_row(ti, row));
    }
}

/// Token `j` of the sequence whose rows start at `start`: the conv's output over q, k and v
/// (SiLU applied), then q and k L2-normalised per head.
fn conv_token(
    shape: DeltaNetShape,
    w: DeltaNetWeights<'_>,
    mixed: &[f32],
    state: &[f32],
    j: usize,
    start: usize,
    row: &mut [f32],
) {
    let (in_cols, conv_dim, taps) = (shape.in_cols(), shape.conv_dim(), shape.conv_kernel);
    row.fill(0.0);
    // Tap k reads the input k - (taps - 1) tokens before this one: the step's row where the
    // sequence has it here, else the state's (its last inputs before this step).
    for k in 0..taps {
        let back = taps - 1 - k;
        let input = if back <= j {
            &mixed[(start + j - back) * in_cols..][..conv_dim]
        } else {
            &state[(taps - 1 - (back - j)) * conv_dim..][..conv_dim]
        };
        for ((acc, x), wc) in row.iter_mut().zip(input).zip(w.conv.chunks_exact(taps)) {
            *acc += x * wc[k];
        }
    }
    for v in row.iter_mut() {
        *v = silu(*v);
    }
    let (qk, _) = row.split_at_mut(2 * shape.key_dim());
    for head in qk.chunks_exact_mut(shape.head_dim) {
        l2_norm(head, w.eps);
    }
}

/// The conv state after `len` tokens whose rows start at `start`: the last `conv_kernel - 1`
/// inputs, oldest first (older state rows where there were fewer tokens).
fn roll_conv_state(
    shape: DeltaNetShape,
    mixed: &[f32],
    start: usize,
    len: usize,
    state: &mut [f32],
) {
    let (in_cols, conv_dim) = (shape.in_cols(), shape.conv_dim());
    let keep = shape.conv_kernel - 1;
    for r in 0..keep {
        // Row r is the input `keep - r` tokens before the sequence's next one.
        let back = keep - r;
        if back <= len {
            let src = &mixed[(start + len - back) * in_cols..][..conv_dim];
            state[r * conv_dim..][..conv_dim].copy_from_slice(src);
        } else {
            // The old row `len` later: rows move towards the start, so reading ahead of the
            // row written is safe in this order.
            state.copy_within((r + len) * conv_dim..(r + len + 1) * conv_dim, r * conv_dim);
        }
    }
}

/// Value head `h` of every sequence: its state `st` (`[states, head_dim, head_dim]`) moved
/// token by token, the rule's output into `o` (`[T, head_dim]`).
#[allow(clippy::too_many_arguments)]
fn delta_rule_head(
    shape: DeltaNetShape,
    w: DeltaNetWeights<'_>,
    seqs: &[DeltaNetSeq],
    mixed: &[f32],
    conv_out: &[f32],
    h: usize,
    st: &mut [f32],
    o: &mut [f32],
) {
    let (s, in_cols, conv_dim, key_dim) = (
        shape.head_dim,
        shape.in_cols(),
        shape.conv_dim(),
        shape.key_dim(),
    );
    let kh = shape.k_head_of(h);
    let scale = 1.0 / (s as f32).sqrt();
    let gates = conv_dim + shape.value_dim();
    let ss = s * s;
    for q in seqs {
        let own = q.state * ss;
        if let Some(c) = q.restore {
            st.copy_within(c * ss..(c + 1) * ss, own);
        } else if q.fresh {
            st[own..own + ss].fill(0.0);
        }
        for ti in q.start..q.start + q.len {
            let m = &mut st[own..own + ss];
            let row = &conv_out[ti * conv_dim..][..conv_dim];
            let query = &row[kh * s..][..s];
            let key = &row[key_dim + kh * s..][..s];
            let value = &row[2 * key_dim + h * s..][..s];
            let beta = sigmoid(mixed[ti * in_cols + gates + h]);
            let alpha = mixed[ti * in_cols + gates + shape.v_heads + h];
            let decay = (softplus(alpha + w.dt_bias[h]) * w.a[h]).exp();
            let out = &mut o[ti * s..][..s];
            // Row r of m is column r of the rule's state S (keys by values): each row's delta,
            // update and output depend on that row alone.
            for ((mr, &v), dst) in m.chunks_exact_mut(s).zip(value).zip(out.iter_mut()) {
                for x in mr.iter_mut() {
                    *x *= decay;
                }
                let delta = (v - dot(mr, key)) * beta;
                for (x, &k) in mr.iter_mut().zip(key) {
                    *x += delta * k;
                }
                *dst = dot(mr, query) * scale;
            }
            if let Some((c, _)) = q.save.filter(|&(_, n)| ti + 1 == q.start + n) {
                st.copy_within(own..own + ss, c * ss);
            }
        }
    }
}

/// `x / sqrt(sum(x^2) + eps)`, as llama.cpp computes it: an RMSNorm with `eps / n`, then
/// `1 / sqrt(n)`.
fn l2_norm(x: &mut [f32], eps: f32) {
    let n = x.len() as f32;
    let sum2: f32 = x.iter().map(|v| v * v).sum();
    let m = (sum2 / n + eps / n).sqrt();
    let tail = 1.0 / n.sqrt();
    for v in x.iter_mut() {
        *v = *v / m * tail;
    }
}

/// `rms_norm(o) * w * silu(z)`.
fn gated_norm(o: &[f32], z: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let sum2: f32 = o.iter().map(|v| v * v).sum();
    let m = (sum2 / o.len() as f32 + eps).sqrt();
    for (((dst, &v), &wi), &zi) in out.iter_mut().zip(o).zip(w).zip(z) {
        *dst = v / m * wi * silu(zi);
    }
}

/// The dot product in eight lanes, summed in a fixed tree, then the tail in order.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (x, y) in ar.iter().zip(br) {
        sum += x * y;
    }
    sum
}

#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + e^x)`, `x` itself past 20 (ggml's rule).
#[inline]
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: DeltaNetShape = DeltaNetShape {
        k_heads: 2,
        v_heads: 4,
        head_dim: 8,
        conv_kernel: 4,
        tiled: true,
    };

    fn values(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503);
                ((x % 2001) as f32 / 1000.0 - 1.0) * scale
            })
            .collect()
    }

    struct Layer {
        conv: Vec<f32>,
        dt: Vec<f32>,
        a: Vec<f32>,
        norm: Vec<f32>,
    }

    impl Layer {
        fn new() -> Self {
            Self {
                conv: values(SHAPE.conv_dim() * SHAPE.conv_kernel, 1, 0.6),
                dt: values(SHAPE.v_heads, 2, 0.5),
                a: values(SHAPE.v_heads, 3, 0.5)
                    .iter()
                    .map(|v| v - 0.7)
                    .collect(),
                norm: values(SHAPE.head_dim, 4, 0.25)
                    .iter()
                    .map(|v| v + 1.0)
                    .collect(),
            }
        }

        fn weights(&self) -> DeltaNetWeights<'_> {
            DeltaNetWeights {
                conv: &self.conv,
                dt_bias: &self.dt,
                a: &self.a,
                norm: &self.norm,
                eps: 1e-6,
            }
        }
    }

    /// States for `n` sequences.
    fn states(n: usize) -> (Vec<f32>, Vec<f32>) {
        (
            vec![f32::NAN; n * SHAPE.conv_state_len()],
            vec![f32::NAN; SHAPE.v_heads * n * SHAPE.head_state_len()],
        )
    }

    /// Runs `seqs` (lengths; each its own state, fresh when `fresh`) over `mixed`.
    fn run(
        layer: &Layer,
        lens: &[(usize, usize, bool)],
        mixed: &[f32],
        st: &mut (Vec<f32>, Vec<f32>),
    ) -> Vec<f32> {
        let mut start = 0;
        let seqs: Vec<DeltaNetSeq> = lens
            .iter()
            .map(|&(len, state, fresh)| {
                let q = DeltaNetSeq {
                    start,
                    len,
                    state,
                    fresh,
                    restore: None,
                    save: None,
                };
                start += len;
                q
            })
            .collect();
        let mut out = vec![0.0; start * SHAPE.value_dim()];
        forward(
            SHAPE,
            layer.weights(),
            &seqs,
            mixed,
            DeltaNetStates {
                conv: &mut st.0,
                ssm: &mut st.1,
            },
            &mut DeltaNetScratch::default(),
            &mut out,
        );
        out
    }

    /// The rule as the paper writes it, in f64 over a whole sequence from zeros: the oracle.
    fn reference(layer: &Layer, mixed: &[f32], len: usize) -> Vec<f64> {
        let sh = SHAPE;
        let (s, ic, cd, kd, vd) = (
            sh.head_dim,
            sh.in_cols(),
            sh.conv_dim(),
            sh.key_dim(),
            sh.value_dim(),
        );
        let silu = |x: f64| x / (1.0 + (-x).exp());
        let mut conv = vec![0f64; len * cd];
        for t in 0..len {
            for c in 0..cd {
                let mut acc = 0.0;
                for k in 0..sh.conv_kernel {
                    let back = sh.conv_kernel - 1 - k;
                    if back <= t {
                        acc += mixed[(t - back) * ic + c] as f64
                            * layer.conv[c * sh.conv_kernel + k] as f64;
                    }
                }
                conv[t * cd + c] = silu(acc);
            }
            for head in conv[t * cd..][..2 * kd].chunks_exact_mut(s) {
                let n = head.iter().map(|v| v * v).sum::<f64>() + 1e-6;
                head.iter_mut().for_each(|v| *v /= n.sqrt());
            }
        }
        let mut out = vec![0f64; len * vd];
        for h in 0..sh.v_heads {
            let kh = h % sh.k_heads;
            let mut m = vec![0f64; s * s]; // m[key][value]
            for t in 0..len {
                let row = &conv[t * cd..];
                let (q, k, v) = (&row[kh * s..], &row[kd + kh * s..], &row[2 * kd + h * s..]);
                let g = mixed[t * ic + cd + vd + sh.v_heads + h] as f64 + layer.dt[h] as f64;
                let decay = ((1.0 + g.exp()).ln() * layer.a[h] as f64).exp();
                let beta = 1.0 / (1.0 + (-(mixed[t * ic + cd + vd + h] as f64)).exp());
                m.iter_mut().for_each(|x| *x *= decay);
                for j in 0..s {
                    let kv: f64 = (0..s).map(|i| m[i * s + j] * k[i]).sum();
                    let d = (v[j] - kv) * beta;
                    (0..s).for_each(|i| m[i * s + j] += k[i] * d);
                }
                let o: Vec<f64> = (0..s)
                    .map(|j| (0..s).map(|i| m[i * s + j] * q[i]).sum::<f64>() / (s as f64).sqrt())
                    .collect();
                let rms = (o.iter().map(|x| x * x).sum::<f64>() / s as f64 + 1e-6).sqrt();
                for j in 0..s {
                    let z = mixed[t * ic + cd + h * s + j] as f64;
                    out[t * vd + h * s + j] = o[j] / rms * layer.norm[j] as f64 * silu(z);
                }
            }
        }
        out
    }

    #[test]
    fn a_fresh_sequence_follows_the_rule() {
        let layer = Layer::new();
        let len = 40;
        let mixed = values(len * SHAPE.in_cols(), 9, 1.0);
        let mut st = states(3);
        let got = run(&layer, &[(len, 2, true)], &mixed, &mut st);
        let want = reference(&layer, &mixed, len);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()),
                "{i}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn chunks_decode_steps_and_batches_give_the_same_bits() {
        let layer = Layer::new();
        let len = 37;
        let mixed = values(len * SHAPE.in_cols(), 11, 1.0);
        let ic = SHAPE.in_cols();
        let mut alone = states(1);
        let whole = run(&layer, &[(len, 0, true)], &mixed, &mut alone);
        // The same sequence in chunks of 1, 2, 5 and 7 tokens, each a step of its own, beside
        // another sequence in a different state slot.
        for chunk in [1usize, 2, 5, 7] {
            let mut st = states(4);
            let other = values(3 * ic, 5, 1.0);
            let mut got = Vec::new();
            let mut pos = 0;
            while pos < len {
                let n = chunk.min(len - pos);
                let mut step = other.clone();
                step.extend_from_slice(&mixed[pos * ic..(pos + n) * ic]);
                let out = run(&layer, &[(3, 1, true), (n, 3, pos == 0)], &step, &mut st);
                got.extend_from_slice(&out[3 * SHAPE.value_dim()..]);
                pos += n;
            }
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "chunks of {chunk}"
            );
            // And the state it ends in is the whole run's.
            assert_eq!(
                st.0[3 * SHAPE.conv_state_len()..][..SHAPE.conv_state_len()]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                alone.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_fresh_sequence_ignores_what_its_slot_held() {
        let layer = Layer::new();
        let mixed = values(9 * SHAPE.in_cols(), 13, 1.0);
        let mut clean = states(2);
        let want = run(&layer, &[(9, 1, true)], &mixed, &mut clean);
        let mut used = states(2);
        run(
            &layer,
            &[(9, 1, true)],
            &values(9 * SHAPE.in_cols(), 3, 2.0),
            &mut used,
        );
        assert_eq!(run(&layer, &[(9, 1, true)], &mixed, &mut used), want);
    }

    #[test]
    fn a_checkpoint_restored_continues_as_the_run_that_saved_it() {
        let layer = Layer::new();
        let len = 29;
        let ic = SHAPE.in_cols();
        let mixed = values(len * ic, 17, 1.0);
        let mut cold = states(3);
        let whole = run(&layer, &[(len, 0, true)], &mixed, &mut cold);
        // A run of the first 20 tokens that saves its state after 16 into state 2.
        let mut st = states(3);
        let seq = |start, len, state, fresh, restore, save| DeltaNetSeq {
            start,
            len,
            state,
            fresh,
            restore,
            save,
        };
        let mut out = vec![0.0; 20 * SHAPE.value_dim()];
        forward(
            SHAPE,
            layer.weights(),
            &[seq(0, 20, 0, true, None, Some((2, 16)))],
            &mixed[..20 * ic],
            DeltaNetStates {
                conv: &mut st.0,
                ssm: &mut st.1,
            },
            &mut DeltaNetScratch::default(),
            &mut out,
        );
        // Another sequence in state 1, whose slot held garbage, restores it and computes
        // tokens 16.. from there: the cold run's bits.
        let mut out = vec![0.0; (len - 16) * SHAPE.value_dim()];
        forward(
            SHAPE,
            layer.weights(),
            &[seq(0, len - 16, 1, false, Some(2), None)],
            &mixed[16 * ic..],
            DeltaNetStates {
                conv: &mut st.0,
                ssm: &mut st.1,
            },
            &mut DeltaNetScratch::default(),
            &mut out,
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out), bits(&whole[16 * SHAPE.value_dim()..]));
    }

    #[test]
    fn grouped_heads_read_their_own_key_head() {
        let grouped = DeltaNetShape {
            tiled: false,
            ..SHAPE
        };
        assert_eq!(
            (0..4).map(|h| grouped.k_head_of(h)).collect::<Vec<_>>(),
            [0, 0, 1, 1]
        );
        assert_eq!(
            (0..4).map(|h| SHAPE.k_head_of(h)).collect::<Vec<_>>(),
            [0, 1, 0, 1]
        );
    }
}
