//! The flat description of one engine step: every token that is computed this step, from every
//! sequence, laid end to end with no padding. The scheduler fills it; the model consumes it.

use std::sync::Arc;

pub use sluice_kernels::{RowSampling, SampledToken, SequenceSlice};

/// Inputs of one batched forward. Reuse one value across steps ([`StepBatch::clear`]) so the
/// step loop does not allocate.
#[derive(Debug, Clone, Default)]
pub struct StepBatch {
    pub block_size: usize,
    /// `[T]` token ids.
    pub input_ids: Vec<u32>,
    /// `[T]` absolute position of each token in its sequence.
    pub positions: Vec<u32>,
    /// `[T]` KV-cache slot each token's K/V is written to: `block_id * block_size + offset`.
    pub slot_mapping: Vec<u32>,
    /// Per-sequence metadata, in the order the sequences appear in the flat arrays.
    pub sequences: Vec<SequenceSlice>,
    /// All sequences' block tables, concatenated.
    pub block_tables: Vec<u32>,
    /// One entry per layer group with a pool of its own beside the full one, in the cache's
    /// group order (`KvCache::group_of_layer`): what each sequence holds there. Empty for a
    /// model whose every layer lives in the full pool.
    pub groups: Vec<GroupTables>,
    /// Rows of the flat batch whose logits are wanted (the last token of each sequence that
    /// samples this step, or its last few when it verifies drafted tokens), in output order.
    pub logits_indices: Vec<u32>,
    /// Rows whose final (normed) hidden states are wanted, in output order: the tokens an
    /// embedding pools. Empty in a step without embedding sequences.
    pub hidden_indices: Vec<u32>,
    /// Per entry of `logits_indices`, in order: `Some` when the model picks that row's token
    /// itself by this rule ([`sluice_kernels::sampling`]), `None` when it returns the row's
    /// logits. Empty: every row returns logits. On a GPU this keeps full logits on the device.
    pub model_sampling: Vec<Option<RowSampling>>,
    /// `[T]` the LoRA adapter of each token's sequence: 0 for the base model, else the slot
    /// [`LlamaModel::set_adapter`](crate::LlamaModel::set_adapter) filled. Empty: no row has
    /// one (and the step pays nothing for adapters).
    pub lora_slots: Vec<u16>,
    /// The encoded images whose tokens some rows of this step are, each
    /// `[tokens_per_image, hidden_size]` row-major (the vision tower's output): what
    /// [`ImageRows::image`] indexes. Empty in a step without image tokens.
    pub images: Vec<Arc<[f32]>>,
    /// Runs of rows that read an image's embeddings in place of their token's, in row order,
    /// none overlapping. Those rows' `input_ids` are not read.
    pub image_rows: Vec<ImageRows>,
    /// `[T]` the end of the keys each row attends to, or empty: causal (its position + 1).
    /// [`StepBatch::push_image_rows`] fills it: an image's tokens see the whole image.
    pub key_ends: Vec<u32>,
}

/// Consecutive rows of one sequence in a step that are tokens `first..first + len` of one
/// image. They see each other: every token of an image attends to all of the image's tokens
/// (and, as any row, to its sequence's earlier ones), the bidirectional attention Gemma 3's
/// image tokens have. The image's later tokens are in this step or already in the cache: the
/// scheduler never ends a chunk inside an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageRows {
    /// The first of the rows in the flat batch.
    pub row: u32,
    pub len: u32,
    /// Which of [`StepBatch::images`].
    pub image: u32,
    /// The image token the first row is (0 for the image's first).
    pub first: u32,
    /// The position after the image's last token: these rows attend to keys `0..end`.
    pub end: u32,
}

