//! The rows an embedding pools: marked before the forward, added up after it, and the
//! embeddings whose prompt is complete finished.

use std::time::Instant;

use sluice_model::Pooling;

use super::EngineLoop;
use crate::pooling::pooled_rows;
use crate::stop::FinishReason;

impl EngineLoop {
    /// Asks the forward for the hidden states each embedding of the step pools: every row of
    /// its chunk (mean), its first token's (cls) or its last token's (last). Rows are in batch
    /// order, which [`EngineLoop::pool`] reads them back in.
    pub(super) fn mark_pooled_rows(&mut self) {
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

    /// Adds the step's hidden states to their embeddings. A chunk that starts the prompt
    /// (the first, or the first again after a preemption) starts the pool afresh. Tokens are
    /// summed in position order whatever the chunking, so the vector does not depend on how
    /// the prompt was split over steps.
    pub(super) fn pool(&mut self) {
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
    pub(super) fn finish_embeddings(&mut self, now: Instant) {
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
}
