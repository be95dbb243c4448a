//! The loop of the engine thread, as DESIGN.md draws it: take in submissions and aborts, then
//! per step
//!
//! ```text
//! plan   = scheduler.schedule()          // who runs this step
//! batch  = scheduler.fill_step_batch()   // flat tokens + metadata
//! logits = model.forward(batch)          // ONE forward, all sequences
//! tokens = sampler.sample(logits, rows)  // batched sampling (or the model's own, below)
//! scheduler.commit(tokens); emit events; finished sequences leave and free their blocks
//! ```
//!
//! The thread owns the model (and so its KV cache). With nothing to do it blocks on its
//! command channel. Per-request bookkeeping lives in [`crate::request_state`], publishing
//! counters and metrics in [`crate::telemetry`].
//!
//! A model that samples rows itself ([`Model::samples_rows`], a GPU) gets the rows that need
//! nothing but temperature, `top_k`, `top_p`, `min_p` and logprobs marked in the batch before
//! the forward, with their random numbers drawn from each sequence's generator as the sampler
//! would draw them; it hands back their tokens instead of their logits, and the sampler takes
//! the rest. Which rows go where depends only on each row's own request.
//!
//! Failure model: a forward that errors (or panics) fails only the requests in that step,
//! with an error finish event; the engine goes on with the next step. A client that goes away
//! (its [`crate::RequestStream`] dropped) is noticed by the end of the step at the latest,
//! through the abort its stream sends or the closed event channel, and its blocks are freed
//! then.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use sluice_model::{Pooling, StepBatch, StepOutput};
use sluice_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::constraint::SeqConstraint;
use crate::events::{ErrorCause, Event, TokenEvent};
use crate::handle::{Command, Shared, Submission};
use crate::model::Model;
use crate::params::SamplingParams;
use crate::pooling::pooled_rows;
use crate::request_state::{abort_unadmitted, RequestState};
use crate::rng::SeqRng;
use crate::sampler::{model_rule, SampleRow, Sampled, Sampler, TokenLogprobs};
use crate::scheduler::Scheduler;
use crate::sequence::{RequestId, SeqId};
use crate::stop::{FinishReason, Stopped};
use crate::telemetry::{StepTiming, Telemetry};

/// Sampling parameters for a row whose request is unknown, which would be an engine bug; the
/// row is still sampled so the step's rows line up, and its token is dropped at commit.
static ORPHAN_PARAMS: LazyLock<SamplingParams> = LazyLock::new(SamplingParams::greedy);

pub(crate) struct EngineLoop {
    model: Box<dyn Model>,
    tokenizer: Arc<Tokenizer>,
    scheduler: Scheduler,
    sampler: Sampler,
    shared: Arc<Shared>,
    commands: Receiver<Command>,
    requests: HashMap<RequestId, RequestState>,
    telemetry: Telemetry,
    draining: bool,
    // Buffers reused every step.
    batch: StepBatch,
    /// The forward's logits and pooled hidden states.
    output: StepOutput,
    /// The sampler's rows; empty between steps (they borrow the step's request states).
    rows: Vec<SampleRow<'static>>,
    sampled: Vec<Sampled>,
    /// Whether the model samples the rows it can itself ([`Model::samples_rows`]).
    model_samples_rows: bool,
    /// Per sampling row of a step whose model samples rows: what the engine keeps of a row the
    /// model samples (`None` for the sampler's rows).
    model_rows: Vec<Option<ModelRow>>,
    /// The sampler's results of a step the model shares, merged into `sampled` in row order.
    host_sampled: Vec<Sampled>,
    tokens: Vec<u32>,
    rngs: Vec<SeqRng>,
    finished: Vec<SeqId>,
    /// Finish events held until the step has freed the finished sequences' blocks.
    finish_events: Vec<(UnboundedSender<Event>, Event)>,
    closed: Vec<RequestId>,
    /// What kinds of request `requests` holds.
    kinds: RequestKinds,
    pooling: Pooling,
    hidden_size: usize,
    /// Requests whose grammar failed this step, with why; they end with an error.
    constraint_failures: Vec<(RequestId, String)>,
    /// The step's constrained sequences, whose masks are computed in parallel; empty between
    /// steps (it borrows the request states).
    mask_jobs: Vec<&'static mut SeqConstraint>,
}

