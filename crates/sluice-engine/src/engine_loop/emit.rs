//! Each kept token streamed to its request: its grammar advanced, its sequence's counters
//! and latencies recorded, its text made final with the stop checks, and the sequences that
//! stopped set aside to be freed before their finish events go out; the step's drafted and
//! kept tokens counted.

use std::time::Instant;

use sluice_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use super::EngineLoop;
use crate::events::{Event, TokenEvent};
use crate::metrics::EngineMetrics;
use crate::request_state::{RequestState, SeqState};
use crate::rng::SeqRng;
use crate::sampler::Sampled;
use crate::scheduler::ScheduledSeq;
use crate::sequence::{RequestId, SeqId};
use crate::stop::Stopped;
use crate::telemetry::Telemetry;

impl EngineLoop {
    /// Streams each kept token and decides which sequences stopped (into
    /// `self.outcomes.finished`, their finish events into `self.outcomes.finish_events`). A
    /// sequence that verified drafts keeps the tokens of its first
    /// [`crate::ScheduledSeq::accepted`] rows, in order, up to a stop.
    pub(super) fn emit(&mut self, now: Instant) {
        self.outcomes.finished.clear();
        let mut sink = Sink {
            telemetry: &self.telemetry,
            tokenizer: &self.tokenizer,
            finished: &mut self.outcomes.finished,
            finish_events: &mut self.outcomes.finish_events,
            closed: &mut self.outcomes.closed,
            failures: &mut self.outcomes.constraint_failures,
            generated: 0,
            drafted: (0, 0, 0),
            now,
        };
        let mut results = self.sampling.sampled.iter_mut().zip(&self.sampling.rngs);
        self.scheduler.for_each_scheduled_mut(|s, mut records| {
            // One result per sampling row, in order, whatever became of the row's sequence.
            let rows = results.by_ref().take(s.num_rows());
            let mut open = records.is_some();
            for (i, (sampled, &rng)) in rows.enumerate() {
                if let (true, Some((r, seq))) = (open && i < s.accepted, records.as_mut()) {
                    let at_length = s.reached_length && i + 1 == s.accepted;
                    open = sink.keep(s, r, seq, sampled, rng, at_length);
                }
            }
            if s.draft > 0 {
                sink.drafted.0 += 1;
                sink.drafted.1 += s.draft as u64;
                sink.drafted.2 += s.accepted.saturating_sub(1) as u64;
            }
        });
        let (generated, (drafts, drafted, accepted)) = (sink.generated, sink.drafted);
        self.telemetry
            .metrics
            .generation_tokens
            .increment(generated);
        if drafts > 0 {
            self.telemetry.speculated(drafts, drafted, accepted);
        }
    }
}

/// Where a step's kept tokens go: the clients' events, the sequences that stopped, the
/// requests whose client or grammar failed, and the step's counts.
struct Sink<'a> {
    telemetry: &'a Telemetry,
    tokenizer: &'a Tokenizer,
    finished: &'a mut Vec<SeqId>,
    finish_events: &'a mut Vec<(UnboundedSender<Event>, Event)>,
    closed: &'a mut Vec<RequestId>,
    failures: &'a mut Vec<(RequestId, String)>,
    generated: u64,
    /// Sequences that drafted, tokens drafted, drafted tokens kept.
    drafted: (u64, u64, u64),
    now: Instant,
}

impl Sink<'_> {
    /// Streams one kept token of `s`'s sequence (`at_length`: the last it may generate);
    /// returns whether the sequence takes more this step (false once it stopped, or its
    /// grammar or client failed).
    fn keep(
        &mut self,
        s: &ScheduledSeq,
        r: &mut RequestState,
        seq: &mut SeqState,
        sampled: &mut Sampled,
        rng: SeqRng,
        at_length: bool,
    ) -> bool {
        let grammar_done = match seq
            .constraint
            .as_deref_mut()
            .map(|c| c.commit(sampled.token))
        {
            None | Some(Ok(false)) => false,
            Some(Ok(true)) => true,
            Some(Err(message)) => {
                // The token was sampled without a valid mask: it is not the client's.
                self.failures.push((s.seq_id.request, message));
                return false;
            }
        };
        self.generated += 1;
        let now = self.now;
        record_token(r, seq, sampled.token, rng, now, &self.telemetry.metrics);
        let (text, stopped) = next_text(
            r,
            seq,
            sampled.token,
            at_length,
            grammar_done,
            self.tokenizer,
        );
        let event = Event::Token(TokenEvent {
            index: s.seq_id.index,
            token: sampled.token,
            text,
            logprobs: sampled.logprobs.take(),
        });
        if r.events.send(event).is_err() {
            self.closed.push(s.seq_id.request);
            return false;
        }
        let Some(stopped) = stopped else {
            return true;
        };
        // Freed at the end of the step; its record, and its request's with the last, leave
        // the scheduler then. Once the finish events are sent, the last sender is gone and
        // the client's stream ends.
        let reason = stopped.reason;
        let event = r.finish_event(s.seq_id.index, seq, stopped, None, now);
        self.finish_events.push((r.events.clone(), event));
        self.finished.push(s.seq_id);
        self.telemetry.sequence_finished(reason, r.arrival, now);
        false
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
    at_length: bool,
    grammar_done: bool,
    tokenizer: &Tokenizer,
) -> (String, Option<Stopped>) {
    let mut text = String::new();
    let mut stopped = seq.text.push(
        tokenizer,
        &r.stop,
        token,
        seq.generated,
        at_length,
        &mut text,
    );
    if grammar_done && stopped.is_none() {
        stopped = Some(seq.text.end_by_grammar(&mut text));
    }
    (text, stopped)
}
