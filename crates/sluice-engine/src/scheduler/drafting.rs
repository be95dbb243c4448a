//! Speculation's drafting, outside the scheduler's core: which sequences may draft and how
//! many tokens, the draft model's guesses handed in from outside, and the drafts placed after a
//! decoding sequence's last token while [`Scheduler::schedule`] plans the step. Verifying them
//! is [`Scheduler::commit`]'s.

use super::Scheduler;
use crate::sequence::{RequestId, SeqId, Sequence, SequenceStatus};
use crate::speculation::{propose, Proposer, SpeculationConfig};

/// A sequence that may draft in the next step ([`Scheduler::draft_candidates`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftCandidate {
    pub id: SeqId,
    /// The most tokens it may draft.
    pub max: usize,
}

impl<R, S> Scheduler<R, S> {
    /// Lets the sequences of `request` draft tokens when speculation is on: the caller's
    /// promise that it can sample each draft's row as plain decoding would sample that
    /// position (no penalties, no grammar).
    pub fn allow_speculation(&mut self, request: RequestId) {
        let Some(n) = self.requests.get(&request).map(|r| r.n) else {
            return;
        };
        for index in 0..n {
            if let Some(&slot) = self.ids.get(&SeqId::new(request, index)) {
                if let Some(seq) = self.slots[slot].as_mut() {
                    seq.speculative = true;
                }
            }
        }
    }

    /// The sequences that would draft in the next step if they had guesses, with the most
    /// tokens each may draft (cleared first): running, allowed to speculate, decoding (one
    /// token to compute), below `max_tokens`, in a step of few enough sequences. The engine
    /// runs its draft model over them and hands the guesses back through
    /// [`Scheduler::set_proposal`] before [`Scheduler::schedule`].
    pub fn draft_candidates(&self, out: &mut Vec<DraftCandidate>) {
        out.clear();
        let Some(config) = self.config.speculation else {
            return;
        };
        if self.running.len() > config.max_running {
            return;
        }
        let budget = self.config.max_num_batched_tokens;
        for &slot in &self.running {
            let seq = self.slots[slot].as_ref().expect("running slot is live");
            if let Some(max) = Self::draft_room(seq, &config, budget) {
                out.push(DraftCandidate { id: seq.id(), max });
            }
        }
    }

    /// Hands a sequence the draft model's guesses for the next step (at most the `max` of its
    /// [`DraftCandidate`]); the next [`Scheduler::schedule`] puts them in the step if its
    /// blocks can grow for them, and drops them either way.
    pub fn set_proposal(&mut self, id: SeqId, draft: &[u32]) {
        if let Some(seq) = self.ids.get(&id).and_then(|&s| self.slots[s].as_mut()) {
            seq.proposal.clear();
            seq.proposal.extend_from_slice(draft);
        }
    }

    /// How many tokens `seq` may draft in a step with `budget` tokens left: `None` when it may
    /// not draft at all. At most what its `max_tokens` leaves after the step's token, and what
    /// the budget leaves.
    fn draft_room<T>(
        seq: &Sequence<T>,
        config: &SpeculationConfig,
        budget: usize,
    ) -> Option<usize> {
        // Decoding: one token to compute, or after a rejected draft on a model with recurrent
        // layers the kept drafts again and the token after them (`BlockPools::roll_back`).
        let pending = seq.tokens.len() - seq.num_computed;
        if !seq.speculative
            || seq.status != SequenceStatus::Running
            || !(pending == 1 || seq.blocks.rolled_back())
            || seq.reached_max_tokens()
            || budget <= pending
        {
            return None;
        }
        // A draft model sizes its own guesses by what they cost and how often they come true
        // (`crate::draft_model`); n-gram lookup's cost nothing, so its length follows
        // acceptance alone.
        let most = match config.proposer {
            Proposer::Ngram => seq.draft_len.min(config.num_tokens),
            Proposer::DraftModel => config.num_tokens,
        };
        let room = (seq.max_tokens() - seq.num_generated() - 1)
            .min(budget - pending)
            .min(most);
        (room > 0).then_some(room)
    }

    /// Puts the drafts n-gram lookup proposes (or the draft model's guesses it was handed)
    /// after a decoding sequence's last token, when it may speculate and its blocks can grow
    /// for them without preempting anyone; see [`Scheduler::draft_room`] for how many.
    pub(super) fn draft(&mut self, slot: usize, config: &SpeculationConfig, budget: usize) {
        let seq = self.slots[slot].as_mut().expect("running slot is live");
        let Some(room) = Self::draft_room(seq, config, budget) else {
            seq.proposal.clear();
            return;
        };
        match config.proposer {
            Proposer::Ngram => propose(&seq.tokens, config, room, &mut self.draft),
            Proposer::DraftModel => {
                self.draft.clear();
                let n = seq.proposal.len().min(room);
                self.draft.extend_from_slice(&seq.proposal[..n]);
                seq.proposal.clear();
            }
        }
        if self.draft.is_empty()
            || !self
                .blocks
                .allocate(&mut seq.blocks, seq.tokens.len() + self.draft.len())
        {
            return;
        }
        seq.tokens.extend_from_slice(&self.draft);
        seq.num_draft = self.draft.len();
    }
}
