//! Speculative decoding by n-gram lookup ("prompt lookup"): guess a sequence's next tokens by
//! finding its last few tokens earlier in its own text (prompt and output) and proposing what
//! followed them there. Coding agents mostly rewrite text that is already in the prompt, where
//! such guesses run long and right.
//!
//! The scheduler puts a sequence's guesses ("drafts") after its last token in the same step,
//! so one forward computes the logits of every position; the engine samples each row, and the
//! scheduler keeps the drafts up to the first one the model would not have picked, plus the
//! model's own token there. A row's arithmetic does not depend on its step, so those logits
//! are exactly those of plain decoding; row `i` draws the random number plain decoding draws
//! `i` tokens on, so a sequence's tokens, greedy or sampled (seeded or not), are identical to
//! plain decoding's, token for token. (With drafts that are one guess each, keeping a draft
//! when the row's sample equals it is rejection sampling: it is kept with the probability
//! the model gives it.) Requests with penalties or a grammar do not speculate: their row `i`
//! depends on which drafts before it are kept. The engine decides
//! ([`crate::request_state`]).
//!
//! A draft model ([`Proposer::DraftModel`]) guesses instead: the engine runs a second,
//! smaller model of the same tokenizer greedily over the sequences about to draft (the
//! engine's `draft_model` module) and hands each sequence's guesses to the scheduler before it
//! plans the step; verification and rollback are the same.
//!
//! Pure logic: what to propose and how many, from a sequence's tokens and its record of
//! acceptance. No tensors.

/// Where a sequence's drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proposer {
    /// N-gram lookup in the sequence's own text ([`propose`]), inside the scheduler.
    Ngram,
    /// A draft model the engine runs before each step; the scheduler takes what it was
    /// handed ([`crate::Scheduler::set_proposal`]).
    DraftModel,
}

/// How sequences speculate; `None` in [`crate::SchedulerConfig::speculation`] turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculationConfig {
    pub proposer: Proposer,
    /// Most tokens drafted per sequence and step (`--num-speculative-tokens`).
    pub num_tokens: usize,
    /// Longest n-gram matched; shorter ones are tried down to `min_ngram`.
    pub max_ngram: usize,
    pub min_ngram: usize,
    /// Steps with more running sequences than this draft nothing: past a few sequences a
    /// step is compute-bound, and drafts only add work to it.
    pub max_running: usize,
    /// A draft model sizes each round's guesses by what they cost and how often they come
    /// true, and guesses nothing where that does not pay (the server's setting); `false`
    /// guesses as many as allowed every round, which tests use to make every round draft.
    pub cost_aware: bool,
}

impl SpeculationConfig {
    /// N-gram speculation with up to `num_tokens` drafts a step.
    pub fn ngram(num_tokens: usize) -> Self {
        Self {
            proposer: Proposer::Ngram,
            num_tokens,
            max_ngram: 4,
            min_ngram: 2,
            max_running: 4,
            cost_aware: true,
        }
    }

    /// Speculation with a draft model, up to `num_tokens` drafts a step (each one a forward
    /// of the draft model).
    pub fn draft_model(num_tokens: usize) -> Self {
        Self {
            proposer: Proposer::DraftModel,
            ..Self::ngram(num_tokens)
        }
    }
}

/// Writes into `draft` (cleared first) up to `max` tokens that followed the most recent
/// earlier occurrence of `tokens`' last n tokens, for the longest n from `config.max_ngram`
/// down to `config.min_ngram` that occurs earlier. Nothing when no suffix recurs.
pub fn propose(tokens: &[u32], config: &SpeculationConfig, max: usize, draft: &mut Vec<u32>) {
    draft.clear();
    if max == 0 {
        return;
    }
    for n in (config.min_ngram.max(1)..=config.max_ngram).rev() {
        if tokens.len() <= n {
            continue;
        }
        let suffix = &tokens[tokens.len() - n..];
        // The latest occurrence that ends before the suffix itself, so at least one token
        // follows it.
        let found = (0..tokens.len() - n)
            .rev()
            .find(|&start| &tokens[start..start + n] == suffix);
        if let Some(start) = found {
            let from = start + n;
            let to = (from + max).min(tokens.len());
            // An image's cache keys are no tokens to propose: the draft stops before them.
            let taken = tokens[from..to]
                .iter()
                .take_while(|&&t| !crate::images::is_image_key(t));
            draft.extend(taken);
            return;
        }
    }
}

/// How many tokens a sequence drafts next, from how its last drafts fared: all accepted
/// doubles it (up to the configured most), a rejection of the first halves it (down to 1), and
/// anything between keeps it. A sequence that guesses badly costs little; one that copies
/// text grows to full drafts within a few steps.
pub fn next_draft_len(current: usize, drafted: usize, accepted: usize, most: usize) -> usize {
    let current = current.clamp(1, most.max(1));
    if drafted == 0 {
        current
    } else if accepted == drafted {
        (current * 2).min(most.max(1))
    } else if accepted == 0 {
        (current / 2).max(1)
    } else {
        current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SpeculationConfig {
        SpeculationConfig::ngram(4)
    }

    #[test]
    fn the_latest_longest_match_proposes_what_followed() {
        let mut draft = Vec::new();
        // "... 1 2 3 | 9 8 ... 1 2 3 | 7 6 5 4 ... 1 2 3": the latest earlier "1 2 3" wins.
        let tokens = [1, 2, 3, 9, 8, 0, 1, 2, 3, 7, 6, 5, 4, 0, 1, 2, 3];
        propose(&tokens, &config(), 3, &mut draft);
        assert_eq!(draft, [7, 6, 5]);
        propose(&tokens, &config(), 10, &mut draft);
        assert_eq!(draft, [7, 6, 5, 4, 0, 1, 2, 3], "up to the end of the text");
        propose(&tokens, &config(), 0, &mut draft);
        assert!(draft.is_empty());
    }

    #[test]
    fn shorter_ngrams_are_tried_and_no_match_drafts_nothing() {
        let mut draft = vec![42];
        // Only the last two tokens ("5 6") recur.
        propose(&[5, 6, 7, 1, 5, 6], &config(), 4, &mut draft);
        assert_eq!(draft, [7, 1, 5, 6]);
        propose(&[1, 2, 3, 4, 5, 6], &config(), 4, &mut draft);
        assert!(draft.is_empty());
        // A single repeated token is below min_ngram (2).
        propose(&[9, 1, 2, 9], &config(), 4, &mut draft);
        assert!(draft.is_empty());
        propose(&[3], &config(), 4, &mut draft);
        assert!(draft.is_empty());
    }

    #[test]
    fn draft_length_grows_on_success_and_shrinks_on_failure() {
        assert_eq!(next_draft_len(2, 2, 2, 8), 4);
        assert_eq!(next_draft_len(8, 8, 8, 8), 8);
        assert_eq!(next_draft_len(4, 4, 0, 8), 2);
        assert_eq!(next_draft_len(1, 1, 0, 8), 1);
        assert_eq!(next_draft_len(4, 4, 2, 8), 4);
        assert_eq!(next_draft_len(4, 0, 0, 8), 4, "no draft, no news");
        assert_eq!(next_draft_len(0, 0, 0, 8), 1);
    }
}
