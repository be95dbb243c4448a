//! The router's arithmetic, pure and on plain slices: each row's probabilities over the
//! experts, its top k (ties to the lowest expert index), their weights; then the step's rows
//! grouped by expert (a counting sort), so that each chosen expert multiplies all of its rows
//! at once and its weights are read once a step.
//!
//! Every number a row gets here is a function of that row's router logits alone: the softmax,
//! the choice and the weights of a row never look at another row, which keeps a mixture of
//! experts as invisible to batching as a dense layer.

use std::ops::Range;

use crate::config::ExpertGating;

/// How a row's router probabilities become its experts' weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutingRule {
    /// Experts a row runs.
    pub k: usize,
    /// A softmax over every expert then the top k, or the top k of the raw logits then a
    /// softmax over them.
    pub gating: ExpertGating,
    /// The k chosen probabilities divided by their sum (clamped below at 2^-14, as llama.cpp
    /// clamps it: a sum that underflows never divides by zero).
    pub norm_topk: bool,
    /// A factor on every weight after the division; 1 for none.
    pub scale: f32,
}

/// The smallest sum of chosen probabilities a row is divided by ([`RoutingRule::norm_topk`]).
pub const MIN_TOPK_SUM: f32 = 6.103_515_6e-5;

/// Each row's k experts and their weights, in top-k slot order (slot 0 the most probable).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Routes {
    pub k: usize,
    /// `[rows, k]` expert indices.
    pub experts: Vec<u32>,
    /// `[rows, k]` weights.
    pub weights: Vec<f32>,
}

impl Routes {
    #[cfg(test)]
    pub fn rows(&self) -> usize {
        self.experts.len().checked_div(self.k).unwrap_or(0)
    }

    /// Row `t`'s experts and weights.
    pub fn row(&self, t: usize) -> (&[u32], &[f32]) {
        let r = t * self.k..(t + 1) * self.k;
        (&self.experts[r.clone()], &self.weights[r])
    }
}

/// Routes every row of `logits: [rows, num_experts]` into `routes` (its buffers kept from step
/// to step); a softmax-first rule turns each row into its probabilities in place.
///
/// # Panics
/// When `logits` is not whole rows, or `rule.k` is 0 or more than `num_experts` (the loader
/// refuses such files).
pub fn route(logits: &mut [f32], num_experts: usize, rule: RoutingRule, routes: &mut Routes) {
    assert!(
        rule.k >= 1 && rule.k <= num_experts,
        "k = {} of {num_experts} experts",
        rule.k
    );
    assert!(logits.len().is_multiple_of(num_experts), "whole rows");
    let rows = logits.len() / num_experts;
    routes.k = rule.k;
    routes.experts.resize(rows * rule.k, 0);
    routes.weights.resize(rows * rule.k, 0.0);
    for ((row, experts), weights) in logits
        .chunks_exact_mut(num_experts)
        .zip(routes.experts.chunks_exact_mut(rule.k))
        .zip(routes.weights.chunks_exact_mut(rule.k))
    {
        match rule.gating {
            ExpertGating::SoftmaxTopK => {
                softmax_in_place(row);
                top_k(row, experts);
                for (w, &e) in weights.iter_mut().zip(experts.iter()) {
                    *w = row[e as usize];
                }
            }
            ExpertGating::TopKSoftmax => {
                top_k(row, experts);
                for (w, &e) in weights.iter_mut().zip(experts.iter()) {
                    *w = row[e as usize];
                }
                softmax_in_place(weights);
            }
        }
        if rule.norm_topk {
            let sum = weights.iter().fold(0.0f32, |acc, &w| acc + w);
            let sum = sum.max(MIN_TOPK_SUM);
            for w in weights.iter_mut() {
                *w /= sum;
            }
        }
        if rule.scale != 1.0 {
            for w in weights.iter_mut() {
                *w *= rule.scale;
            }
        }
    }
}

/// `row` as its softmax, in f32: the maximum subtracted, exponentials summed in index order.
pub fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut sum = 0.0f32;
    for x in row.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    for x in row.iter_mut() {
        *x /= sum;
    }
}

/// `a` ranks above `b`: larger, a NaN below every number, equal values left to the index.
fn ranks_above(a: f32, b: f32) -> bool {
    a > b || (b.is_nan() && !a.is_nan())
}

/// The `out.len()` largest values of `probs`, most probable first; of equal values the lowest
/// index first.
pub fn top_k(probs: &[f32], out: &mut [u32]) {
    for slot in 0..out.len() {
        let mut best: Option<usize> = None;
        for (e, &p) in probs.iter().enumerate() {
            if out[..slot].contains(&(e as u32)) {
                continue;
            }
            if best.is_none_or(|b| ranks_above(p, probs[b])) {
                best = Some(e);
            }
        }
        out[slot] = best.expect("k <= experts") as u32;
    }
}

