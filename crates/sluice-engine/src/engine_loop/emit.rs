//! Each sampled token streamed to its request: its grammar advanced, its sequence's counters
//! and latencies recorded, its text made final with the stop checks, and the sequences that
//! stopped set aside to be freed before their finish events go out.

use std::time::Instant;

use sluice_tokenizer::Tokenizer;

use super::EngineLoop;
use crate::events::{Event, TokenEvent};
use crate::metrics::EngineMetrics;
use crate::request_state::{RequestState, SeqState};
use crate::rng::SeqRng;
use crate::stop::Stopped;

impl EngineLoop {
    /// Streams each sampled token and decides which sequences stopped (into `self.finished`,
    /// their finish events into `self.finish_events`).
    pub(super) fn emit(&mut self, now: Instant) {
        self.finished.clear();
        let mut generated = 0u64;
        let (telemetry, tokenizer) = (&self.telemetry, &self.tokenizer);
        let (finished, finish_events) = (&mut self.finished, &mut self.finish_events);
        let (closed, failures) = (&mut self.closed, &mut self.constraint_failures);
        let mut results = self.sampled.iter_mut().zip(&self.rngs);
        self.scheduler.for_each_scheduled_mut(|s, records| {
            if !s.sample {
                return;
            }
            // One result per sampling row, in order, whatever became of the row's sequence.
            let (Some((sampled, &rng)), Some((r, seq))) = (results.next(), records) else {
                return;
            };
            let grammar_done = match seq
                .constraint
                .as_deref_mut()
                .map(|c| c.commit(sampled.token))
            {
                None | Some(Ok(false)) => false,
                Some(Ok(true)) => true,
                Some(Err(message)) => {
                    // The token was sampled without a valid mask: it is not the client's.
                    failures.push((s.seq_id.request, message));
                    return;
                }
            };
            generated += 1;
            record_token(r, seq, sampled.token, rng, now, &telemetry.metrics);
            let (text, stopped) = next_text(r, seq, sampled.token, grammar_done, tokenizer);
            let event = Event::Token(TokenEvent {
                index: s.seq_id.index,
                token: sampled.token,
                text,
                logprobs: sampled.logprobs.take(),
            });
            if r.events.send(event).is_err() {
                closed.push(s.seq_id.request);
                return;
            }
            let Some(stopped) = stopped else {
                return;
            };
            // Freed at the end of the step; its record, and its request's with the last, leave
            // the scheduler then. Once the finish events are sent, the last sender is gone and
            // the client's stream ends.
            let reason = stopped.reason;
            let event = r.finish_event(s.seq_id.index, seq, stopped, None, now);
            finish_events.push((r.events.clone(), event));
            finished.push(s.seq_id);
            telemetry.sequence_finished(reason, r.arrival, now);
        });
        self.telemetry
            .metrics
            .generation_tokens
            .increment(generated);
    }
}

/// A sequence's bookkeeping for a token it keeps: its generator past the draw, its counts,
/// and the request's latencies (first token, between tokens) and prompt-token count.
fn record_token(
    r: &mut RequestState,
    seq: &mut SeqState,
    token: u32,
    rng: SeqRng,
    now: Instant,
    metrics: &EngineMetrics,
) {
    seq.rng = rng;
    seq.generated += 1;
    if let Some(counts) = &mut seq.counts {
        counts.add(token);
    }
    match seq.last_token {
        None => metrics
            .time_to_first_token
            .record((now - r.arrival).as_secs_f64()),
        Some(last) => metrics
            .inter_token_latency
            .record((now - last).as_secs_f64()),
    }
    seq.first_token.get_or_insert(now);
    seq.last_token = Some(now);
    if !r.prompt_counted {
        r.prompt_counted = true;
        metrics.prompt_tokens.increment(r.prompt_len as u64);
    }
}

/// The text `token` makes final for its sequence, and whether the sequence stops: at a stop
/// string or token, its length, or the end of its grammar.
fn next_text(
    r: &RequestState,
    seq: &mut SeqState,
    token: u32,
    grammar_done: bool,
    tokenizer: &Tokenizer,
) -> (String, Option<Stopped>) {
    let mut text = String::new();
    let mut stopped = seq.text.push(
        tokenizer,
        &r.stop,
        token,
        seq.generated,
        r.prompt_len + seq.generated,
        &mut text,
    );
    if grammar_done && stopped.is_none() {
        stopped = Some(seq.text.end_by_grammar(&mut text));
    }
    (text, stopped)
}