/// What the sequences of a step hold in one layer group beside the full pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupTables {
    /// Paged K/V (a sliding window): `[T]` each token's slot in the group's pool, and the
    /// sequences' tables there beside [`StepBatch::block_tables`], entry for entry (each
    /// [`SequenceSlice`] indexes both).
    Paged {
        slot_mapping: Vec<u32>,
        block_tables: Vec<u32>,
    },
    /// One fixed-size state a sequence (the hybrids' recurrent layers): each sequence's, in
    /// [`StepBatch::sequences`] order; and, entry for entry, the checkpoint its state starts
    /// from (a prefix-cache hit) and `(checkpoint, n)`: the state after its first `n` tokens of
    /// the step saved into that checkpoint.
    Recurrent {
        states: Vec<u32>,
        restore: Vec<Option<u32>>,
        save: Vec<Option<(u32, u32)>>,
    },
}

impl GroupTables {
    /// An empty paged group.
    pub fn paged() -> Self {
        Self::Paged {
            slot_mapping: Vec::new(),
            block_tables: Vec::new(),
        }
    }

    /// An empty recurrent group.
    pub fn recurrent() -> Self {
        Self::Recurrent {
            states: Vec::new(),
            restore: Vec::new(),
            save: Vec::new(),
        }
    }

    fn clear(&mut self) {
        match self {
            Self::Paged {
                slot_mapping,
                block_tables,
            } => {
                slot_mapping.clear();
                block_tables.clear();
            }
            Self::Recurrent {
                states,
                restore,
                save,
            } => {
                states.clear();
                restore.clear();
                save.clear();
            }
        }
    }
}

/// The slot of position `pos` through `table`.
fn slot(table: &[u32], pos: usize, block_size: usize) -> u32 {
    table[pos / block_size] * block_size as u32 + (pos % block_size) as u32
}

/// What one forward returns, in buffers reused across steps.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// `[rows, vocab]`, row-major: the logits of every sampling row the model did not sample
    /// itself (`None` in [`StepBatch::model_sampling`]), in order.
    pub logits: Vec<f32>,
    /// The tokens of the rows the model sampled (`Some` in [`StepBatch::model_sampling`]), in
    /// order.
    pub sampled: Vec<SampledToken>,
    /// `[hidden_indices.len(), hidden_size]`, row-major: the final norm's output.
    pub hidden: Vec<f32>,
}