/// The rows of a step grouped by expert: every (row, slot) of [`Routes`] given one position,
/// the positions of an expert contiguous and in row order.
#[derive(Debug, Default, Clone)]
pub struct ExpertGroups {
    /// `[experts + 1]`: where each expert's positions start; the last is rows * k.
    starts: Vec<u32>,
    /// `[rows * k]`: the row at each position.
    rows: Vec<u32>,
    /// `[rows * k]`: the position of (row, slot), at `row * k + slot`.
    positions: Vec<u32>,
}

impl ExpertGroups {
    /// Groups `routes` over `num_experts` experts (a counting sort: two passes over the
    /// routes, none over the experts beyond their counts).
    ///
    /// # Panics
    /// When a route names an expert past `num_experts`.
    pub fn group(&mut self, routes: &Routes, num_experts: usize) {
        let n = routes.experts.len();
        self.starts.clear();
        self.starts.resize(num_experts + 1, 0);
        for &e in &routes.experts {
            self.starts[e as usize + 1] += 1;
        }
        for e in 0..num_experts {
            self.starts[e + 1] += self.starts[e];
        }
        // The starts double as each expert's cursor (its next free position); after the pass
        // each holds its expert's end, which is the next expert's start: shifted back below.
        self.rows.resize(n, 0);
        self.positions.resize(n, 0);
        let k = routes.k.max(1);
        for (i, &e) in routes.experts.iter().enumerate() {
            let cursor = &mut self.starts[e as usize];
            self.positions[i] = *cursor;
            self.rows[*cursor as usize] = (i / k) as u32;
            *cursor += 1;
        }
        for e in (1..=num_experts).rev() {
            self.starts[e] = self.starts[e - 1];
        }
        self.starts[0] = 0;
    }

    /// Expert `e`'s positions.
    pub fn range(&self, e: usize) -> Range<usize> {
        self.starts[e] as usize..self.starts[e + 1] as usize
    }

    /// The rows of expert `e`, in row order (a row appears once: its k experts differ).
    pub fn rows_of(&self, e: usize) -> &[u32] {
        &self.rows[self.range(e)]
    }

    /// The position of row `t`'s slot `j` (`k` experts a row).
    pub fn position(&self, t: usize, j: usize, k: usize) -> usize {
        self.positions[t * k + j] as usize
    }

