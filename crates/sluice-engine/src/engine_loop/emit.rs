//! Each sampled token streamed to its request: its grammar advanced, its sequence's counters
//! and latencies recorded, its text made final with the stop checks, and the sequences that
//! stopped set aside to be freed before their finish events go out.

use std::time::Instant;

use sluice_tokenizer::Tokenizer;

use super::EngineLoop;
use crate::events::{Event, TokenEvent};
use crate::metrics::EngineMetrics;
use crate::request_state::RequestState;
use crate::rng::SeqRng;
use crate::stop::Stopped;

impl EngineLoop {
    /// Streams each sampled token and decides which sequences stopped (into `self.finished`,
    /// their finish events into `self.finish_events`).
    pub(super) fn emit(&mut self, now: Instant) {
        self.finished.clear();
        let mut generated = 0u64;
        let metrics = &self.telemetry.metrics;
        let rows = self.scheduler.output().sampling();
        for ((s, sampled), &rng) in rows.zip(self.sampled.iter_mut()).zip(&self.rngs) {
            let Some(r) = self.requests.get_mut(&s.seq_id.request) else {
                continue;
            };
            let index = s.seq_id.index;
            let seq = &mut r.seqs[index as usize];
            if seq.done {
                continue;
            }
            let grammar_done = match seq
                .constraint
                .as_deref_mut()
                .map(|c| c.commit(sampled.token))
            {
                None | Some(Ok(false)) => false,
                Some(Ok(true)) => true,
                Some(Err(message)) => {
                    // The token was sampled without a valid mask: it is not the client's.
                    self.constraint_failures.push((s.seq_id.request, message));
                    continue;
                }
            };
            generated += 1;
            record_token(r, index, sampled.token, rng, now, metrics);
            let (text, stopped) = next_text(r, index, sampled.token, grammar_done, &self.tokenizer);
            let event = Event::Token(TokenEvent {
                index,
                token: sampled.token,
                text,
                logprobs: sampled.logprobs.take(),
            });
            if r.events.send(event).is_err() {
                self.closed.push(s.seq_id.request);
                continue;
            }
            let Some(stopped) = stopped else {
                continue;
            };
            r.seqs[index as usize].done = true;
            r.live -= 1;
            let reason = stopped.reason;
            self.finish_events
                .push((r.events.clone(), r.finish_event(index, stopped, None, now)));
            self.finished.push(s.seq_id);
            self.telemetry.sequence_finished(reason, r.arrival, now);
            if r.live == 0 {
                // Once its finish events are sent, the last sender is gone and the client's
                // stream ends.
                if let Some(done) = self.requests.remove(&s.seq_id.request) {
                    self.kinds.remove(&done);
                }
            }
        }
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
    index: u32,
    token: u32,
    rng: SeqRng,
    now: Instant,
    metrics: &EngineMetrics,
) {
    let seq = &mut r.seqs[index as usize];
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
    r: &mut RequestState,
    index: u32,
    token: u32,
    grammar_done: bool,
    tokenizer: &Tokenizer,
) -> (String, Option<Stopped>) {
    let seq = &mut r.seqs[index as usize];
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
