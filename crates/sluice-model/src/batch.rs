//! The flat description of one engine step: every token that is computed this step, from every
//! sequence, laid end to end with no padding. The scheduler fills it; the model consumes it.

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
    /// Rows of the flat batch whose logits are wanted (the last token of each sequence that
    /// samples this step), in output order.
    pub logits_indices: Vec<u32>,
    /// Rows whose final (normed) hidden states are wanted, in output order: the tokens an
    /// embedding pools. Empty in a step without embedding sequences.
    pub hidden_indices: Vec<u32>,
    /// Per entry of `logits_indices`, in order: `Some` when the model picks that row's token
    /// itself by this rule ([`sluice_kernels::sampling`]), `None` when it returns the row's
    /// logits. Empty: every row returns logits. On a GPU this keeps full logits on the device.
    pub model_sampling: Vec<Option<RowSampling>>,
}

/// What one forward returns, in buffers reused across steps.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// `[rows, vocab]`, row-major: the logits of every sampling row the model did not sample
    /// itself ([`StepBatch::logits_rows`]), in order.
    pub logits: Vec<f32>,
    /// The tokens of the rows the model sampled ([`StepBatch::model_sampled_rows`]), in order.
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
        self.logits_indices.clear();
        self.hidden_indices.clear();
        self.model_sampling.clear();
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
        for pos in start_pos..context_len {
            self.positions.push(pos as u32);
            let block = block_table[pos / self.block_size];
            self.slot_mapping
                .push(block * self.block_size as u32 + (pos % self.block_size) as u32);
        }
        self.sequences.push(SequenceSlice {
            query_start,
            query_len: tokens.len(),
            context_len,
            block_table_start: self.block_tables.len(),
            block_table_len: block_table.len(),
        });
        self.block_tables.extend_from_slice(block_table);
        if sample {
            self.logits_indices.push((self.input_ids.len() - 1) as u32);
        }
    }

    /// The rows of the batch whose logits the forward returns: the sampling rows the model
    /// does not sample itself, in order.
    pub fn logits_rows(&self) -> impl Iterator<Item = u32> + '_ {
        self.logits_indices
            .iter()
            .enumerate()
            .filter(|&(i, _)| !matches!(self.model_sampling.get(i), Some(Some(_))))
            .map(|(_, &row)| row)
    }

    /// The sampling rows the model samples itself, with their rule.
    pub fn model_sampled_rows(&self) -> impl Iterator<Item = (u32, &RowSampling)> + '_ {
        self.logits_indices
            .iter()
            .zip(&self.model_sampling)
            .filter_map(|(&row, s)| Some((row, s.as_ref()?)))
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
    fn rows_split_between_logits_and_model_sampling() {
        let mut b = StepBatch::new(4);
        for _ in 0..3 {
            let start = b.num_tokens();
            b.push_sequence(&[1, 2], 0, &[start as u32], true);
        }
        assert_eq!(b.logits_rows().collect::<Vec<_>>(), vec![1, 3, 5]);
        assert_eq!(b.model_sampled_rows().count(), 0);
        b.model_sampling = vec![None, Some(RowSampling::GREEDY), None];
        assert_eq!(b.logits_rows().collect::<Vec<_>>(), vec![1, 5]);
        let sampled: Vec<u32> = b.model_sampled_rows().map(|(row, _)| row).collect();
        assert_eq!(sampled, vec![3]);
    }
}
