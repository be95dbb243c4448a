//! Sampling a row inside the model, for rows that need nothing but temperature, `top_k`,
//! `top_p`, `min_p` and logprobs: what a row asks for ([`RowSampling`]), what comes back
//! ([`SampledToken`]), and [`sample_row`], the plain-Rust statement of the rule that
//! `cuda/sampling.cu` runs on the device. The CUDA kernel is checked against it
//! (`sluice-model/tests/gpu.rs`), and the engine's mock model samples with it, so the engine's
//! side of model sampling is tested on any machine.
//!
//! The rule, chosen so a GPU block can run it without sorting the vocabulary: with
//! `q_i = exp((x_i - max) / temperature)` (1 for the best token), the kept tokens are those
//! with `q_i` at or above a threshold. `min_p` sets the threshold directly; `top_k` raises it
//! to the largest threshold that still keeps at least `k` tokens (tokens tied at it are all
//! kept); `top_p` then raises it to the largest threshold whose kept mass is at least `top_p`
//! of what was kept. The thresholds are found by bisection, [`THRESHOLD_STEPS`] halvings of
//! `(0, 1]`. The draw walks the kept tokens in vocabulary order to where their running mass
//! reaches `uniform` times their total. The logprob is the chosen token's under the raw
//! logits (temperature 1, nothing filtered), as the engine reports it, and so are those of the
//! `top_logprobs` most likely tokens (largest first, the lower index first among equals, as the
//! engine's sampler lists them).

/// Most alternatives a row may ask for: OpenAI's limit on `top_logprobs`. Mirrors
/// `MAX_TOP_LOGPROBS` in `sampling.cu` (a test holds them equal).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Halvings of `(0, 1]` when searching a threshold: 2^-30 of resolution. Mirrors
/// `THRESHOLD_STEPS` in `sampling.cu` (a test holds them equal).
pub const THRESHOLD_STEPS: usize = 30;

/// How one row is sampled inside the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSampling {
    /// 0 for greedy: the first maximum, `uniform` unused.
    pub temperature: f32,
    /// 0 keeps every token.
    pub top_k: u32,
    /// 1 keeps every token.
    pub top_p: f32,
    /// 0 keeps every token.
    pub min_p: f32,
    /// In `[0, 1)`, drawn on the host from the sequence's own seeded generator.
    pub uniform: f32,
    /// The most likely tokens to report with their logprobs, up to [`MAX_TOP_LOGPROBS`].
    pub top_logprobs: u32,
}

impl RowSampling {
    /// The first maximum.
    pub const GREEDY: Self = Self {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        uniform: 0.0,
        top_logprobs: 0,
    };
}

/// A row's draw: the token and its logprob under the raw logits, and the most likely tokens
/// with theirs when the row asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    pub token: u32,
    pub logprob: f32,
    pub top: TopLogprobs,
}

/// Up to [`MAX_TOP_LOGPROBS`] `(token, logprob)`, most likely first, held inline so a step's
/// results are one flat buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopLogprobs {
    len: u8,
    entries: [(u32, f32); MAX_TOP_LOGPROBS],
}

impl Default for TopLogprobs {
    fn default() -> Self {
        Self {
            len: 0,
            entries: [(0, 0.0); MAX_TOP_LOGPROBS],
        }
    }
}

impl TopLogprobs {
    /// `entries`, of which the first [`MAX_TOP_LOGPROBS`] are kept.
    pub fn new(entries: &[(u32, f32)]) -> Self {
        let mut top = Self::default();
        for &e in entries.iter().take(MAX_TOP_LOGPROBS) {
            top.entries[usize::from(top.len)] = e;
            top.len += 1;
        }
        top
    }

    pub fn as_slice(&self) -> &[(u32, f32)] {
        &self.entries[..usize::from(self.len)]
    }
}

/// Samples one row of logits by the rule of this module's documentation.
///
/// # Panics
/// If `logits` is empty.
pub fn sample_row(logits: &[f32], row: &RowSampling) -> SampledToken {
    assert!(!logits.is_empty(), "sample_row: an empty row");
    let (argmax, max) =
        logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
                if v > bv {
                    (i, v)
                } else {
                    (bi, bv)
                }
            });
    let log_z = max + logits.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
    let token = if row.temperature > 0.0 && max.is_finite() {
        draw(logits, max, row).unwrap_or(argmax)
    } else {
        argmax
    };
    let mut top = TopLogprobs::default();
    let mut after = None;
    for _ in 0..(row.top_logprobs as usize).min(MAX_TOP_LOGPROBS) {
        let Some(i) = next_best(logits, after) else {
            break;
        };
        top.entries[usize::from(top.len)] = (i as u32, logits[i] - log_z);
        top.len += 1;
        after = Some(i);
    }
    SampledToken {
        token: token as u32,
        logprob: logits[token] - log_z,
        top,
    }
}

