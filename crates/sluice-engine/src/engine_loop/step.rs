//! One step, from plan to finish: schedule, lay the batch out, run the forward (a failure or a
//! panic fails only the step's requests), then pool, sample, commit, stream, and free what
//! stopped before telling the clients.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use super::{panic_message, EngineLoop};
use crate::events::ErrorCause;
use crate::scheduler::Removed;
use crate::sequence::RequestId;
use crate::stop::FinishReason;
use crate::telemetry::StepTiming;

impl EngineLoop {
    pub(super) fn step(&mut self) {
        let step_start = Instant::now();
        self.propose_drafts();
        let Some(num_tokens) = self.plan(step_start) else {
            return;
        };
        let forward_start = Instant::now();
        // The vision tower runs in the forward's time: it is the step's compute too.
        let failure = self.place_images().or_else(|| self.forward());
        let forward_time = forward_start.elapsed();
        if let Some(drafter) = &mut self.drafter {
            drafter.observe_target_step(num_tokens, forward_time);
        }
        let mut timing = StepTiming {
            start: step_start,
            forward: forward_time,
            sample: Duration::ZERO,
            num_tokens,
        };
        if let Some(message) = failure {
            self.fail_step(message);
            self.send_kv_events();
            self.telemetry.finish_step(&self.scheduler, timing);
            return;
        }
        self.pool();
        let sample_start = Instant::now();
        self.sample();
        timing.sample = sample_start.elapsed();
        if let Err(e) = self.scheduler.commit(&self.sampling.tokens) {
            tracing::error!("commit failed: {e}");
        }
        self.finish(Instant::now());
        // Inside the step's time: the batch is part of what a step costs with --kv-events.
        self.send_kv_events();
        self.telemetry.finish_step(&self.scheduler, timing);
    }

    /// Schedules the step and lays it out in `self.batch`; returns its token count, or `None`
    /// when nothing could be scheduled.
    fn plan(&mut self, step_start: Instant) -> Option<usize> {
        let out = self.scheduler.schedule();
        if out.is_empty() {
            // Cannot happen while something is unfinished (the oldest running sequence can
            // always proceed); wait for a command rather than spin if it ever does.
            let _ = self.scheduler.commit(&[]);
            self.telemetry.publish(&self.scheduler);
            if let Ok(command) = self.commands.recv_timeout(Duration::from_millis(100)) {
                self.handle(command);
            }
            return None;
        }
        let num_tokens = out.num_tokens();
        let queue_time = &self.telemetry.metrics.queue_time;
        self.scheduler.for_each_scheduled_mut(|s, records| {
            let Some((r, seq)) = records else {
                return;
            };
            // Its first chunk starts after what the prefix cache held.
            seq.cached_tokens.get_or_insert(s.start);
            if r.scheduled.is_none() {
                r.scheduled = Some(step_start);
                queue_time.record((step_start - r.arrival).as_secs_f64());
            }
        });
        self.scheduler.fill_step_batch(&mut self.batch);
        self.load_adapters();
        self.mark_pooled_rows();
        self.mark_model_sampled_rows();
        self.telemetry.publish_counts(&self.scheduler);
        Some(num_tokens)
    }

    /// Puts the adapters the plan gave a model slot into it, each from the record of a request
    /// admitted with it. One that the model refuses ends that request at once, with the error:
    /// its rows of this step are then dropped, never computed without their adapter.
    fn load_adapters(&mut self) {
        for i in 0..self.scheduler.output().adapter_loads().len() {
            let (slot, seq) = self.scheduler.output().adapter_loads()[i];
            let adapter = self
                .scheduler
                .request_record(seq.request)
                .and_then(|r| r.lora.as_ref())
                .map(|l| l.adapter.clone());
            let Some(adapter) = adapter else { continue };
            if let Err(e) = self.model.set_adapter(slot, Some(adapter)) {
                tracing::error!("cannot load a LoRA adapter into slot {slot}: {e}");
                self.end_request(
                    seq.request,
                    FinishReason::Error,
                    Some((
                        format!("cannot load the LoRA adapter: {e}"),
                        ErrorCause::Engine,
                    )),
                );
            }
        }
    }

