//! Rotary position embedding with a position per token, so one batch can hold tokens of many
//! sequences at unrelated positions.

use candle_core::{Device, Tensor};

use crate::config::{ModelConfig, RopeScaling};
use crate::error::Result;

/// cos/sin of every (position, frequency) pair up to the model's context length, computed once.
pub struct RotaryTables {
    cos: Tensor,
    sin: Tensor,
    max_positions: usize,
}

impl RotaryTables {
    /// The tables of the model's (global) layers: its rotary base and scaling.
    pub fn new(config: &ModelConfig, device: &Device) -> Result<Self> {
        Self::with_base(
            config,
            config.rope_theta,
            config.rope_scaling.as_ref(),
            device,
        )
    }

    /// The tables of the sliding-window layers where they rotate with a base of their own
    /// (Gemma 3's local layers: their base, no scaling); `None` for a model without.
    pub fn local(config: &ModelConfig, device: &Device) -> Result<Option<Self>> {
        match &config.sliding_window {
            Some(s) if s.local.iter().any(|&l| l) => Ok(Some(Self::with_base(
                config,
                s.local_rope_theta,
                None,
                device,
            )?)),
            _ => Ok(None),
        }
    }

    fn with_base(
        config: &ModelConfig,
        theta: f32,
        scaling: Option<&RopeScaling>,
        device: &Device,
    ) -> Result<Self> {
        let half = config.head_dim / 2;
        let mut inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / config.head_dim as f32))
            .collect();
        match scaling {
            Some(RopeScaling::Linear { factor }) => inv_freq.iter_mut().for_each(|f| *f /= factor),
            Some(RopeScaling::FreqFactors(factors)) => {
                inv_freq.iter_mut().zip(factors).for_each(|(f, s)| *f /= s)
            }
            None => {}
        }
        let max_positions = config.max_position_embeddings;
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (max_positions, half), device)?,
            sin: Tensor::from_vec(sin, (max_positions, half), device)?,
            max_positions,
        })
    }

    /// `(cos, sin)` of every position, each `[max_positions, head_dim / 2]` f32.
    pub fn tables(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// `(cos, sin)`, each `[T, head_dim / 2]`, for the given `[T]` u32 positions.
    pub fn gather(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((
            self.cos.index_select(positions, 0)?,
            self.sin.index_select(positions, 0)?,
        ))
    }

    /// Rotates `x: [T, heads, head_dim]` (contiguous) with the half-split convention.
    pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let x = x.unsqueeze(0)?;
        Ok(candle_nn::rotary_emb::rope_thd(&x, cos, sin)?.squeeze(0)?)
    }
}
