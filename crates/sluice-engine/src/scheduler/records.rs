//! What the scheduler holds, read and handed back: sequences and requests leaving
//! ([`Scheduler::finish`], [`Scheduler::abort`]) with their records, the records of the last
//! plan's entries, its counts and its block manager, and the check of its invariants.

use super::{Aborted, Removed, ScheduledSeq, Scheduler};
use crate::block_manager::{BlockManager, PrefixCacheStats};
use crate::block_pools::BlockPools;
use crate::kv_events::KvCacheEvent;
use crate::sequence::{RequestId, SeqId, Sequence, SequenceStatus};

impl<R, S> Scheduler<R, S> {
    /// Removes a sequence (done, for whatever reason the engine decided); its blocks return to
    /// the pool at once. Hands back its record (and its request's, if it was the last), or
    /// `None` if it was not here.
    pub fn finish(&mut self, id: SeqId) -> Option<Removed<R, S>> {
        let &slot = self.ids.get(&id)?;
        Some(self.remove_slot(slot))
    }

    /// Removes every remaining sequence of a request, waiting or running, and frees their
    /// blocks at once. Hands back the request's record and those sequences', or `None` if the
    /// request was not here.
    pub fn abort(&mut self, request: RequestId) -> Option<Aborted<R, S>> {
        let n = self.requests.get(&request)?.n;
        let mut sequences = Vec::new();
        for index in 0..n {
            let Some(removed) = self.finish(SeqId::new(request, index)) else {
                continue;
            };
            sequences.push((index, removed.state));
            if let Some(state) = removed.request {
                return Some(Aborted { state, sequences });
            }
        }
        unreachable!("a request's record leaves with its last sequence")
    }

    fn remove_slot(&mut self, slot: usize) -> Removed<R, S> {
        self.leave_adapter_slot(slot);
        let mut seq = self.slots[slot].take().expect("slot of a live sequence");
        match seq.status {
            SequenceStatus::Running => {
                if let Some(pos) = self.running.iter().position(|&s| s == slot) {
                    self.running.remove(pos);
                }
            }
            SequenceStatus::Waiting => {
                if let Some(pos) = self.waiting.iter().position(|&s| s == slot) {
                    self.waiting.remove(pos);
                }
            }
        }
        self.blocks.free(&mut seq.blocks);
        self.ids.remove(&seq.id());
        let request = seq.id().request;
        let entry = self
            .requests
            .get_mut(&request)
            .expect("a live sequence's request is here");
        entry.live -= 1;
        let request = if entry.live == 0 {
            self.requests.remove(&request).map(|entry| entry.state)
        } else {
            None
        };
        self.free_slots.push(slot);
        Removed {
            state: seq.state,
            request,
        }
    }

    /// Calls `f` for each entry of the last plan, in batch order, with its request's and its
    /// sequence's records (`None` for a sequence removed since the plan).
    pub fn for_each_scheduled_mut(
        &mut self,
        mut f: impl FnMut(&ScheduledSeq, Option<(&mut R, &mut S)>),
    ) {
        for s in &self.output.scheduled {
            let seq = self.slots[s.slot]
                .as_mut()
                .filter(|seq| seq.serial == s.serial);
            let records = seq.and_then(|seq| {
                let request = self.requests.get_mut(&s.seq_id.request)?;
                Some((&mut request.state, &mut seq.state))
            });
            f(s, records);
        }
    }