/// How many requests of the loop carry a grammar, and how many are embeddings: while there
/// are none of a kind, a step spends nothing on it (masks, pooling).
#[derive(Default)]
struct RequestKinds {
    constrained: usize,
    embeddings: usize,
}

impl RequestKinds {
    fn add(&mut self, state: &RequestState) {
        self.constrained += usize::from(state.is_constrained());
        self.embeddings += usize::from(state.pooled.is_some());
    }

    fn remove(&mut self, state: &RequestState) {
        self.constrained -= usize::from(state.is_constrained());
        self.embeddings -= usize::from(state.pooled.is_some());
    }
}

/// A row the model samples: its generator past the draw the model was given, and whether its
/// request reports logprobs (the model computes the top ones the rule asks for).
#[derive(Clone, Copy)]
struct ModelRow {
    rng: SeqRng,
    logprob: bool,
}

enum Flow {
    Continue,
    Exit,
}

impl EngineLoop {
    pub fn new(
        model: Box<dyn Model>,
        tokenizer: Arc<Tokenizer>,
        scheduler: Scheduler,
        shared: Arc<Shared>,
        commands: Receiver<Command>,
        telemetry: Telemetry,
    ) -> Self {
        Self {
            sampler: Sampler::new(model.vocab_size()),
            model_samples_rows: model.samples_rows(),
            batch: StepBatch::new(model.block_size()),
            pooling: shared.pooling,
            hidden_size: model.hidden_size(),
            model,
            tokenizer,
            scheduler,
            shared,
            commands,
            requests: HashMap::new(),
            telemetry,
            draining: false,
            output: StepOutput::default(),
            rows: Vec::new(),
            sampled: Vec::new(),
            model_rows: Vec::new(),
            host_sampled: Vec::new(),
            tokens: Vec::new(),
            rngs: Vec::new(),
            finished: Vec::new(),
            finish_events: Vec::new(),
            closed: Vec::new(),
            kinds: RequestKinds::default(),
            constraint_failures: Vec::new(),
            mask_jobs: Vec::new(),
        }
    }

    /// Runs until stopped, drained, or every sender is gone; returns how many sequences were
    /// aborted on the way out.
    pub fn run(mut self) -> usize {
        loop {
            if !self.scheduler.has_unfinished() {
                if self.draining {
                    // Submissions that raced with the drain get an abort, not silence.
                    return self.abort_everything();
                }
                self.telemetry.publish(&self.scheduler);
                // Idle: block until there is something to do.
                let Ok(command) = self.commands.recv() else {
                    return self.abort_everything();
                };
                if let Flow::Exit = self.handle(command) {
                    return self.abort_everything();
                }
            }
            while let Ok(command) = self.commands.try_recv() {
                if let Flow::Exit = self.handle(command) {
                    return self.abort_everything();
                }
            }
            if self.scheduler.has_unfinished() {
                self.step();
            }
        }
    }

    fn handle(&mut self, command: Command) -> Flow {
        match command {
            Command::Submit(submission) => self.admit(*submission),
            Command::Abort(id) => self.abort_request(id),
            Command::Drain => self.draining = true,
            Command::Stop => return Flow::Exit,
        }
        Flow::Continue
    }

    fn admit(&mut self, sub: Submission) {
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
        let (request, max_tokens) = request.into_parts();
        let (state, prompt) = RequestState::admit(
            request,
            max_tokens,
            events,
            arrival,
            &self.tokenizer,
            self.shared.limits.max_model_len,
            embedding.then_some(self.hidden_size),
        );
        // Validated against this engine's limits (the handle checked they are its own), so
        // the scheduler can always run it.
        if embedding {
            self.scheduler.add_prefill_only(id, prompt);
        } else {
            self.scheduler.add_request(id, prompt, max_tokens, n);
        }
        self.kinds.add(&state);
        self.requests.insert(id, state);
        self.telemetry.publish_counts(&self.scheduler);
    }

    /// Removes a request, finishing its live sequences with `Abort`.
    fn abort_request(&mut self, id: RequestId) {
        self.end_request(id, FinishReason::Abort, None);
    }

