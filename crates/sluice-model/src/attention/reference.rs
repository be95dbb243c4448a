//! Exact paged attention from candle ops: gather a sequence's slots, repeat K/V over its query
//! heads, masked softmax. Simple enough to trust, so it is the oracle for the fast kernel.

use candle_core::Tensor;

use super::AttentionShape;
use crate::batch::StepBatch;
use crate::error::Result;

pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    batch: &StepBatch,
    shape: &AttentionShape,
) -> Result<Tensor> {
    let device = q.device();
    let group = shape.num_heads / shape.num_kv_heads;
    let mut outputs = Vec::with_capacity(batch.sequences.len());
    for seq in &batch.sequences {
        let (len, q_len) = (seq.context_len, seq.query_len);
        let table = batch.block_table(seq);
        let slots: Vec<u32> = (0..len)
            .map(|p| {
                table[p / batch.block_size] * batch.block_size as u32
                    + (p % batch.block_size) as u32
            })
            .collect();
        let slots = Tensor::from_vec(slots, len, device)?;
        let repeat = |cache: &Tensor| -> Result<Tensor> {
            let x = cache.index_select(&slots, 0)?; // [L, KVH, D]
            let x = x
                .unsqueeze(2)?
                .expand((len, shape.num_kv_heads, group, shape.head_dim))?
                .reshape((len, shape.num_heads, shape.head_dim))?;
            Ok(x.transpose(0, 1)?.contiguous()?) // [H, L, D]
        };
        let (k, v) = (repeat(k_cache)?, repeat(v_cache)?);
        let qs = q
            .narrow(0, seq.query_start, q_len)?
            .transpose(0, 1)?
            .contiguous()?; // [H, q, D]
        let scores = (qs.matmul(&k.t()?)? * shape.scale as f64)?; // [H, q, L]
        let first_pos = len - q_len;
        let mask: Vec<f32> = (0..q_len)
            .flat_map(|i| {
                (0..len).map(move |j| {
                    if j > first_pos + i {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (q_len, len), device)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
        let out = probs.matmul(&v)?; // [H, q, D]
        outputs.push(
            out.transpose(0, 1)?
                .reshape((q_len, shape.num_heads * shape.head_dim))?,
        );
    }
    Ok(Tensor::cat(&outputs, 0)?.contiguous()?)
}
