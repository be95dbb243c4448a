//! A mixture of experts in place of a layer's MLP (Mixtral, qwen2moe, qwen3moe, gpt-oss), on the CPU's
//! row buffers: the router for every row of the step in one matmul, each row's top k
//! ([`routing`]), the rows grouped by expert so that each chosen expert multiplies all of its
//! rows at once (its weights read once a step, however many rows chose it) on the same
//! kernels as a dense layer, then each row's k outputs summed in its top-k slot order.
//!
//! Batching stays invisible, bit for bit: every kernel gives a row the same bits whatever the
//! rows beside it (docs/design.md), the routing of a row reads that row alone, the gather and
//! scatter copy, and a row's sum runs over its own slots in a fixed order.

pub(crate) mod routing;

use crate::config::ExpertActivation;
use crate::error::Result;
use crate::ops::{clamped_swiglu_rows_into, sized, swiglu_rows_into};
use crate::weights::Linear;
use routing::{ExpertGroups, Routes, RoutingRule};

/// One expert: a gated MLP.
pub(crate) struct Expert {
    /// Gate and up stacked: one matmul for both.
    pub gate_up: Linear,
    pub down: Linear,
    /// gpt-oss: gate's then up's bias `[2 * inter]`, added after the matmul.
    pub gate_up_bias: Option<Vec<f32>>,
    /// gpt-oss: down's bias `[hidden]`.
    pub down_bias: Option<Vec<f32>>,
}

/// qwen2moe's shared expert: an MLP every row runs, scaled by `sigmoid(gate . x)`.
pub(crate) struct SharedExpert {
    pub mlp: Expert,
    pub intermediate_size: usize,
    /// `[1, hidden]`: the row's scalar gate.
    pub gate: Linear,
}

/// A layer's mixture of experts.
pub(crate) struct MoeLayer {
    /// `[experts, hidden]`: the router's logits.
    pub router: Linear,
    /// gpt-oss: the router's bias `[experts]`, added to its logits before the choice.
    pub router_bias: Option<Vec<f32>>,
    pub activation: ExpertActivation,
    pub experts: Vec<Expert>,
    pub rule: RoutingRule,
    /// Each expert's intermediate size.
    pub intermediate_size: usize,
    pub shared: Option<SharedExpert>,
}

/// The buffers of a mixture's step, kept across steps and layers.
#[derive(Default)]
pub struct MoeScratch {
    logits: Vec<f32>,
    routes: Routes,
    groups: ExpertGroups,
    /// One expert's rows gathered `[rows, hidden]`.
    xs: Vec<f32>,
    /// One expert's (or the shared expert's) gate and up `[rows, 2 * inter]`.
    gate_up: Vec<f32>,
    /// ... after SwiGLU `[rows, inter]`.
    act: Vec<f32>,
    /// Every (row, slot)'s expert output, at its grouped position `[rows * k, hidden]`.
    ys: Vec<f32>,
    /// The shared expert's output `[rows, hidden]` and gate `[rows]`.
    shared: Vec<f32>,
    shared_gate: Vec<f32>,
    /// Experts run and experts held, summed over the layers of the last step: the share of
    /// expert weights it read.
    pub(crate) experts_run: usize,
    pub(crate) experts_held: usize,
}

impl MoeScratch {
    /// The share of the experts' weights the last step read (experts that at least one row
    /// chose, over the layers' experts); `None` before any mixture ran.
    pub fn expert_share(&self) -> Option<f64> {
        (self.experts_held > 0).then(|| self.experts_run as f64 / self.experts_held as f64)
    }

    /// Starts counting a new step's experts.
    pub(crate) fn start_step(&mut self) {
        self.experts_run = 0;
        self.experts_held = 0;
    }
}

impl Expert {
    /// The MLP of `x: [rows, hidden]` into `out: [rows, hidden]`, through `gate_up`/`act`.
    #[allow(clippy::too_many_arguments)]
    fn forward_into(
        &self,
        activation: ExpertActivation,
        x: &[f32],
        rows: usize,
        inter: usize,
        gate_up: &mut Vec<f32>,
        act: &mut Vec<f32>,
        out: &mut [f32],
    ) -> Result<()> {
        let gate_up = sized(gate_up, rows * 2 * inter);
        self.gate_up.forward_into(x, rows, gate_up)?;
        add_bias(gate_up, self.gate_up_bias.as_deref());
        let act = sized(act, rows * inter);
        match activation {
            ExpertActivation::Swiglu => swiglu_rows_into(gate_up, inter, act)?,
            ExpertActivation::ClampedSwiglu => clamped_swiglu_rows_into(gate_up, inter, act),
        }
        self.down.forward_into(act, rows, out)?;
        add_bias(out, self.down_bias.as_deref());
        Ok(())
    }
}