    /// Runs the forward; returns why the step failed, if it did (an error, a panic, or an
    /// output whose sizes do not fit the step).
    fn forward(&mut self) -> Option<String> {
        let (model, batch, output) = (&mut self.model, &self.batch, &mut self.output);
        let result = catch_unwind(AssertUnwindSafe(|| model.forward(batch, output)));
        let num_samples = self.scheduler.output().num_samples();
        let num_model_sampled = self.sampling.model_rows.iter().flatten().count();
        let num_logits = num_samples - num_model_sampled;
        let num_pooled = self.batch.hidden_indices.len();
        match result {
            Ok(Ok(()))
                if self.output.logits.len() == num_logits * self.sampling.sampler.vocab_size()
                    && self.output.sampled.len() == num_model_sampled
                    && self.output.hidden.len() == num_pooled * self.embedding.hidden_size =>
            {
                if let Some(share) = self.model.expert_share() {
                    self.telemetry.expert_share(share);
                }
                None
            }
            Ok(Ok(())) => Some(format!(
                "the model returned {} logits for {num_logits} rows of {}, {} tokens for \
                 {num_model_sampled} rows it samples and {} hidden values for {num_pooled} \
                 rows of {}",
                self.output.logits.len(),
                self.sampling.sampler.vocab_size(),
                self.output.sampled.len(),
                self.output.hidden.len(),
                self.embedding.hidden_size
            )),
            Ok(Err(e)) => Some(e.to_string()),
            Err(panic) => Some(format!("model forward panicked: {}", panic_message(&panic))),
        }
    }

    /// After the commit: streams the step's tokens, finishes what stopped, frees its blocks,
    /// then tells the clients, and ends the requests whose grammar or client failed.
    fn finish(&mut self, now: Instant) {
        self.emit(now);
        self.finish_embeddings(now);
        for &id in &self.outcomes.finished {
            // A request's record leaves with its last sequence.
            if let Some(Removed {
                request: Some(done),
                ..
            }) = self.scheduler.finish(id)
            {
                self.kinds.remove(&done);
            }
        }
        // Free and count first, tell the client second: whoever sees a finish sees its blocks
        // (the draft cache's too) free and the step's counters (prefix hits, preemptions)
        // published, even when the request finished in the step that admitted it.
        self.release_draft_blocks();
        self.telemetry.publish(&self.scheduler);
        for (events, event) in self.outcomes.finish_events.drain(..) {
            let _ = events.send(event);
        }
        while let Some((id, message)) = self.outcomes.constraint_failures.pop() {
            tracing::warn!("request {id:?} failed: {message}");
            self.end_request(
                id,
                FinishReason::Error,
                Some((message, ErrorCause::Constraint)),
            );
        }
        self.reap_closed();
    }

    /// Fails every request with a sequence in the current step; the step's plan is then
    /// committed empty-handed (those sequences are gone, so nothing is applied).
    fn fail_step(&mut self, message: String) {
        tracing::error!("engine step failed: {message}");
        self.telemetry.failed_step();
        let mut failed: Vec<RequestId> = self
            .scheduler
            .output()
            .scheduled()
            .iter()
            .map(|s| s.seq_id.request)
            .collect();
        failed.sort_unstable();
        failed.dedup();
        for id in failed {
            self.end_request(
                id,
                FinishReason::Error,
                Some((message.clone(), ErrorCause::Engine)),
            );
        }
        self.sampling.tokens.clear();
        self.sampling
            .tokens
            .resize(self.scheduler.output().num_samples(), 0);
        if let Err(e) = self.scheduler.commit(&self.sampling.tokens) {
            tracing::error!("commit after a failed step: {e}");
        }
    }
}