impl StepBatch {
    pub fn new(block_size: usize) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        Self {
            block_size,
            ..Self::default()
        }
    }

    pub fn clear(&mut self) {
        self.input_ids.clear();
        self.positions.clear();
        self.slot_mapping.clear();
        self.sequences.clear();
        self.block_tables.clear();
        for g in &mut self.groups {
            g.clear();
        }
        self.logits_indices.clear();
        self.hidden_indices.clear();
        self.model_sampling.clear();
        self.lora_slots.clear();
        self.images.clear();
        self.image_rows.clear();
        self.key_ends.clear();
    }

    /// Makes rows `row..row + len` (of a sequence already pushed) tokens `first..` of
    /// `image`, whose last token is at position `end - 1`; the image is added to
    /// [`StepBatch::images`] unless it is already the last one there (an image whose rows
    /// continue from a cached prefix, or several runs of one image, take one entry).
    ///
    /// # Panics
    /// If the rows are not the step's, overlap or precede rows already marked, or leave the
    /// sequence they start in, or `end` is before the rows' positions.
    pub fn push_image_rows(
        &mut self,
        image: &Arc<[f32]>,
        row: usize,
        len: usize,
        first: usize,
        end: usize,
    ) {
        assert!(
            len > 0 && row + len <= self.input_ids.len(),
            "image rows out of the step"
        );
        if let Some(last) = self.image_rows.last() {
            assert!(
                (last.row + last.len) as usize <= row,
                "image rows overlap or go backwards"
            );
        }
        let seq = self
            .sequences
            .iter()
            .find(|s| s.query_start <= row && row < s.query_start + s.query_len)
            .expect("image rows belong to a pushed sequence");
        assert!(
            row + len <= seq.query_start + seq.query_len,
            "image rows leave their sequence"
        );
        assert!(
            self.positions[row + len - 1] < end as u32 && end <= seq.context_len,
            "an image's end is after its rows and within its sequence's context"
        );
        if self.key_ends.is_empty() {
            self.key_ends.extend(self.positions.iter().map(|&p| p + 1));
        }
        self.key_ends[row..row + len].fill(end as u32);
        let same = self
            .images
            .last()
            .is_some_and(|last| Arc::ptr_eq(last, image));
        if !same {
            self.images.push(Arc::clone(image));
        }
        self.image_rows.push(ImageRows {
            row: row as u32,
            len: len as u32,
            image: (self.images.len() - 1) as u32,
            first: first as u32,
            end: end as u32,
        });
    }

    /// Adds `tokens` of one sequence, starting at absolute position `start_pos` (the number of
    /// its tokens already in the cache). `block_table` must cover `start_pos + tokens.len()`
    /// tokens. When `sample` is set, the last token's logits are returned by the forward.
    pub fn push_sequence(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
        block_table: &[u32],
        sample: bool,
    ) {
        self.push_sequence_rows(tokens, start_pos, block_table, usize::from(sample));
    }

    /// [`StepBatch::push_sequence`] returning the logits of the last `logit_rows` tokens (a
    /// sequence verifying drafted tokens wants one row per position from its last known
    /// token on). A model with further groups ([`StepBatch::groups`]) then takes the
    /// sequence's entry in each ([`StepBatch::push_group_table`],
    /// [`StepBatch::push_group_state`]).
    pub fn push_sequence_rows(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
        block_table: &[u32],
        logit_rows: usize,
    ) {
        assert!(
            logit_rows <= tokens.len(),
            "{logit_rows} logits rows of a {}-token chunk",
            tokens.len()
        );
        assert!(
            !tokens.is_empty(),
            "a sequence in a step computes at least one token"
        );
        let context_len = start_pos + tokens.len();
        assert!(
            block_table.len() * self.block_size >= context_len,
            "block table of {} blocks cannot hold {} tokens",
            block_table.len(),
            context_len
        );
        let query_start = self.input_ids.len();
        self.input_ids.extend_from_slice(tokens);
        self.positions.extend(start_pos as u32..context_len as u32);
        if !self.key_ends.is_empty() {
            self.key_ends
                .extend(start_pos as u32 + 1..=context_len as u32);
        }
        let bs = self.block_size;
        self.slot_mapping
            .extend((start_pos..context_len).map(|pos| slot(block_table, pos, bs)));
        self.sequences.push(SequenceSlice {
            query_start,
            query_len: tokens.len(),
            context_len,
            block_table_start: self.block_tables.len(),
            block_table_len: block_table.len(),
        });
        self.block_tables.extend_from_slice(block_table);
        let end = self.input_ids.len();
        self.logits_indices
            .extend((end - logit_rows..end).map(|row| row as u32));
    }

    /// The last pushed sequence's table in paged group `group`: one entry per entry of its
    /// full table (a sliding-window group's leading entries may be placeholders, block 0, for
    /// blocks out of every window of the step, which attention never reads).
    ///
    /// # Panics
    /// If no sequence was pushed, `group` is not paged, or the table's length differs.
    pub fn push_group_table(&mut self, group: usize, table: &[u32]) {
        let seq = self.sequences.last().expect("a sequence pushed first");
        assert_eq!(
            table.len(),
            seq.block_table_len,
            "a group's table has one entry per block"
        );
        let bs = self.block_size;
        let (start, end) = (seq.context_len - seq.query_len, seq.context_len);
        match &mut self.groups[group] {
            GroupTables::Paged {
                slot_mapping,
                block_tables,
            } => {
                slot_mapping.extend((start..end).map(|pos| slot(table, pos, bs)));
                block_tables.extend_from_slice(table);
            }
            GroupTables::Recurrent { .. } => panic!("group {group} is recurrent"),
        }
    }

    /// The last pushed sequence's state in recurrent group `group`.
    ///
    /// # Panics
    /// If `group` is not recurrent.
    pub fn push_group_state(&mut self, group: usize, state: u32) {
        self.push_group_state_with(group, state, None, None);
    }

    /// [`StepBatch::push_group_state`], the state starting from checkpoint `restore` and/or
    /// its value after `save.1` tokens of the step saved into checkpoint `save.0`.
    ///
    /// # Panics
    /// If `group` is not recurrent.
    pub fn push_group_state_with(
        &mut self,
        group: usize,
        state: u32,
        from: Option<u32>,
        to: Option<(u32, u32)>,
    ) {
        match &mut self.groups[group] {
            GroupTables::Recurrent {
                states,
                restore,
                save,
            } => {
                states.push(state);
                restore.push(from);
                save.push(to);
            }
            GroupTables::Paged { .. } => panic!("group {group} is paged"),
        }
    }

    /// The slots and tables a layer reads: those of its group (`KvCache::group_of_layer`),
    /// `None` for the full pool. A recurrent group has neither (empty slices).
    pub fn tables(&self, group: Option<usize>) -> (&[u32], &[u32]) {
        match group.map(|g| &self.groups[g]) {
            None => (&self.slot_mapping, &self.block_tables),
            Some(GroupTables::Paged {
                slot_mapping,
                block_tables,
            }) => (slot_mapping, block_tables),
            Some(GroupTables::Recurrent { .. }) => (&[], &[]),
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }

    pub fn num_sequences(&self) -> usize {
        self.sequences.len()
    }

    pub fn block_table(&self, seq: &SequenceSlice) -> &[u32] {
        seq.block_table(&self.block_tables)
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_block_table() {
        let mut b = StepBatch::new(4);
        b.push_sequence(&[1, 2, 3], 3, &[7, 2], true);
        b.push_sequence(&[9], 0, &[5], false);
        assert_eq!(b.positions, vec![3, 4, 5, 0]);
        assert_eq!(b.slot_mapping, vec![7 * 4 + 3, 2 * 4, 2 * 4 + 1, 5 * 4]);
        assert_eq!(b.sequences[0].context_len, 6);
        assert_eq!(b.sequences[1].query_start, 3);
        assert_eq!(b.block_table(&b.sequences[1]), &[5]);
        assert_eq!(b.logits_indices, vec![2]);
    }

    #[test]
    fn clear_forgets_which_rows_the_model_samples() {
        let mut b = StepBatch::new(4);
        b.push_sequence(&[1, 2], 0, &[0], true);
        b.model_sampling = vec![Some(RowSampling::GREEDY)];
        b.clear();
        assert!(b.model_sampling.is_empty() && b.logits_indices.is_empty());
    }

    #[test]
    fn a_group_table_addresses_the_same_positions_in_its_own_pool() {
        let mut b = StepBatch::new(4);
        b.groups = vec![GroupTables::paged(), GroupTables::recurrent()];
        b.push_sequence_rows(&[1, 2], 3, &[7, 2], 1);
        b.push_group_table(0, &[0, 5]);
        b.push_group_state(1, 9);
        b.push_sequence(&[3], 0, &[4], true);
        b.push_group_table(0, &[1]);
        b.push_group_state(1, 2);
        assert_eq!(
            b.tables(None),
            (&[7 * 4 + 3, 2 * 4, 4 * 4][..], &[7, 2, 4][..])
        );
        assert_eq!(b.tables(Some(0)), (&[3, 5 * 4, 4][..], &[0, 5, 1][..]));
        assert_eq!(
            b.groups[1],
            GroupTables::Recurrent {
                states: vec![9, 2],
                restore: vec![None, None],
                save: vec![None, None]
            }
        );
        b.clear();
        assert_eq!(
            b.groups,
            vec![GroupTables::paged(), GroupTables::recurrent()]
        );
    }
}
