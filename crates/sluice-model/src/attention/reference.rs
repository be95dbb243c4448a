//! Exact paged attention from candle ops: gather a sequence's K/V blocks out of the cache,
//! repeat them over the query heads of each group, masked softmax (causal or to an image's
//! end, and a sliding
//! window's start; a sink logit a head in the denominator where the layer has sinks). Simple
//! enough to trust, so it is the
//! oracle for the fast kernel.

use candle_core::Tensor;

use crate::batch::StepBatch;
use crate::error::Result;
use crate::kv_cache::KvLayout;
use sluice_kernels::AttentionShape;

#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    layout: &KvLayout,
    batch: &StepBatch,
    block_tables: &[u32],
    shape: &AttentionShape,
    sinks: Option<&[f32]>,
) -> Result<Tensor> {
    let device = q.device();
    let (kvh, d) = (layout.num_kv_heads, layout.head_dim);
    let group = shape.num_heads / kvh;
    let mut outputs = Vec::with_capacity(batch.sequences.len());
    for seq in &batch.sequences {
        let (len, q_len) = (seq.context_len, seq.query_len);
        let bs = batch.block_size;
        let blocks = len.div_ceil(bs);
        let table = &seq.block_table(block_tables)[..blocks];
        let table = Tensor::from_slice(table, blocks, device)?;
        // Whole blocks out of the cache, then this sequence's positions as [H, L, D]: each KV
        // head repeated over the query heads of its group. Multiplying a KV head by its whole
        // group at once would skip that copy, but candle's matmul sums in a different order
        // for different row counts, and a decode step (one query row per head) must give what
        // recomputing the sequence after a preemption gives (many).
        let gather =
            |cache: &Tensor, dims: (usize, usize, usize, usize), k: bool| -> Result<Tensor> {
                let x = cache
                    .reshape((layout.num_blocks, dims.1, dims.2, dims.3))?
                    .index_select(&table, 0)?
                    .to_dtype(q.dtype())?;
                // K blocks are [kvh, D, bs] (dimension-major), V blocks [kvh, bs, D].
                let x = if k {
                    x.permute((1, 0, 3, 2))?
                } else {
                    x.permute((1, 0, 2, 3))?
                };
                let x = x
                    .contiguous()?
                    .reshape((kvh, blocks * bs, d))?
                    .narrow(1, 0, len)?;
                Ok(x.unsqueeze(1)?
                    .expand((kvh, group, len, d))?
                    .contiguous()?
                    .reshape((shape.num_heads, len, d))?)
            };
        let k = gather(k_cache, (layout.num_blocks, kvh, d, bs), true)?;
        let v = gather(v_cache, (layout.num_blocks, kvh, bs, d), false)?;
        let qs = q
            .narrow(0, seq.query_start, q_len)?
            .transpose(0, 1)?
            .contiguous()?; // [H, q, D]
        let scores = (qs.matmul(&k.t()?)? * shape.scale as f64)?; // [H, q, L]
        let first_pos = len - q_len;
        let mask: Vec<f32> = (0..q_len)
            .flat_map(|i| {
                // Causal, and within the sliding window where the layer has one.
                let start = shape
                    .window
                    .map_or(0, |w| (first_pos + i + 1).saturating_sub(w));
                // An image's token sees the whole image (`StepBatch::key_ends`).
                let end = batch
                    .key_ends
                    .get(seq.query_start + i)
                    .map_or(first_pos + i + 1, |&e| e as usize);
                (0..len).map(move |j| {
                    if j >= end || j < start {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (q_len, len), device)?;
        let scores = scores.broadcast_add(&mask)?;
        let probs = match sinks {
            None => candle_nn::ops::softmax_last_dim(&scores)?,
            // The sink is one more column of scores, dropped after the softmax.
            Some(sinks) => {
                let h = shape.num_heads;
                let sink = Tensor::from_slice(sinks, (h, 1, 1), device)?
                    .to_dtype(scores.dtype())?
                    .broadcast_as((h, q_len, 1))?;
                let with_sink = Tensor::cat(&[&scores, &sink], 2)?.contiguous()?;
                candle_nn::ops::softmax_last_dim(&with_sink)?
                    .narrow(2, 0, len)?
                    .contiguous()?
            }
        };
        let out = probs.matmul(&v)?; // [H, q, D]
        outputs.push(out.transpose(0, 1)?.reshape((q_len, shape.num_heads * d))?);
    }
    Ok(Tensor::cat(&outputs, 0)?.contiguous()?)
}