    /// Experts that at least one row chose.
    pub fn experts_hit(&self) -> usize {
        self.starts.windows(2).filter(|w| w[1] > w[0]).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Over random routings: a row routed alone gets the bits it gets among other rows;
        /// its experts differ and come most probable first (ties to the lowest index); every
        /// (row, slot) has one position, in its expert's range, holding its row; each
        /// expert's rows are in row order.
        #[test]
        fn random_routings_route_and_group_each_row_exactly_once(
            experts in 1usize..40,
            k_seed in 0usize..100,
            rows in 1usize..50,
            norm_topk in any::<bool>(),
            values in proptest::collection::vec(-8i32..8, 2000),
        ) {
            let k = 1 + k_seed % experts;
            let rule = RoutingRule {
                gating: ExpertGating::SoftmaxTopK,
                k,
                norm_topk,
                scale: 1.0,
            };
            // Coarse values, so that ties are common.
            let logits: Vec<f32> = (0..rows * experts)
                .map(|i| values[i % values.len()] as f32 * 0.5)
                .collect();
            let mut probs = logits.clone();
            let mut routes = Routes::default();
            route(&mut probs, experts, rule, &mut routes);
            prop_assert_eq!(routes.rows(), rows);
            for t in 0..rows {
                let mut alone = logits[t * experts..(t + 1) * experts].to_vec();
                let mut one = Routes::default();
                route(&mut alone, experts, rule, &mut one);
                let (e, w) = routes.row(t);
                prop_assert_eq!(&one.experts[..], e);
                let bits = |w: &[f32]| w.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&one.weights), bits(w));
                let p = &probs[t * experts..(t + 1) * experts];
                for j in 0..k {
                    prop_assert!(!e[..j].contains(&e[j]));
                    if j > 0 {
                        let (a, b) = (e[j - 1] as usize, e[j] as usize);
                        prop_assert!(p[a] > p[b] || (p[a] == p[b] && a < b));
                    }
                }
                // Nothing left out ranks above the last chosen one.
                let last = e[k - 1] as usize;
                for x in 0..experts {
                    if !e.contains(&(x as u32)) {
                        prop_assert!(p[x] < p[last] || (p[x] == p[last] && x > last));
                    }
                }
            }
            let mut g = ExpertGroups::default();
            g.group(&routes, experts);
            let mut seen = vec![false; rows * k];
            for t in 0..rows {
                for j in 0..k {
                    let pos = g.position(t, j, k);
                    prop_assert!(!seen[pos]);
                    seen[pos] = true;
                    prop_assert!(g.range(routes.experts[t * k + j] as usize).contains(&pos));
                    prop_assert_eq!(g.rows[pos] as usize, t);
                }
            }
            let mut hit = 0;
            for x in 0..experts {
                let r = g.rows_of(x);
                prop_assert!(r.windows(2).all(|w| w[0] < w[1]));
                hit += usize::from(!r.is_empty());
            }
            prop_assert_eq!(g.experts_hit(), hit);
        }
    }

    fn rule(k: usize, norm_topk: bool) -> RoutingRule {
        RoutingRule {
            gating: ExpertGating::SoftmaxTopK,
            k,
            norm_topk,
            scale: 1.0,
        }
    }

    #[test]
    fn ties_go_to_the_lowest_expert() {
        let mut logits = vec![1.0, 3.0, 3.0, 0.5, 3.0];
        let mut routes = Routes::default();
        route(&mut logits, 5, rule(2, false), &mut routes);
        assert_eq!(routes.experts, [1, 2]);
        let mut logits = vec![2.0; 4];
        route(&mut logits, 4, rule(3, true), &mut routes);
        assert_eq!(routes.experts, [0, 1, 2]);
        for w in &routes.weights {
            assert!((w - 1.0 / 3.0).abs() < 1e-7);
        }
    }

    #[test]
    fn weights_are_the_softmax_renormalised_or_not() {
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let mut probs = logits;
        softmax_in_place(&mut probs);
        let total: f32 = probs.iter().sum();
        assert!((total - 1.0).abs() < 1e-6);

        let mut routes = Routes::default();
        let mut l = logits.to_vec();
        route(&mut l, 4, rule(2, false), &mut routes);
        assert_eq!(routes.experts, [3, 2]);
        assert_eq!(routes.weights, [probs[3], probs[2]]);

        let mut l = logits.to_vec();
        route(&mut l, 4, rule(2, true), &mut routes);
        let sum = probs[3] + probs[2];
        assert_eq!(routes.weights, [probs[3] / sum, probs[2] / sum]);

        let mut l = logits.to_vec();
        let scaled = RoutingRule {
            gating: ExpertGating::SoftmaxTopK,
            k: 2,
            norm_topk: true,
            scale: 2.5,
        };
        route(&mut l, 4, scaled, &mut routes);
        assert_eq!(routes.weights, [probs[3] / sum * 2.5, probs[2] / sum * 2.5]);
    }

    #[test]
    fn k_of_one_and_k_of_every_expert() {
        let mut routes = Routes::default();
        let mut l = vec![0.3, -1.0, 2.0];
        route(&mut l, 3, rule(1, true), &mut routes);
        assert_eq!(routes.experts, [2]);
        assert_eq!(routes.weights, [1.0]);

        let mut l = vec![0.3, -1.0, 2.0];
        route(&mut l, 3, rule(3, false), &mut routes);
        assert_eq!(routes.experts, [2, 0, 1]);
        let total: f32 = routes.weights.iter().sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn a_nan_logit_is_never_chosen_over_a_number() {
        let mut routes = Routes::default();
        let mut l = vec![f32::NAN, 1.0, 0.0];
        route(&mut l, 3, rule(1, false), &mut routes);
        // The softmax of a row with a NaN is NaN throughout: no panic, and the choice still
        // names an expert.
        assert_eq!(routes.experts.len(), 1);
        let mut out = [0u32; 2];
        top_k(&[f32::NAN, 0.2, 0.7], &mut out);
        assert_eq!(out, [2, 1]);
    }

    #[test]
    fn a_tiny_sum_is_clamped_before_dividing() {
        let mut routes = Routes::default();
        // Among many equal experts the two chosen ones sum to less than the clamp.
        let mut l = vec![0.0f32; 100_000];
        route(&mut l, 100_000, rule(2, true), &mut routes);
        let p = 1.0f32 / 100_000.0;
        assert!(p * 2.0 < MIN_TOPK_SUM);
        for w in &routes.weights {
            assert!((w - p / MIN_TOPK_SUM).abs() < 1e-3, "{w}");
        }
    }

    #[test]
    fn grouping_puts_every_row_slot_in_its_expert_once() {
        let routes = Routes {
            k: 2,
            experts: vec![3, 0, 0, 1, 3, 1],
            weights: vec![0.5; 6],
        };
        let mut g = ExpertGroups::default();
        g.group(&routes, 5);
        assert_eq!(g.rows_of(0), [0, 1]);
        assert_eq!(g.rows_of(1), [1, 2]);
        assert_eq!(g.rows_of(2), [] as [u32; 0]);
        assert_eq!(g.rows_of(3), [0, 2]);
        assert_eq!(g.rows_of(4), [] as [u32; 0]);
        assert_eq!(g.experts_hit(), 3);
        for t in 0..3 {
            for j in 0..2 {
                let e = routes.experts[t * 2 + j] as usize;
                let p = g.position(t, j, 2);
                assert!(g.range(e).contains(&p));
                assert_eq!(g.rows[p] as usize, t);
            }
        }
    }
}
