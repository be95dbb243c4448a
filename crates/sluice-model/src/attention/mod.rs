//! Attention of every query token in a step over its own sequence's paged keys and values.
//!
//! Two implementations with one contract: `q: [T, num_heads, head_dim]` in, `[T, num_heads *
//! head_dim]` out, query `i` of a sequence attending causally to keys `0..=position(i)`.
//! [`reference`] is built from device-generic candle ops and is the test oracle; [`cpu`] reads
//! blocks in place and is what CPU serving runs.

pub mod cpu;
pub mod reference;

use std::str::FromStr;

use candle_core::Tensor;
pub use sluice_kernels::AttentionShape;

use crate::batch::StepBatch;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvLayout;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionBackend {
    /// Gather each sequence's K/V and attend with matmuls; works on every device.
    Reference,
    /// The in-place paged kernel for CPU tensors.
    Cpu,
    /// sluice's CUDA kernels for the whole step (`cuda_forward`, the `cuda` feature): not a
    /// per-layer attention call, the model runs its CUDA forward instead.
    Cuda,
}

impl FromStr for AttentionBackend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "reference" => Ok(Self::Reference),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            _ => Err(format!(
                "unknown attention backend `{s}` (expected reference, cpu or cuda)"
            )),
        }
    }
}

/// One layer's attention for the step `batch`, whose sequences' block tables into this
/// layer's pool are `block_tables` (`batch.block_tables`, or its window tables for a layer of
/// a window pool), indexed by each sequence's slice; `sinks`, one logit a query head that
/// joins each softmax's denominator (gpt-oss).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    backend: AttentionBackend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    layout: &KvLayout,
    batch: &StepBatch,
    block_tables: &[u32],
    shape: &AttentionShape,
    sinks: Option<&[f32]>,
) -> Result<Tensor> {
    match backend {
        AttentionBackend::Reference => reference::paged_attention(
            q,
            k_cache,
            v_cache,
            layout,
            batch,
            block_tables,
            shape,
            sinks,
        ),
        AttentionBackend::Cpu => cpu::paged_attention(
            q,
            k_cache,
            v_cache,
            layout,
            batch,
            block_tables,
            shape,
            sinks,
        ),
        AttentionBackend::Cuda => Err(ModelError::InvalidStep(
            "the CUDA backend runs whole steps (LlamaModel::forward), not one attention call"
                .into(),
        )),
    }
}