    fn end_request(
        &mut self,
        id: RequestId,
        reason: FinishReason,
        error: Option<(String, ErrorCause)>,
    ) {
        self.scheduler.abort(id);
        let Some(state) = self.requests.remove(&id) else {
            return;
        };
        self.kinds.remove(&state);
        // Free first, tell the client second: whoever sees the finish sees the blocks free.
        self.telemetry.publish_counts(&self.scheduler);
        let now = Instant::now();
        for (index, seq) in state.seqs.iter().enumerate() {
            if seq.done {
                continue;
            }
            let stopped = Stopped {
                reason,
                stop_reason: None,
            };
            let _ =
                state
                    .events
                    .send(state.finish_event(index as u32, stopped, error.clone(), now));
            self.telemetry.sequence_finished(reason, state.arrival, now);
        }
    }

    fn abort_everything(&mut self) -> usize {
        let ids: Vec<RequestId> = self.requests.keys().copied().collect();
        let mut aborted = 0;
        for id in ids {
            aborted += self.requests.get(&id).map_or(0, |r| r.live);
            self.abort_request(id);
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

    fn step(&mut self) {
        let step_start = Instant::now();
        let out = self.scheduler.schedule();
        if out.is_empty() {
            // Cannot happen while something is unfinished (the oldest running sequence can
            // always proceed); wait for a command rather than spin if it ever does.
            let _ = self.scheduler.commit(&[]);
            self.telemetry.publish(&self.scheduler);
            if let Ok(command) = self.commands.recv_timeout(Duration::from_millis(100)) {
                self.handle(command);
            }
            return;
        }
        let num_tokens = out.num_tokens();
        for s in out.scheduled() {
            if let Some(r) = self.requests.get_mut(&s.seq_id.request) {
                if let Some(seq) = r.seqs.get_mut(s.seq_id.index as usize) {
                    // Its first chunk starts after what the prefix cache held.
                    seq.cached_tokens.get_or_insert(s.start);
                }
                if r.scheduled.is_none() {
                    r.scheduled = Some(step_start);
                    self.telemetry
                        .metrics
                        .queue_time
                        .record((step_start - r.arrival).as_secs_f64());
                }
            }
        }
        self.scheduler.fill_step_batch(&mut self.batch);
        self.mark_pooled_rows();
        self.mark_model_sampled_rows();
        self.telemetry.publish_counts(&self.scheduler);

        let forward_start = Instant::now();
        let (model, batch, output) = (&mut self.model, &self.batch, &mut self.output);
        let result = catch_unwind(AssertUnwindSafe(|| model.forward(batch, output)));
        let forward = forward_start.elapsed();
        let num_samples = self.scheduler.output().num_samples();
        let num_model_sampled = self.model_rows.iter().flatten().count();
        let num_logits = num_samples - num_model_sampled;
        let num_pooled = self.batch.hidden_indices.len();
        let failure = match result {
            Ok(Ok(()))
                if self.output.logits.len() == num_logits * self.sampler.vocab_size()
                    && self.output.sampled.len() == num_model_sampled
                    && self.output.hidden.len() == num_pooled * self.hidden_size =>
            {
                None
            }
            Ok(Ok(())) => Some(format!(
                "the model returned {} logits for {num_logits} rows of {}, {} tokens for \
                 {num_model_sampled} rows it samples and {} hidden values for {num_pooled} \
                 rows of {}",
                self.output.logits.len(),
                self.sampler.vocab_size(),
                self.output.sampled.len(),
                self.output.hidden.len(),
                self.hidden_size
            )),
            Ok(Err(e)) => Some(e.to_string()),
            Err(panic) => Some(format!("model forward panicked: {}", panic_message(&panic))),
        };
        let mut timing = StepTiming {
            start: step_start,
            forward,
            sample: Duration::ZERO,
            num_tokens,
        };
        if let Some(message) = failure {
            self.fail_step(message);
            self.telemetry.finish_step(&self.scheduler, timing);
            return;
        }

        self.pool();
        let sample_start = Instant::now();
        self.sample();
        timing.sample = sample_start.elapsed();
        if let Err(e) = self.scheduler.commit(&self.tokens) {
            tracing::error!("commit failed: {e}");
        }
        let now = Instant::now();
        self.emit(now);
        self.finish_embeddings(now);
        for &id in &self.finished {
            self.scheduler.finish(id);
        }
        // Free and count first, tell the client second: whoever sees a finish sees its blocks
        // free and the step's counters (prefix hits, preemptions) published, even when the
        // request finished in the step that admitted it.
        self.telemetry.publish(&self.scheduler);
        for (events, event) in self.finish_events.drain(..) {
            let _ = events.send(event);
        }
        while let Some((id, message)) = self.constraint_failures.pop() {
            tracing::warn!("request {id:?} failed: {message}");
            self.end_request(
                id,
                FinishReason::Error,
                Some((message, ErrorCause::Constraint)),
            );
        }
        self.reap_closed();
        self.telemetry.finish_step(&self.scheduler, timing);
    }

    /// Asks the forward for the hidden states each embedding of the step pools: every row of
    /// its chunk (mean), its first token's (cls) or its last token's (last). Rows are in batch
    /// order, which [`EngineLoop::pool`] reads them back in.
    fn mark_pooled_rows(&mut self) {
        if self.kinds.embeddings == 0 {
            return;
        }
        let mut row = 0;
        for s in self.scheduler.output().scheduled() {
            if let Some(r) = self.requests.get(&s.seq_id.request) {
                if r.pooled.is_some() {
                    let rows = pooled_rows(self.pooling, s.start, s.len, r.prompt_len);
                    self.batch
                        .hidden_indices
                        .extend(rows.map(|i| (row + i) as u32));
                }
            }
            row += s.len;
        }
    }

    /// With a model that samples rows itself, marks the step's rows it may sample: those
    /// whose request needs nothing but temperature, `top_k`, `top_p`, `min_p` and logprobs,
    /// and that neither a grammar nor `min_tokens` restricts this step. Their random numbers
    /// are drawn here, from each sequence's generator, as the sampler would have drawn them.
    fn mark_model_sampled_rows(&mut self) {
        self.model_rows.clear();
        if !self.model_samples_rows {
            return;
        }
        let requests = &self.requests;
        for s in self.scheduler.output().sampling() {
            let row = requests.get(&s.seq_id.request).and_then(|r| {
                let seq = r.seqs.get(s.seq_id.index as usize)?;
                if seq.constraint.is_some() || !r.stop.banned(seq.generated).is_empty() {
                    return None;
                }
                let mut rng = seq.rng;
                let rule = model_rule(&r.sampling, &mut rng)?;
                let logprob = r.sampling.logprobs.is_some();
                Some((rule, ModelRow { rng, logprob }))
            });
            self.batch.model_sampling.push(row.map(|(rule, _)| rule));
            self.model_rows.push(row.map(|(_, kept)| kept));
        }
    }

    /// Adds the step's hidden states to their embeddings. A chunk that starts the prompt
    /// (the first, or the first again after a preemption) starts the pool afresh. Tokens are
    /// summed in position order whatever the chunking, so the vector does not depend on how
    /// the prompt was split over steps.
    fn pool(&mut self) {
        if self.kinds.embeddings == 0 {
            return;
        }
        let size = self.hidden_size;
        let mut rows = self.output.hidden.chunks_exact(size);
        for s in self.scheduler.output().scheduled() {
            let Some(r) = self.requests.get_mut(&s.seq_id.request) else {
                continue;
            };
            let prompt_len = r.prompt_len;
            let Some(pooled) = r.pooled.as_mut() else {
                continue;
            };
            if s.start == 0 {
                pooled.fill(0.0);
            }
            for _ in pooled_rows(self.pooling, s.start, s.len, prompt_len) {
                let Some(row) = rows.next() else {
                    return;
                };
                match self.pooling {
                    Pooling::Mean => pooled.iter_mut().zip(row).for_each(|(p, h)| *p += h),
                    Pooling::Cls | Pooling::Last => pooled.copy_from_slice(row),
                }
            }
        }
    }

    /// Finishes the embeddings whose last chunk this step computed: their vectors go out
    /// with their finish events, and their sequences join `self.finished` to free their
    /// blocks.
    fn finish_embeddings(&mut self, now: Instant) {
        if self.kinds.embeddings == 0 {
            return;
        }
        let pooling = self.pooling;
        for s in self.scheduler.output().scheduled() {
            let id = s.seq_id.request;
            let Some(r) = self.requests.get_mut(&id) else {
                continue;
            };
            if r.pooled.is_none() || s.start + s.len < r.prompt_len {
                continue;
            }
            let mean_of = (pooling == Pooling::Mean).then_some(r.prompt_len);
            let event = r.embedding_finish(mean_of, now);
            r.seqs[0].done = true;
            r.live = 0;
            self.telemetry
                .metrics
                .prompt_tokens
                .increment(r.prompt_len as u64);
            self.telemetry
                .sequence_finished(FinishReason::Stop, r.arrival, now);
            self.finish_events.push((r.events.clone(), event));
            self.finished.push(s.seq_id);
            if let Some(done) = self.requests.remove(&id) {
                self.kinds.remove(&done);
            }
        }
    }

    /// Computes the token masks of the step's constrained rows, all at once on the rayon
    /// pool. While no request has a grammar this is one comparison.
    fn compute_masks(&mut self) {
        if self.kinds.constrained == 0 {
            return;
        }
        let mut any = false;
        for s in self.scheduler.output().sampling() {
            let seq = self
                .requests
                .get_mut(&s.seq_id.request)
                .and_then(|r| r.seqs.get_mut(s.seq_id.index as usize));
            if let Some(c) = seq.and_then(|seq| seq.constraint.as_deref_mut()) {
                c.due = true;
                any = true;
            }
        }
        if !any {
            return;
        }
        let start = Instant::now();
        let mut jobs = recycle(std::mem::take(&mut self.mask_jobs));
        jobs.extend(
            self.requests
                .values_mut()
                .flat_map(|r| r.seqs.iter_mut())
                .filter_map(|seq| seq.constraint.as_deref_mut())
                .filter(|c| c.due),
        );
        jobs.par_iter_mut().for_each(|c| {
            c.due = false;
            c.compute_mask();
        });
        self.mask_jobs = recycle(jobs);
        self.telemetry
            .metrics
            .mask_duration
            .record(start.elapsed().as_secs_f64());
    }

    /// Samples every row of the step into `self.tokens` (and `self.sampled`): the rows the
    /// model sampled come from its output, the others from the sampler.
    fn sample(&mut self) {
        self.compute_masks();
        let requests = &self.requests;
        let model_rows = &self.model_rows;
        let by_model = |i: usize| matches!(model_rows.get(i), Some(Some(_)));
        let mut rows = reuse_rows(std::mem::take(&mut self.rows));
        rows.extend(
            self.scheduler
                .output()
                .sampling()
                .enumerate()
                .filter(|&(i, _)| !by_model(i))
                .map(|(_, s)| match requests.get(&s.seq_id.request) {
                    Some(r) => {
                        let seq = &r.seqs[s.seq_id.index as usize];
                        SampleRow {
                            params: &r.sampling,
                            rng: seq.rng,
                            prompt_tokens: &r.prompt_set,
                            output_counts: seq.counts.as_ref(),
                            banned: r.stop.banned(seq.generated),
                            allowed: seq.constraint.as_ref().and_then(|c| c.allowed()),
                        }
                    }
                    None => SampleRow {
                        params: &ORPHAN_PARAMS,
                        rng: SeqRng::new(0, 0),
                        prompt_tokens: &[],
                        output_counts: None,
                        banned: &[],
                        allowed: None,
                    },
                }),
        );
        self.rngs.clear();
        if self.model_rows.is_empty() {
            self.sampler
                .sample(&mut self.output.logits, &mut rows, &mut self.sampled);
            self.rngs.extend(rows.iter().map(|r| r.rng));
        } else {
            self.sampler
                .sample(&mut self.output.logits, &mut rows, &mut self.host_sampled);
            self.sampled.clear();
            let mut host = self.host_sampled.drain(..).zip(rows.iter().map(|r| r.rng));
            let mut picked = self.output.sampled.iter();
            for kept in &self.model_rows {
                let from_model = kept.as_ref().and_then(|k| Some((k, picked.next()?)));
                let (sampled, rng) = match from_model {
                    Some((kept, t)) => {
                        let logprobs = kept.logprob.then(|| TokenLogprobs {
                            token: t.token,
                            logprob: t.logprob,
                            top: t.top.as_slice().to_vec(),
                        });
                        let sampled = Sampled {
                            token: t.token,
                            logprobs,
                        };
                        (sampled, kept.rng)
                    }
                    // Counts were checked after the forward: every row has its result.
                    None => host.next().expect("a sampler result per row"),
                };
                self.sampled.push(sampled);
                self.rngs.push(rng);
            }
        }
        self.rows = reuse_rows(rows);
        self.tokens.clear();
        self.tokens.extend(self.sampled.iter().map(|s| s.token));
    }

    /// Streams each sampled token and decides which sequences stopped (into `self.finished`,
    /// their finish events into `self.finish_events`).
    fn emit(&mut self, now: Instant) {
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
            seq.rng = rng;
            seq.generated += 1;
            if let Some(counts) = &mut seq.counts {
                counts.add(sampled.token);
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
            let mut text = String::new();
            let mut stopped = seq.text.push(
                &self.tokenizer,
                &r.stop,
                sampled.token,
                seq.generated,
                r.prompt_len + seq.generated,
                &mut text,
            );
            if grammar_done && stopped.is_none() {
                stopped = Some(seq.text.end_by_grammar(&mut text));
            }
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
            if let Some(stopped) = stopped {
                seq.done = true;
                r.live -= 1;
                let reason = stopped.reason;
                self.finish_events
                    .push((r.events.clone(), r.finish_event(index, stopped, None, now)));
                self.finished.push(s.seq_id);
                self.telemetry.sequence_finished(reason, r.arrival, now);
                if r.live == 0 {
                    // Once its finish events are sent, the last sender is gone and the
                    // client's stream ends.
                    if let Some(done) = self.requests.remove(&s.seq_id.request) {
                        self.kinds.remove(&done);
                    }
                }
            }
        }
        metrics.generation_tokens.increment(generated);
    }

    /// Aborts requests whose client is gone: those whose send failed this step, and any whose
    /// stream was dropped (the abort command may still be in the channel).
    fn reap_closed(&mut self) {
        for (&id, r) in &self.requests {
            if r.events.is_closed() {
                self.closed.push(id);
            }
        }
        while let Some(id) = self.closed.pop() {
            self.abort_request(id);
        }
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
        self.tokens.clear();
        self.tokens.resize(self.scheduler.output().num_samples(), 0);
        if let Err(e) = self.scheduler.commit(&self.tokens) {
            tracing::error!("commit after a failed step: {e}");
        }
    }
}

/// `buffer`'s allocation, emptied, retyped to borrow for another step (see [`reuse_rows`]).
fn recycle<'b>(mut buffer: Vec<&mut SeqConstraint>) -> Vec<&'b mut SeqConstraint> {
    buffer.clear();
    buffer
        .into_iter()
        .map(|_| unreachable!("the buffer was cleared"))
        .collect()
}

/// `buffer`'s allocation, emptied, retyped for rows borrowing from another step. Collecting a
/// mapped `vec::IntoIter` into a `Vec` whose element has the same layout reuses the source
/// allocation (std's in-place collect), and the iterator is empty, so this is free: the rows
/// of a step cost no allocation once the buffer has grown to the batch.
fn reuse_rows<'a, 'b>(mut buffer: Vec<SampleRow<'a>>) -> Vec<SampleRow<'b>> {
    buffer.clear();
    buffer
        .into_iter()
        .map(|_| unreachable!("the buffer was cleared"))
        .collect()
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_rows_keep_their_allocation() {
        let params = SamplingParams::greedy();
        let mut rows: Vec<SampleRow<'_>> = Vec::with_capacity(64);
        rows.push(SampleRow {
            params: &params,
            rng: SeqRng::new(0, 0),
            prompt_tokens: &[],
            output_counts: None,
            banned: &[],
            allowed: None,
        });
        let ptr = rows.as_ptr() as usize;
        let reused: Vec<SampleRow<'static>> = reuse_rows(rows);
        assert!(reused.is_empty());
        assert_eq!(reused.capacity(), 64);
        assert_eq!(reused.as_ptr() as usize, ptr);
    }
}
