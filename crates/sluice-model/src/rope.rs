//! Rotary position embedding with a position per token, so one batch can hold tokens of many
//! sequences at unrelated positions.

use candle_core::{Device, Tensor};

use crate::config::{ModelConfig, RopeScaling, Yarn};
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
        if let (true, Some(s)) = (
            config.architecture.traits().local_layers_share_rope,
            &config.sliding_window,
        ) {
            // gpt-oss: the global layers' scaling; their very tables unless the base differs.
            return (s.local_rope_theta != config.rope_theta)
                .then(|| {
                    Self::with_base(
                        config,
                        s.local_rope_theta,
                        config.rope_scaling.as_ref(),
                        device,
                    )
                })
                .transpose();
        }
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
        // A partial rotary (Qwen3.5) turns the first `rotary` dimensions of a head with the
        // frequencies of a head that size; the rest pass through.
        let rotary = config.rotary_dims();
        let half = rotary / 2;
        let mut inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / rotary as f32))
            .collect();
        // YaRN: each frequency's share of the interpolated one, and the factor on cos and sin.
        let mut yarn: Option<(Vec<f32>, f32, f32)> = None;
        match scaling {
            Some(RopeScaling::Linear { factor }) => inv_freq.iter_mut().for_each(|f| *f /= factor),
            Some(RopeScaling::FreqFactors(factors)) => {
                inv_freq.iter_mut().zip(factors).for_each(|(f, s)| *f /= s)
            }
            Some(RopeScaling::Yarn(y)) => {
                yarn = Some((
                    yarn_extrapolation(y, rotary, theta),
                    1.0 / y.factor,
                    y.attn_factor * (1.0 + 0.1 * y.factor.ln()),
                ))
            }
            None => {}
        }
        let max_positions = config.max_position_embeddings;
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            match &yarn {
                None => {
                    for f in &inv_freq {
                        let angle = p as f32 * f;
                        cos.push(angle.cos());
                        sin.push(angle.sin());
                    }
                }
                // llama.cpp's arithmetic (ggml's rope_yarn): the angle interpolated by the
                // factor, mixed with the unscaled one by the frequency's ramp, in f32.
                Some((mix, freq_scale, mscale)) => {
                    for (f, &mix) in inv_freq.iter().zip(mix) {
                        let extrapolated = p as f32 * f;
                        let interpolated = freq_scale * extrapolated;
                        let angle = interpolated * (1.0 - mix) + extrapolated * mix;
                        cos.push(angle.cos() * mscale);
                        sin.push(angle.sin() * mscale);
                    }
                }
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (max_positions, half), device)?,
            sin: Tensor::from_vec(sin, (max_positions, half), device)?,
            max_positions,
        })
    }

    /// `(cos, sin)` of every position, each `[max_positions, rotary / 2]` f32 (`rotary`: the
    /// rotated dimensions of a head, `ModelConfig::rotary_dims`; YaRN's scaled by its attention
    /// factor).
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

/// YaRN's ramp: for each of the `head_dim / 2` frequencies, how much of the unscaled
/// (extrapolated) angle it keeps, 1 for the fast ones that rotate `beta_fast` times or more
/// over the original context, 0 for the slow ones under `beta_slow`, linear between the two
/// dimensions where those counts fall (llama.cpp's `ggml_rope_yarn_corr_dims`, floor and ceil
/// included; transformers' `find_correction_range`, which floors and ceils only with
/// `truncate`).
fn yarn_extrapolation(y: &Yarn, head_dim: usize, theta: f32) -> Vec<f32> {
    let dims = head_dim as f32;
    let corr_dim = |rotations: f32| {
        dims * (y.original_context as f32 / (rotations * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * theta.ln())
    };
    let (low, high) = (corr_dim(y.beta_fast), corr_dim(y.beta_slow));
    let (low, high) = if y.truncate {
        (low.floor(), high.ceil())
    } else {
        (low, high)
    };
    let (low, high) = (low.max(0.0), high.min(dims - 1.0));
    (0..head_dim / 2)
        .map(|i| {
            let t = (i as f32 - low) / (high - low).max(0.001);
            1.0 - t.clamp(0.0, 1.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gpt-oss-20b's rotary (64 dimensions, base 150000, YaRN x32 over 4096), against the
    /// formula written out in f64: the ramp between dimensions 8 and 18 of 32 frequencies.
    #[test]
    fn yarn_mixes_frequencies_by_the_ramp_and_scales_the_magnitude() {
        let y = Yarn {
            factor: 32.0,
            original_context: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attn_factor: 1.0,
            truncate: true,
        };
        let mix = yarn_extrapolation(&y, 64, 150_000.0);
        // Without truncation (gpt-oss's config.json says `truncate: false`) the ramp runs
        // between the fractional dimensions.
        let untruncated = yarn_extrapolation(
            &Yarn {
                truncate: false,
                ..y
            },
            64,
            150_000.0,
        );
        let corr = |r: f64| {
            64.0 * (4096.0 / (r * 2.0 * std::f64::consts::PI)).ln() / (2.0 * 150_000f64.ln())
        };
        let (low, high) = (corr(32.0).floor(), corr(1.0).ceil());
        assert_eq!((low, high), (8.0, 18.0));
        for (i, &m) in mix.iter().enumerate() {
            let want = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            assert!(
                (m as f64 - want).abs() < 1e-6,
                "frequency {i}: {m} vs {want}"
            );
        }
        assert_eq!(mix[0], 1.0);
        assert_eq!(mix[31], 0.0);
        let (low, high) = (corr(32.0), corr(1.0));
        for (i, &m) in untruncated.iter().enumerate() {
            let want = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            assert!(
                (m as f64 - want).abs() < 1e-5,
                "frequency {i}: {m} vs {want}"
            );
        }
        assert_ne!(untruncated, mix);
        let config = ModelConfig {
            architecture: crate::config::Architecture::GptOss,
            hidden_size: 128,
            intermediate_size: 128,
            num_layers: 1,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 64,
            vocab_size: 16,
            rms_norm_eps: 1e-5,
            rope_theta: 150_000.0,
            rope_scaling: Some(RopeScaling::Yarn(y)),
            max_position_embeddings: 100,
            tie_word_embeddings: false,
            pooling: None,
            moe: None,
            sliding_window: None,
            attention_scale: None,
            final_logit_softcap: None,
            layers_without_rope: Vec::new(),
            rotary_dim: None,
            delta_net: None,
        };
        let tables = RotaryTables::new(&config, &Device::Cpu).unwrap();
        let cos = tables.cos.to_vec2::<f32>().unwrap();
        let sin = tables.sin.to_vec2::<f32>().unwrap();
        let mscale = 1.0 + 0.1 * 32f64.ln();
        for p in [0usize, 1, 57, 99] {
            for i in 0..32 {
                let f = 150_000f64.powf(-(2.0 * i as f64) / 64.0);
                let m = mix[i] as f64;
                let angle = p as f64 * f * (m + (1.0 - m) / 32.0);
                assert!((cos[p][i] as f64 - angle.cos() * mscale).abs() < 1e-4);
                assert!((sin[p][i] as f64 - angle.sin() * mscale).abs() < 1e-4);
            }
        }
    }
}
