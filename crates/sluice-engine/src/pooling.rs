//! How an embedding's hidden states become its vector: which rows of each prefill chunk its
//! pooling reads, and the L2 normalisation every vector gets (as OpenAI's embeddings have).

use sluice_model::Pooling;

/// The rows (offsets in a chunk of `len` tokens starting at position `start`) whose hidden
/// states an embedding of `input_len` tokens pools: every row for mean, the first token's
/// for cls, the last token's for last.
pub(crate) fn pooled_rows(
    pooling: Pooling,
    start: usize,
    len: usize,
    input_len: usize,
) -> std::ops::Range<usize> {
    match pooling {
        Pooling::Mean => 0..len,
        Pooling::Cls if start == 0 => 0..1,
        Pooling::Last if start + len == input_len => len - 1..len,
        Pooling::Cls | Pooling::Last => 0..0,
    }
}

/// Scales `v` to length 1 (a zero vector stays zero). The norm is summed in f64, so it does
/// not depend on a long sum's rounding.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        let scale = (1.0 / norm) as f32;
        v.iter_mut().for_each(|x| *x *= scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pooling_reads_its_rows_of_each_chunk() {
        // An input of 10 tokens in chunks of 4, 4 and 2.
        let rows = |p| [(0, 4), (4, 4), (8, 2)].map(|(s, l)| pooled_rows(p, s, l, 10));
        assert_eq!(rows(Pooling::Mean), [0..4, 0..4, 0..2]);
        assert_eq!(rows(Pooling::Cls), [0..1, 0..0, 0..0]);
        assert_eq!(rows(Pooling::Last), [0..0, 0..0, 1..2]);
    }

    #[test]
    fn vectors_get_length_one() {
        let mut v = [3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut zero = [0.0; 3];
        l2_normalize(&mut zero);
        assert_eq!(zero, [0.0; 3]);
    }
}
