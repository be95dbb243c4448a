//! What a request's stream carries. For each sequence (`index` in `0..n`): one
//! [`Event::Token`] per generated token, as it is sampled, then exactly one
//! [`Event::Finished`]; nothing follows a sequence's finish. Sequences of one request
//! interleave in step order.

use std::time::{Duration, Instant};

use crate::sampler::TokenLogprobs;
use crate::stop::{FinishReason, StopReason};

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Token(TokenEvent),
    Finished(FinishEvent),
}

impl Event {
    /// The sequence the event belongs to.
    pub fn index(&self) -> u32 {
        match self {
            Event::Token(t) => t.index,
            Event::Finished(f) => f.index,
        }
    }
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub index: u32,
    pub token: u32,
    /// Text that became final with this token: possibly empty (half a character, text held
    /// back because a stop string could begin in it, a skipped control token) and possibly
    /// more than this token's own text (held text released). The deltas of a sequence
    /// concatenate to its output text, never splitting a UTF-8 character.
    pub text: String,
    /// With `SamplingParams::logprobs`.
    pub logprobs: Option<TokenLogprobs>,
}

/// The end of one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishEvent {
    pub index: u32,
    pub reason: FinishReason,
    /// What stopped it, with [`FinishReason::Stop`].
    pub stop_reason: Option<StopReason>,
    /// Why the engine failed it, with [`FinishReason::Error`].
    pub error: Option<String>,
    /// Whose failure that was, with [`FinishReason::Error`].
    pub error_cause: Option<ErrorCause>,
    pub usage: Usage,
    pub timing: Timing,
    /// An embedding's vector (with [`FinishReason::Stop`]): its tokens' final hidden states
    /// pooled and L2-normalised.
    pub embedding: Option<Vec<f32>>,
}

/// What failed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCause {
    /// The model's forward (a fault of the server, not of the request).
    Engine,
    /// The request's own grammar: its mask went over the grammar engine's budget, or it could
    /// not take a token (the request asked for something the grammar engine cannot do).
    Constraint,
}

/// Token counts of one sequence (the server adds up the `n` of a request; the prompt is
/// counted once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose K/V came from the prefix cache when the sequence was first
    /// scheduled (a later re-prefill after preemption does not count).
    pub cached_tokens: usize,
}

/// When things happened to one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Submission.
    pub arrival: Instant,
    /// First scheduled into a step (the request's first sequence to run).
    pub scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    pub finished: Instant,
}

impl Timing {
    pub fn queue_time(&self) -> Option<Duration> {
        self.scheduled.map(|t| t - self.arrival)
    }

    pub fn time_to_first_token(&self) -> Option<Duration> {
        self.first_token.map(|t| t - self.arrival)
    }

    /// Mean time between consecutive tokens after the first.
    pub fn mean_inter_token_latency(&self, completion_tokens: usize) -> Option<Duration> {
        match (self.first_token, self.last_token) {
            (Some(first), Some(last)) if completion_tokens > 1 => {
                Some((last - first) / (completion_tokens as u32 - 1))
            }
            _ => None,
        }
    }

    pub fn e2e_latency(&self) -> Duration {
        self.finished - self.arrival
    }
}