    /// The entries of the last plan, in batch order, each with its request's and its
    /// sequence's records (`None` for a sequence removed since the plan).
    pub fn scheduled_records(
        &self,
    ) -> impl Iterator<Item = (&ScheduledSeq, Option<(&R, &S)>)> + '_ {
        self.output.scheduled.iter().map(|s| {
            let records = self.live_scheduled(s).and_then(|seq| {
                let request = self.requests.get(&s.seq_id.request)?;
                Some((&request.state, &seq.state))
            });
            (s, records)
        })
    }

    /// One request's record.
    pub fn request_record(&self, request: RequestId) -> Option<&R> {
        self.requests.get(&request).map(|r| &r.state)
    }

    pub fn request_record_mut(&mut self, request: RequestId) -> Option<&mut R> {
        self.requests.get_mut(&request).map(|r| &mut r.state)
    }

    /// Every request's record.
    pub fn request_records(&self) -> impl Iterator<Item = (RequestId, &R)> + '_ {
        self.requests.iter().map(|(&id, r)| (id, &r.state))
    }

    /// Every sequence's record, waiting or running.
    pub fn sequence_records_mut(&mut self) -> impl Iterator<Item = &mut S> + '_ {
        self.slots.iter_mut().flatten().map(|seq| &mut seq.state)
    }

    pub fn get(&self, id: SeqId) -> Option<&Sequence<S>> {
        self.ids
            .get(&id)
            .and_then(|&slot| self.slots[slot].as_ref())
    }

    /// The sequence behind a scheduled entry, without a map lookup; None if it was removed.
    pub fn scheduled_sequence(&self, s: &ScheduledSeq) -> Option<&Sequence<S>> {
        self.live_scheduled(s)
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn has_unfinished(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// Preemptions since start.
    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    pub fn num_used_blocks(&self) -> usize {
        self.blocks.num_used_blocks()
    }

    pub fn num_total_blocks(&self) -> usize {
        self.blocks.num_blocks()
    }

    /// Prefix-cache queries and hits, in tokens (see [`PrefixCacheStats`]).
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.blocks.prefix_cache_stats()
    }

    /// The full-attention pool: capacity, and the prefix cache routers see.
    pub fn block_manager(&self) -> &BlockManager {
        self.blocks.full()
    }

    /// Both pools (the second only for a model with sliding-window layers).
    pub fn block_pools(&self) -> &BlockPools {
        &self.blocks
    }

    /// Records KV-cache events from now on ([`BlockManager::record_events`]).
    pub fn record_kv_events(&mut self) {
        self.blocks.record_events();
    }

    /// Moves the KV-cache events recorded since the last call to the end of `out`.
    pub fn drain_kv_events(&mut self, out: &mut Vec<KvCacheEvent>) {
        self.blocks.drain_events(out);
    }

    /// Empties the prefix caches ([`BlockManager::clear_prefix_cache`]); returns how many
    /// blocks the full pool's held. Sequences keep their blocks.
    pub fn clear_prefix_cache(&mut self) -> usize {
        self.blocks.clear_prefix_cache()
    }

    /// Checks every structural invariant (block ref counts against all tables, queue
    /// membership, limits); O(sequences + blocks), for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        let live = || self.slots.iter().flatten();
        self.blocks.check_consistency(live().map(|s| &s.blocks))?;
        if self.running.len() > self.config.max_num_seqs {
            return Err(format!(
                "{} running > max_num_seqs {}",
                self.running.len(),
                self.config.max_num_seqs
            ));
        }
        // Each adapter slot counts exactly the running sequences in it, each of which runs
        // with the slot's adapter; a waiting sequence holds no slot.
        let mut in_slot = vec![0usize; self.adapter_slots.len()];
        for seq in live() {
            let running = seq.status == SequenceStatus::Running;
            match (seq.lora, seq.lora_slot) {
                (0, 0) => {}
                (lora, 0) if !running && lora != 0 => {}
                (lora, slot) if running && slot > 0 => {
                    let entry = self
                        .adapter_slots
                        .get(usize::from(slot) - 1)
                        .ok_or_else(|| format!("{} in adapter slot {slot} of none", seq.id()))?;
                    if entry.lora != lora {
                        return Err(format!(
                            "{} runs adapter {lora} in slot {slot}, which holds {}",
                            seq.id(),
                            entry.lora
                        ));
                    }
                    in_slot[usize::from(slot) - 1] += 1;
                }
                (lora, slot) => {
                    return Err(format!(
                        "{} ({:?}) with adapter {lora} in slot {slot}",
                        seq.id(),
                        seq.status
                    ))
                }
            }
        }
        for (i, (entry, &n)) in self.adapter_slots.iter().zip(&in_slot).enumerate() {
            if entry.running != n {
                return Err(format!(
                    "adapter slot {} counts {} running sequences; {n} run in it",
                    i + 1,
                    entry.running
                ));
            }
        }
        let mut queued = vec![0u8; self.slots.len()];
        for &slot in &self.running {
            let seq = self.slots[slot].as_ref().ok_or("running slot is empty")?;
            if seq.status != SequenceStatus::Running {
                return Err(format!(
                    "{} is in the running list but {:?}",
                    seq.id(),
                    seq.status
                ));
            }
            if self.blocks.blocks_for(seq.num_computed) > seq.blocks.len() {
                return Err(format!(
                    "{} computed {} tokens beyond its blocks",
                    seq.id(),
                    seq.num_computed
                ));
            }
            queued[slot] += 1;
        }
        for &slot in &self.waiting {
            let seq = self.slots[slot].as_ref().ok_or("waiting slot is empty")?;
            if seq.status != SequenceStatus::Waiting
                || !seq.blocks.is_empty()
                || seq.num_computed != 0
            {
                return Err(format!("{} is waiting but holds state", seq.id()));
            }
            queued[slot] += 1;
        }
        for (slot, seq) in self.slots.iter().enumerate() {
            let Some(seq) = seq else { continue };
            if queued[slot] != 1 {
                return Err(format!("{} is in {} queues", seq.id(), queued[slot]));
            }
            if seq.num_computed > seq.tokens.len() {
                return Err(format!("{} computed more tokens than it knows", seq.id()));
            }
            if !self.awaiting_commit && seq.num_draft != 0 {
                return Err(format!("{} kept drafts past its step", seq.id()));
            }
            if self.ids.get(&seq.id()) != Some(&slot) {
                return Err(format!("{} is missing from the id map", seq.id()));
            }
        }
        if self.ids.len() != live().count() {
            return Err("id map has stale entries".into());
        }
        let live_by_requests: u32 = self.requests.values().map(|r| r.live).sum();
        if live_by_requests as usize != self.ids.len() {
            return Err("request live counts disagree with the sequences".into());
        }
        Ok(())
    }
}
