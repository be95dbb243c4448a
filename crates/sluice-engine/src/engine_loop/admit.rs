//! Requests in and out of the loop: admission, aborts, a request's end, and the clients that
//! went away.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::EngineLoop;
use crate::events::ErrorCause;
use crate::handle::{Command, Submission};
use crate::request_state::{abort_unadmitted, RequestState};
use crate::scheduler::Aborted;
use crate::sequence::RequestId;
use crate::stop::{FinishReason, Stopped};

impl EngineLoop {
    pub(super) fn admit(&mut self, sub: Submission) {
        let Submission {
            id,
            request,
            events,
            arrival,
        } = sub;
        let n = request.n();
        self.shared.stats.pending.fetch_sub(n, Ordering::AcqRel);
        if events.is_closed() {
            return;
        }
        let embedding = request.is_embedding();
        let max_tokens = request.max_tokens();
        let (request, lora) = request.into_parts();
        let (mut state, seqs, prompt) = RequestState::admit(
            request,
            events,
            arrival,
            &self.tokenizer,
            embedding.then_some(self.embedding.hidden_size),
        );
        let adapter = lora.as_ref().map(|l| l.key.clone());
        state.lora = lora;
        let image_spans: Vec<_> = state.images.iter().map(|i| i.span).collect();
        // Validated against this engine's limits (the handle checked they are its own), so
        // the scheduler can always run it.
        self.kinds.add(&state);
        let speculative = !embedding && state.may_speculate();
        if embedding {
            let seq = seqs
                .into_iter()
                .next()
                .expect("an embedding has one sequence");
            self.scheduler.queue_prefill_only(id, prompt, state, seq);
        } else {
            self.scheduler
                .queue_request(id, prompt, max_tokens, state, seqs);
        }
        if let Some(adapter) = adapter {
            self.scheduler.assign_adapter(id, adapter);
        }
        if !image_spans.is_empty() {
            self.scheduler.set_images(id, &image_spans);
        }
        if self.scheduler.config().speculation.is_some() {
            if speculative {
                self.scheduler.allow_speculation(id);
            } else if !embedding {
                self.telemetry.metrics.spec_ineligible.increment(1);
            }
        }
        self.telemetry.publish_counts(&self.scheduler);
    }

    /// Removes a request, finishing its live sequences with `Abort`; returns how many.
    pub(super) fn abort_request(&mut self, id: RequestId) -> usize {
        self.end_request(id, FinishReason::Abort, None)
    }

    /// Removes a request, finishing its live sequences with `reason`; returns how many.
    pub(super) fn end_request(
        &mut self,
        id: RequestId,
        reason: FinishReason,
        error: Option<(String, ErrorCause)>,
    ) -> usize {
        let Some(Aborted { state, sequences }) = self.scheduler.abort(id) else {
            return 0;
        };
        self.kinds.remove(&state);
        // Free first, tell the client second: whoever sees the finish sees the blocks (the
        // draft cache's too) free.
        self.release_draft_blocks();
        self.telemetry.publish_counts(&self.scheduler);
        let now = Instant::now();
        // The sequences that already stopped left the scheduler when they did.
        for (index, seq) in &sequences {
            let stopped = Stopped {
                reason,
                stop_reason: None,
            };
            let event = state.finish_event(*index, seq, stopped, error.clone(), now);
            let _ = state.events.send(event);
            self.telemetry.sequence_finished(reason, state.arrival, now);
        }
        sequences.len()
    }

    pub(super) fn abort_everything(&mut self) -> usize {
        let ids: Vec<RequestId> = self.scheduler.request_records().map(|(id, _)| id).collect();
        let mut aborted = 0;
        for id in ids {
            aborted += self.abort_request(id);
        }
        // Submissions still in the channel get their answer too.
        while let Ok(command) = self.commands.try_recv() {
            if let Command::Submit(sub) = command {
                let n = abort_unadmitted(&sub, Instant::now());
                self.shared.stats.pending.fetch_sub(n, Ordering::AcqRel);
                aborted += n;
            }
        }
        self.telemetry.publish(&self.scheduler);
        aborted
    }

    /// Aborts requests whose client is gone: those whose send failed this step, and any whose
    /// stream was dropped (the abort command may still be in the channel).
    pub(super) fn reap_closed(&mut self) {
        for (id, r) in self.scheduler.request_records() {
            if r.events.is_closed() {
                self.outcomes.closed.push(id);
            }
        }
        while let Some(id) = self.outcomes.closed.pop() {
            self.abort_request(id);
        }
    }
}
