//! The server's own step timings, where it has them: sluice's Prometheus `/metrics` carries
//! `sluice_step_duration_seconds` (every engine step) and `sluice_constraint_mask_seconds`
//! (computing one step's grammar masks, only steps with constrained rows). Scraped before and
//! after a level, the differences of their `_sum` and `_count` give the mean step time and the
//! mean mask cost per constrained step over that level. Other servers lack them: then nothing
//! is reported.

use serde::Serialize;

pub const STEP: &str = "sluice_step_duration_seconds";
pub const MASK: &str = "sluice_constraint_mask_seconds";

/// `_sum` and `_count` of the histograms (or summaries) that matter, summed over label sets;
/// `None` where the exposition does not carry them (a histogram appears once recorded).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Scrape {
    pub step: Option<(f64, f64)>,
    pub mask: Option<(f64, f64)>,
}

/// Reads `NAME_sum` and `NAME_count` out of Prometheus text exposition.
fn sum_count(text: &str, name: &str) -> Option<(f64, f64)> {
    let (mut sum, mut count) = (None::<f64>, None::<f64>);
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (slot, rest) = if let Some(r) = rest.strip_prefix("_sum") {
            (&mut sum, r)
        } else if let Some(r) = rest.strip_prefix("_count") {
            (&mut count, r)
        } else {
            continue;
        };
        // Labels, if any, then the value (and perhaps a timestamp).
        let rest = match rest.strip_prefix('{') {
            Some(r) => match r.rfind('}') {
                Some(end) => &r[end + 1..],
                None => continue,
            },
            None if rest.starts_with([' ', '\t']) => rest,
            None => continue, // another metric whose name starts with this one
        };
        if let Some(x) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *slot.get_or_insert(0.0) += x;
        }
    }
    Some((sum?, count?))
}

pub fn parse(text: &str) -> Scrape {
    Scrape {
        step: sum_count(text, STEP),
        mask: sum_count(text, MASK),
    }
}

/// What the server spent on steps between two scrapes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepCost {
    /// Engine steps in the window.
    pub steps: u64,
    /// Mean time of one of them, milliseconds.
    pub step_ms: Option<f64>,
    /// Steps that computed grammar masks.
    pub constrained_steps: u64,
    /// Mean mask time of one constrained step, milliseconds.
    pub mask_ms: Option<f64>,
}

impl StepCost {
    /// `None` when the server exposes no step metric at all (not sluice).
    pub fn between(before: &Scrape, after: &Scrape) -> Option<Self> {
        let delta = |b: Option<(f64, f64)>, a: Option<(f64, f64)>| {
            let (a_sum, a_count) = a?;
            let (b_sum, b_count) = b.unwrap_or((0.0, 0.0));
            let count = (a_count - b_count).max(0.0);
            let mean = (count > 0.0).then(|| (a_sum - b_sum) / count * 1e3);
            Some((count as u64, mean))
        };
        let (steps, step_ms) = delta(before.step, after.step)?;
        let (constrained_steps, mask_ms) = delta(before.mask, after.mask).unwrap_or((0, None));
        Some(Self {
            steps,
            step_ms,
            constrained_steps,
            mask_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "\
# TYPE sluice_step_duration_seconds histogram
sluice_step_duration_seconds_bucket{le=\"0.005\"} 3
sluice_step_duration_seconds_sum 2.5
sluice_step_duration_seconds_count 100
sluice_step_duration_seconds_total_weird 7
sluice_tokens_per_step_sum 999
";

    const AFTER: &str = "\
# HELP sluice_constraint_mask_seconds mask time
sluice_constraint_mask_seconds{quantile=\"0.5\"} 0.001
sluice_constraint_mask_seconds_sum{model=\"a\"} 0.1
sluice_constraint_mask_seconds_count{model=\"a\"} 40
sluice_step_duration_seconds_sum 4.5
sluice_step_duration_seconds_count 150 1700000000
";

    #[test]
    fn sums_and_counts_are_read() {
        let b = parse(BEFORE);
        assert_eq!(b.step, Some((2.5, 100.0)));
        assert_eq!(b.mask, None, "not recorded yet");
        let a = parse(AFTER);
        assert_eq!(a.mask, Some((0.1, 40.0)));
        assert_eq!(parse("no metrics here"), Scrape::default());
    }

    #[test]
    fn cost_between_scrapes() {
        let c = StepCost::between(&parse(BEFORE), &parse(AFTER)).unwrap();
        assert_eq!(c.steps, 50);
        assert!((c.step_ms.unwrap() - 40.0).abs() < 1e-9);
        assert_eq!(c.constrained_steps, 40);
        assert!((c.mask_ms.unwrap() - 2.5).abs() < 1e-9);
        // An unconstrained level: no mask steps; another server: nothing at all.
        let same = parse(BEFORE);
        let c = StepCost::between(&same, &same).unwrap();
        assert_eq!(
            (c.steps, c.step_ms, c.constrained_steps, c.mask_ms),
            (0, None, 0, None)
        );
        assert_eq!(
            StepCost::between(&Scrape::default(), &Scrape::default()),
            None
        );
    }
}
