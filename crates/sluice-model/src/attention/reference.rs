//! Exact paged attention from candle ops: gather a sequence's K/V out of the cache, repeat them
//! over the query heads of each group, masked softmax. Simple enough to trust, so it is the
//! oracle for the fast kernel.

use candle_core::Tensor;

use crate::batch::StepBatch;
use crate::error::Result;
use crate::kv_cache::KvLayout;
use sluice_kernels::AttentionShape;

pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    layout: &KvLayout,
    batch: &StepBatch,
    shape: &AttentionShape,
) -> Result<Tensor> {
    let device = q.device();
    let (kvh, d) = (layout.num_kv_heads, layout.head_dim);
    let group = shape.num_heads / kvh;
    let mut outputs = Vec::with_capacity(batch.sequences.len());
    for seq in &batch.sequences {
        let (len, q_len) = (seq.context_len, seq.query_len);
        let table = batch.block_table(seq);
        let slot = |p: usize| {
            table[p / batch.block_size] as usize * batch.block_size + p % batch.block_size
        };
        let gather =
            |cache: &Tensor, offset: &dyn Fn(usize, usize, usize) -> usize| -> Result<Tensor> {
                let idx: Vec<u32> = (0..len)
                    .flat_map(|p| (0..kvh).flat_map(move |h| (0..d).map(move |dd| (p, h, dd))))
                    .map(|(p, h, dd)| offset(slot(p), h, dd) as u32)
                    .collect();
                let x = cache
                    .index_select(&Tensor::from_vec(idx, len * kvh * d, device)?, 0)?
                    .to_dtype(q.dtype())?;
                let x = x
                    .reshape((len, kvh, 1, d))?
                    .expand((len, kvh, group, d))?
                    .reshape((len, shape.num_heads, d))?;
                Ok(x.transpose(0, 1)?.contiguous()?) // [H, L, D]
            };
        let k = gather(k_cache, &|s, h, dd| layout.k_offset(s, h, dd))?;
        let v = gather(v_cache, &|s, h, dd| layout.v_offset(s, h, dd))?;
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
        outputs.push(out.transpose(0, 1)?.reshape((q_len, shape.num_heads * d))?);
    }
    Ok(Tensor::cat(&outputs, 0)?.contiguous()?)
}