/// Adds `bias` to every row of `rows` (whole rows of its length); nothing without one.
fn add_bias(rows: &mut [f32], bias: Option<&[f32]>) {
    if let Some(bias) = bias {
        for row in rows.chunks_exact_mut(bias.len()) {
            for (v, &b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }
}

impl MoeLayer {
    /// Bytes of every expert's weights, the router's and the shared expert's.
    pub fn weight_bytes(&self) -> usize {
        let mlp = |e: &Expert| e.gate_up.weight_bytes() + e.down.weight_bytes();
        self.router.weight_bytes()
            + self.experts.iter().map(mlp).sum::<usize>()
            + self
                .shared
                .as_ref()
                .map_or(0, |s| mlp(&s.mlp) + s.gate.weight_bytes())
    }

    /// The mixture of `x: [t, hidden]` (the FFN norm's output) into `out: [t, hidden]`.
    pub fn forward_into(
        &self,
        x: &[f32],
        t: usize,
        s: &mut MoeScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let hidden = x.len() / t;
        let (n, k, inter) = (self.experts.len(), self.rule.k, self.intermediate_size);
        let logits = sized(&mut s.logits, t * n);
        self.router.forward_into(x, t, logits)?;
        add_bias(logits, self.router_bias.as_deref());
        routing::route(logits, n, self.rule, &mut s.routes);
        s.groups.group(&s.routes, n);
        s.experts_run += s.groups.experts_hit();
        s.experts_held += n;

        let ys = sized(&mut s.ys, t * k * hidden);
        for (e, expert) in self.experts.iter().enumerate() {
            let range = s.groups.range(e);
            let rows = range.len();
            if rows == 0 {
                continue;
            }
            let xs = sized(&mut s.xs, rows * hidden);
            for (dst, &src) in xs.chunks_exact_mut(hidden).zip(s.groups.rows_of(e)) {
                dst.copy_from_slice(&x[src as usize * hidden..][..hidden]);
            }
            let y = &mut ys[range.start * hidden..range.end * hidden];
            expert.forward_into(
                self.activation,
                xs,
                rows,
                inter,
                &mut s.gate_up,
                &mut s.act,
                y,
            )?;
        }

        // Each row's outputs in its slot order: w0 * y0, then + w1 * y1, ...
        for (row, o) in out.chunks_exact_mut(hidden).enumerate() {
            let (_, weights) = s.routes.row(row);
            for (j, &w) in weights.iter().enumerate() {
                let y = &ys[s.groups.position(row, j, k) * hidden..][..hidden];
                if j == 0 {
                    for (o, &y) in o.iter_mut().zip(y) {
                        *o = y * w;
                    }
                } else {
                    for (o, &y) in o.iter_mut().zip(y) {
                        *o += y * w;
                    }
                }
            }
        }

        if let Some(shared) = &self.shared {
            let sh = sized(&mut s.shared, t * hidden);
            shared.mlp.forward_into(
                ExpertActivation::Swiglu,
                x,
                t,
                shared.intermediate_size,
                &mut s.gate_up,
                &mut s.act,
                sh,
            )?;
            let gate = sized(&mut s.shared_gate, t);
            shared.gate.forward_into(x, t, gate)?;
            for ((o, sh), &g) in out
                .chunks_exact_mut(hidden)
                .zip(sh.chunks_exact(hidden))
                .zip(gate.iter())
            {
                let g = 1.0 / (1.0 + (-g).exp());
                for (o, &v) in o.iter_mut().zip(sh) {
                    *o += v * g;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::{LinearOptions, WeightsKind};
    use candle_core::{Device, Tensor};

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn matrix(&mut self, rows: usize, cols: usize, scale: f32) -> Vec<f32> {
            (0..rows * cols).map(|_| self.next() * scale).collect()
        }
    }

    fn linear(w: &[f32], rows: usize, cols: usize) -> Linear {
        let options = LinearOptions {
            kind: WeightsKind::F32,
            device: Device::Cpu,
            amx_min_rows: None,
        };
        let t = Tensor::from_slice(w, (rows, cols), &Device::Cpu).unwrap();
        Linear::from_tensor(t, None, &options).unwrap()
    }

    fn matvec(w: &[f32], x: &[f32]) -> Vec<f64> {
        w.chunks_exact(x.len())
            .map(|row| row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum())
            .collect()
    }

    fn silu(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    /// The layer against a row-by-row loop in f64 over the same weights: each row's router
    /// softmax, its top k, each chosen expert's SwiGLU MLP, the weighted sum, and the shared
    /// expert under its sigmoid gate.
    #[test]
    fn the_mixture_equals_a_plain_loop_over_each_rows_experts() {
        let (hidden, inter, n, k, t) = (32, 24, 6, 2, 9);
        let mut rng = Rng(3);
        let router = rng.matrix(n, hidden, 1.0);
        let weights: Vec<(Vec<f32>, Vec<f32>)> = (0..n)
            .map(|_| {
                (
                    rng.matrix(2 * inter, hidden, 0.3),
                    rng.matrix(hidden, inter, 0.3),
                )
            })
            .collect();
        let shared = (
            rng.matrix(2 * inter, hidden, 0.3),
            rng.matrix(hidden, inter, 0.3),
            rng.matrix(1, hidden, 0.5),
        );
        let x = rng.matrix(t, hidden, 1.0);
        for (norm_topk, with_shared) in [(true, false), (false, true)] {
            let layer = MoeLayer {
                router: linear(&router, n, hidden),
                router_bias: None,
                activation: ExpertActivation::Swiglu,
                experts: weights
                    .iter()
                    .map(|(gu, d)| Expert {
                        gate_up: linear(gu, 2 * inter, hidden),
                        down: linear(d, hidden, inter),
                        gate_up_bias: None,
                        down_bias: None,
                    })
                    .collect(),
                rule: RoutingRule {
                    gating: crate::config::ExpertGating::SoftmaxTopK,
                    k,
                    norm_topk,
                    scale: 1.0,
                },
                intermediate_size: inter,
                shared: with_shared.then(|| SharedExpert {
                    mlp: Expert {
                        gate_up: linear(&shared.0, 2 * inter, hidden),
                        down: linear(&shared.1, hidden, inter),
                        gate_up_bias: None,
                        down_bias: None,
                    },
                    intermediate_size: inter,
                    gate: linear(&shared.2, 1, hidden),
                }),
            };
            let mut out = vec![0f32; t * hidden];
            let mut scratch = MoeScratch::default();
            layer.forward_into(&x, t, &mut scratch, &mut out).unwrap();

            let mlp = |gu: &[f32], d: &[f32], x: &[f32]| -> Vec<f64> {
                let g = matvec(gu, x);
                let act: Vec<f32> = (0..inter)
                    .map(|i| (silu(g[i]) * g[inter + i]) as f32)
                    .collect();
                matvec(d, &act)
            };
            for row in 0..t {
                let xr = &x[row * hidden..][..hidden];
                let logits = matvec(&router, xr);
                let max = logits.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                let p: Vec<f64> = e.iter().map(|v| v / sum).collect();
                let mut order: Vec<usize> = (0..n).collect();
                order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap().then(a.cmp(&b)));
                let chosen = &order[..k];
                let total: f64 = chosen.iter().map(|&c| p[c]).sum();
                let mut want = vec![0f64; hidden];
                for &c in chosen {
                    let w = if norm_topk { p[c] / total } else { p[c] };
                    let y = mlp(&weights[c].0, &weights[c].1, xr);
                    for (o, v) in want.iter_mut().zip(y) {
                        *o += w * v;
                    }
                }
                if with_shared {
                    let y = mlp(&shared.0, &shared.1, xr);
                    let g = matvec(&shared.2, xr)[0];
                    let g = 1.0 / (1.0 + (-g).exp());
                    for (o, v) in want.iter_mut().zip(y) {
                        *o += g * v;
                    }
                }
                for (i, (&got, want)) in out[row * hidden..][..hidden].iter().zip(&want).enumerate()
                {
                    assert!(
                        (got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "row {row} output {i}: {got} against {want}"
                    );
                }
            }
            assert_eq!(scratch.experts_held, n);
            assert!(scratch.experts_run >= k && scratch.experts_run <= n);
        }
    }
}
