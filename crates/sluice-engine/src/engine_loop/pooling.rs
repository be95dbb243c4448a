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
        for (s, records) in self.scheduler.scheduled_records() {
            if let Some((r, _)) = records {
                if r.pooled.is_some() {
                    let rows = pooled_rows(self.embedding.pooling, s.start, s.len, r.prompt_len);
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
        let pooling = self.embedding.pooling;
        let mut rows = self.output.hidden.chunks_exact(self.embedding.hidden_size);
        self.scheduler.for_each_scheduled_mut(|s, records| {
            let Some((r, _)) = records else {
                return;
            };
            let prompt_len = r.prompt_len;
            let Some(pooled) = r.pooled.as_mut() else {
                return;
            };
            if s.start == 0 {
                pooled.fill(0.0);
            }
            // The forward's sizes were checked: there is a row for each.
            for (_, row) in pooled_rows(pooling, s.start, s.len, prompt_len).zip(&mut rows) {
                match pooling {
                    Pooling::Mean => pooled.iter_mut().zip(row).for_each(|(p, h)| *p += h),
                    Pooling::Cls | Pooling::Last => pooled.copy_from_slice(row),
                }
            }
        });
    }

    /// Finishes the embeddings whose last chunk this step computed: their vectors go out
    /// with their finish events, and their sequences join `self.outcomes.finished` to free
    /// their blocks.
    pub(super) fn finish_embeddings(&mut self, now: Instant) {
        if self.kinds.embeddings == 0 {
            return;
        }
        let pooling = self.embedding.pooling;
        let telemetry = &self.telemetry;
        let (finish_events, finished) = (
            &mut self.outcomes.finish_events,
            &mut self.outcomes.finished,
        );
        self.scheduler.for_each_scheduled_mut(|s, records| {
            let Some((r, seq)) = records else {
                return;
            };
            if r.pooled.is_none() || s.start + s.len < r.prompt_len {
                return;
            }
            let mean_of = (pooling == Pooling::Mean).then_some(r.prompt_len);
            let event = r.embedding_finish(seq, mean_of, now);
            telemetry
                .metrics
                .prompt_tokens
                .increment(r.prompt_len as u64);
            telemetry.sequence_finished(FinishReason::Stop, r.arrival, now);
            finish_events.push((r.events.clone(), event));
            finished.push(s.seq_id);
        });
    }
}
