//! What the engine thread keeps per request while it runs, and the finish events built from
//! it: the client's event channel, its sampling and stop rules, and per sequence the random
//! generator, the penalty counts, the text stream and the timestamps. Both records live in
//! the scheduler, beside its own of the same request and sequence
//! ([`crate::scheduler::Scheduler`]'s `R` and `S`), and leave with them.

use std::sync::Arc;
use std::time::Instant;

use sluice_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::constraint::SeqConstraint;
use crate::events::{ErrorCause, Event, FinishEvent, Timing, Usage};
use crate::handle::Submission;
use crate::images::{is_image_key, ImageSpan};
use crate::params::{LoraRequest, Request, SamplingParams};
use crate::pooling::l2_normalize;
use crate::rng::SeqRng;
use crate::sampler::TokenCounts;
use crate::stop::{FinishReason, StopSpec, Stopped, TextStream};

pub(crate) struct SeqState {
    pub rng: SeqRng,
    /// Generated-token counts, kept only when the request uses penalties.
    pub counts: Option<TokenCounts>,
    pub text: TextStream,
    pub generated: usize,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    /// Prompt tokens found in the prefix cache when it was first scheduled.
    pub cached_tokens: Option<usize>,
    /// The grammar its output must follow, when the request has one.
    pub constraint: Option<Box<SeqConstraint>>,
}

pub(crate) struct RequestState {
    pub events: UnboundedSender<Event>,
    pub sampling: SamplingParams,
    pub stop: StopSpec,
    pub prompt_len: usize,
    /// Distinct prompt tokens, sorted, for the repetition penalty (empty without it).
    pub prompt_set: Vec<u32>,
    pub arrival: Instant,
    pub scheduled: Option<Instant>,
    pub prompt_counted: bool,
    /// Its sequences follow a grammar.
    pub constrained: bool,
    /// An embedding's pooled hidden state so far (`None` for a generation): the sum of its
    /// pooled rows for mean pooling, the row itself for the others.
    pub pooled: Option<Vec<f32>>,
    /// The LoRA adapter its sequences run with: the engine loads it into the model's slot
    /// when the scheduler gives it one.
    pub lora: Option<LoraRequest>,
    /// Its prompt's images, in prompt order.
    pub images: Vec<RequestImage>,
}

/// One image of a request's prompt: its pixels until the vision tower has run, then the
/// tower's rows, kept while the request lives (a preempted sequence recomputes its prompt).
pub(crate) struct RequestImage {
    pub span: ImageSpan,
    pub pixels: Option<Arc<[f32]>>,
    pub rows: Option<Arc<[f32]>>,
}

impl RequestState {
    /// The state of a request the engine thread takes in and of its sequences, none of them
    /// started; hands the prompt back for the scheduler (which keeps `max_tokens` with the
    /// sequences). `embedding_size` is set for an embedding (the length of its vector).
    pub fn admit(
        request: Request,
        events: UnboundedSender<Event>,
        arrival: Instant,
        tokenizer: &Tokenizer,
        embedding_size: Option<usize>,
    ) -> (Self, Vec<SeqState>, Vec<u32>) {
        let Request {
            prompt,
            n,
            sampling,
            stop,
            constraint,
            images,
            ..
        } = request;
        let prompt_set = if sampling.repetition_penalty != 1.0 {
            // An image's cache keys are not tokens to penalize.
            let mut set: Vec<u32> = prompt
                .iter()
                .copied()
                .filter(|&t| !is_image_key(t))
                .collect();
            set.sort_unstable();
            set.dedup();
            set
        } else {
            Vec::new()
        };
        let stop = StopSpec::new(stop, tokenizer);
        let seed = sampling.seed.unwrap_or_else(rand::random);
        let has_penalties = sampling.has_penalties();
        let seqs = (0..n as u32)
            .map(|index| SeqState {
                rng: SeqRng::new(seed, index),
                counts: has_penalties.then(TokenCounts::default),
                text: TextStream::new(stop.params.skip_special_tokens),
                generated: 0,
                first_token: None,
                last_token: None,
                cached_tokens: None,
                constraint: constraint.as_ref().map(|c| Box::new(c.start())),
            })
            .collect();
        let state = Self {
            events,
            sampling,
            stop,
            prompt_len: prompt.len(),
            prompt_set,
            arrival,
            scheduled: None,
            prompt_counted: false,
            constrained: constraint.is_some(),
            pooled: embedding_size.map(|size| vec![0.0; size]),
            lora: None,
            images: images
                .into_iter()
                .map(|image| RequestImage {
                    span: image.span(),
                    pixels: Some(image.pixels),
                    rows: None,
                })
                .collect(),
        };
        (state, seqs, prompt)
    }