/// The first index after `after` in the order of the top logprobs (value descending, index
/// ascending; NaN never), or the first of all: one pass per entry, as the kernel's rounds.
fn next_best(x: &[f32], after: Option<usize>) -> Option<usize> {
    let later = |i: usize| match after {
        None => true,
        Some(a) => x[i] < x[a] || (x[i] == x[a] && i > a),
    };
    (0..x.len())
        .filter(|&i| !x[i].is_nan() && later(i))
        .fold(None, |best: Option<usize>, i| match best {
            Some(b) if x[b] >= x[i] => Some(b),
            _ => Some(i),
        })
}

/// The random draw of a row with a temperature; `None` when rounding left the target past
/// every kept token (the maximum is then the answer: it is always kept).
fn draw(x: &[f32], max: f32, row: &RowSampling) -> Option<usize> {
    let inv_t = 1.0 / row.temperature;
    let q = |v: f32| ((v - max) * inv_t).exp();
    let count = |thr: f32| x.iter().filter(|&&v| q(v) >= thr).count();
    let mass = |thr: f32| -> f32 { x.iter().map(|&v| q(v)).filter(|&w| w >= thr).sum() };
    let mut thr = row.min_p.max(0.0);
    let k = row.top_k as usize;
    if k > 0 && k < x.len() {
        let (mut lo, mut hi) = (0.0f32, 1.0f32);
        for _ in 0..THRESHOLD_STEPS {
            let mid = 0.5 * (lo + hi);
            if count(mid) >= k {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        thr = thr.max(lo);
    }
    if row.top_p < 1.0 {
        let target = row.top_p * mass(thr);
        let (mut lo, mut hi) = (thr, 1.0f32);
        for _ in 0..THRESHOLD_STEPS {
            let mid = 0.5 * (lo + hi);
            if mass(mid) >= target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        thr = lo;
    }
    let target = row.uniform.clamp(0.0, 1.0 - f32::EPSILON) * mass(thr);
    let mut acc = 0.0f32;
    for (i, &v) in x.iter().enumerate() {
        let w = q(v);
        if w < thr {
            continue;
        }
        acc += w;
        if target < acc {
            return Some(i);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(temperature: f32, top_k: u32, top_p: f32, min_p: f32, uniform: f32) -> RowSampling {
        RowSampling {
            temperature,
            top_k,
            top_p,
            min_p,
            uniform,
            top_logprobs: 0,
        }
    }

    /// Draws with `uniform` stepping evenly through [0, 1): how often each token came out.
    fn histogram(x: &[f32], r: RowSampling, draws: usize) -> Vec<usize> {
        let mut counts = vec![0; x.len()];
        for d in 0..draws {
            let u = (d as f32 + 0.5) / draws as f32;
            counts[sample_row(x, &RowSampling { uniform: u, ..r }).token as usize] += 1;
        }
        counts
    }

    #[test]
    fn greedy_takes_the_first_maximum_and_reports_the_raw_logprob() {
        let x = [0.5, 2.0, -1.0, 2.0];
        let s = sample_row(&x, &RowSampling::GREEDY);
        assert_eq!(s.token, 1);
        let lse = x.iter().map(|v: &f32| v.exp()).sum::<f32>().ln();
        assert!((s.logprob - (2.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn temperature_one_follows_the_softmax() {
        let probs = [0.1f32, 0.2, 0.3, 0.4];
        let x: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let counts = histogram(&x, row(1.0, 0, 1.0, 0.0, 0.0), 1000);
        for (c, p) in counts.iter().zip(probs) {
            assert!((*c as f32 / 1000.0 - p).abs() < 0.01, "{counts:?}");
        }
    }

    #[test]
    fn filters_keep_what_each_rule_says() {
        let probs = [0.05f32, 0.4, 0.15, 0.3, 0.1];
        let x: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let kept = |r| -> Vec<usize> {
            let h = histogram(&x, r, 2000);
            (0..x.len()).filter(|&i| h[i] > 0).collect()
        };
        // top_k 2: the two best.
        assert_eq!(kept(row(1.0, 2, 1.0, 0.0, 0.0)), vec![1, 3]);
        // top_p 0.75: 0.4 + 0.3 = 0.7 < 0.75, so the third best joins.
        assert_eq!(kept(row(1.0, 0, 0.75, 0.0, 0.0)), vec![1, 2, 3]);
        // min_p 0.3: at least 0.3 * 0.4 = 0.12.
        assert_eq!(kept(row(1.0, 0, 1.0, 0.3, 0.0)), vec![1, 2, 3]);
        // top_p is a fraction of what top_k kept: 0.6 of 0.7 needs both.
        assert_eq!(kept(row(1.0, 2, 0.6, 0.0, 0.0)), vec![1, 3]);
        // A tiny top_p keeps only the best.
        assert_eq!(kept(row(1.0, 0, 1e-6, 0.0, 0.0)), vec![1]);
    }

    #[test]
    fn kept_tokens_are_drawn_in_proportion() {
        let probs = [0.05f32, 0.4, 0.15, 0.3, 0.1];
        let x: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let h = histogram(&x, row(1.0, 2, 1.0, 0.0, 0.0), 7000);
        // 0.4 : 0.3 of the kept mass.
        assert!((h[1] as f32 / 7000.0 - 4.0 / 7.0).abs() < 0.01, "{h:?}");
        assert!((h[3] as f32 / 7000.0 - 3.0 / 7.0).abs() < 0.01, "{h:?}");
    }

    #[test]
    fn ties_at_the_top_k_edge_are_all_kept() {
        let x = [1.0, 3.0, 2.0, 2.0, 0.0];
        let h = histogram(&x, row(1.0, 2, 1.0, 0.0, 0.0), 1000);
        assert!(h[1] > 0 && h[2] > 0 && h[3] > 0, "{h:?}");
        assert_eq!(h[0] + h[4], 0, "{h:?}");
    }

    #[test]
    fn uniform_zero_takes_the_first_kept_token_and_the_top_never_falls_out() {
        let x = [0.0, 1.0, 2.0];
        assert_eq!(sample_row(&x, &row(1.0, 0, 1.0, 0.0, 0.0)).token, 0);
        assert_eq!(sample_row(&x, &row(1.0, 1, 1.0, 0.0, 0.0)).token, 2);
        // The largest uniform still lands on a kept token.
        assert_eq!(sample_row(&x, &row(0.5, 1, 1.0, 0.0, 0.999_999)).token, 2);
    }

    #[test]
    fn top_logprobs_list_the_best_tokens_lower_index_first_among_equals() {
        let x = [1.0, 3.0, -2.0, 3.0, f32::NEG_INFINITY, 2.0];
        let r = RowSampling {
            top_logprobs: 4,
            ..RowSampling::GREEDY
        };
        let s = sample_row(&x, &r);
        let tokens: Vec<u32> = s.top.as_slice().iter().map(|&(t, _)| t).collect();
        assert_eq!(tokens, vec![1, 3, 5, 0]);
        let log_z = x[1] - s.logprob;
        for &(t, lp) in s.top.as_slice() {
            assert_eq!(lp, x[t as usize] - log_z);
        }
        // More than the vocabulary holds: every token once, -inf last.
        let s = sample_row(
            &x,
            &RowSampling {
                top_logprobs: 20,
                ..r
            },
        );
        let tokens: Vec<u32> = s.top.as_slice().iter().map(|&(t, _)| t).collect();
        assert_eq!(tokens, vec![1, 3, 5, 0, 2, 4]);
        // NaN is never listed.
        let s = sample_row(
            &[0.5, f32::NAN, 0.25],
            &RowSampling {
                top_logprobs: 3,
                ..r
            },
        );
        let tokens: Vec<u32> = s.top.as_slice().iter().map(|&(t, _)| t).collect();
        assert_eq!(tokens, vec![0, 2]);
        assert_eq!(sample_row(&x, &RowSampling::GREEDY).top.as_slice(), &[]);
    }

    #[test]
    fn rows_of_minus_infinity_fall_back_to_the_first_token() {
        let x = [f32::NEG_INFINITY; 3];
        assert_eq!(sample_row(&x, &row(1.0, 0, 0.9, 0.0, 0.5)).token, 0);
    }
}
