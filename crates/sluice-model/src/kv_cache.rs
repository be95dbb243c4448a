//! The paged KV cache: per layer, K and V for `num_blocks * block_size` token slots. Which slots
//! a sequence owns is the block manager's business; the cache only stores and reads slots.

use candle_core::{DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

pub struct KvCache {
    /// Per layer, `(k, v)`, each `[num_blocks * block_size, num_kv_heads, head_dim]` f32.
    layers: Vec<(Tensor, Tensor)>,
    num_blocks: usize,
    block_size: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl KvCache {
    pub fn new(
        config: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        device: &Device,
    ) -> Result<Self> {
        if num_blocks == 0 || block_size == 0 {
            return Err(ModelError::InvalidBatch(format!(
                "a KV cache needs at least one block of at least one token (got {num_blocks} x {block_size})"
            )));
        }
        let shape = (
            num_blocks * block_size,
            config.num_kv_heads,
            config.head_dim,
        );
        let layers = (0..config.num_layers)
            .map(|_| {
                Ok((
                    Tensor::zeros(shape, DType::F32, device)?,
                    Tensor::zeros(shape, DType::F32, device)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            num_blocks,
            block_size,
            num_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
        })
    }

    /// Blocks that fit in `budget_bytes` of f32 K/V.
    pub fn num_blocks_for_budget(
        config: &ModelConfig,
        budget_bytes: usize,
        block_size: usize,
    ) -> usize {
        budget_bytes / (config.kv_bytes_per_token(DType::F32.size_in_bytes()) * block_size)
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }

    /// Writes `k, v: [T, num_kv_heads, head_dim]` into the slots of `slot_index`, a
    /// `[T, num_kv_heads * head_dim]` u32 tensor whose row `t` repeats token `t`'s slot (the
    /// shape scatter wants; built once per step and shared by all layers).
    pub fn write(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        slot_index: &Tensor,
    ) -> Result<()> {
        let width = self.num_kv_heads * self.head_dim;
        let (kc, vc) = &self.layers[layer];
        let kc = kc.reshape((self.num_slots(), width))?;
        let vc = vc.reshape((self.num_slots(), width))?;
        let t = k.dim(0)?;
        kc.scatter_set(slot_index, &k.reshape((t, width))?, 0)?;
        vc.scatter_set(slot_index, &v.reshape((t, width))?, 0)?;
        Ok(())
    }
}