    /// The finish of an embedding whose every token is computed: its pooled state (a sum over
    /// `mean_of` tokens for mean pooling), L2-normalised as OpenAI's embeddings are.
    pub fn embedding_finish(
        &mut self,
        seq: &SeqState,
        mean_of: Option<usize>,
        now: Instant,
    ) -> Event {
        // Leaves `pooled` set (empty): the request is still an embedding as it leaves.
        let mut vector = self.pooled.as_mut().map(std::mem::take).unwrap_or_default();
        if let Some(n) = mean_of.filter(|&n| n > 0) {
            let scale = 1.0 / n as f32;
            vector.iter_mut().for_each(|v| *v *= scale);
        }
        l2_normalize(&mut vector);
        let stopped = Stopped {
            reason: FinishReason::Stop,
            stop_reason: None,
        };
        let mut event = self.finish_event(0, seq, stopped, None, now);
        if let Event::Finished(finish) = &mut event {
            finish.embedding = Some(vector);
        }
        event
    }

    /// Its sequences may verify drafted tokens ([`crate::speculation`]): row `i` of a
    /// sequence's drafts can be sampled as plain decoding would sample `i` tokens later
    /// without knowing which drafts are kept. Its generator is advanced by the rows before it
    /// and its `min_tokens` bans are counted `i` tokens on; penalties (which count the tokens
    /// before the row) and a grammar (whose state follows them) cannot, so those requests run
    /// without drafts.
    pub fn may_speculate(&self) -> bool {
        !self.sampling.has_penalties() && !self.constrained
    }

    pub fn finish_event(
        &self,
        index: u32,
        seq: &SeqState,
        stopped: Stopped,
        error: Option<(String, ErrorCause)>,
        now: Instant,
    ) -> Event {
        Event::Finished(FinishEvent {
            index,
            reason: stopped.reason,
            stop_reason: stopped.stop_reason,
            error_cause: error.as_ref().map(|(_, cause)| *cause),
            error: error.map(|(message, _)| message),
            usage: Usage {
                prompt_tokens: self.prompt_len,
                completion_tokens: seq.generated,
                cached_tokens: seq.cached_tokens.unwrap_or(0),
            },
            timing: Timing {
                arrival: self.arrival,
                scheduled: self.scheduled,
                first_token: seq.first_token,
                last_token: seq.last_token,
                finished: now,
            },
            embedding: None,
        })
    }
}

/// Answers a submission the engine thread never took in (it is exiting): every sequence
/// finishes with `Abort`. Returns how many sequences that was.
pub(crate) fn abort_unadmitted(sub: &Submission, now: Instant) -> usize {
    let n = sub.request.n();
    for index in 0..n as u32 {
        let _ = sub.events.send(Event::Finished(FinishEvent {
            index,
            reason: FinishReason::Abort,
            stop_reason: None,
            error: None,
            error_cause: None,
            usage: Usage {
                prompt_tokens: sub.request.prompt_len(),
                completion_tokens: 0,
                cached_tokens: 0,
            },
            timing: Timing {
                arrival: sub.arrival,
                scheduled: None,
                first_token: None,
                last_token: None,
                finished: now,
            },
            embedding: None,
        }));
    }
    n
}
