//! SmolLM3 (HF `SmolLM3ForCausalLM`, GGUF `smollm3`): llama's layers, but every fourth layer
//! attends without rotating Q and K ("NoPE"). llama.cpp's NORM rotary, so its GGUF files hold
//! Q and K permuted, as llama's do.

use serde::Deserialize;

use super::{Architecture, Family, FamilyParams, SharedParams, Traits};
use crate::error::Result;
use crate::gguf_keys::GgufKeys;
use crate::hf_keys::HfKeys;

pub(crate) struct SmolLm3;

const SMOLLM3_TRAITS: Traits = Traits {
    experts: None,
    ..super::llama::LLAMA_TRAITS
};

/// Every this-many-th layer has no RoPE: llama.cpp hard-codes it (`n_no_rope_layer_step`),
/// transformers' default `no_rope_layer_interval`.
const NO_ROPE_INTERVAL: usize = 4;

/// SmolLM3's own config.json fields.
#[derive(Debug, Deserialize)]
struct SmolLm3Json {
    /// One flag a layer: 1 rotates, 0 does not.
    no_rope_layers: Option<Vec<u8>>,
    no_rope_layer_interval: Option<usize>,
}

/// Layers `i` with `(i + 1) % interval == 0`: transformers' and llama.cpp's pattern.
fn every_nth(num_layers: usize, interval: usize) -> Vec<usize> {
    (0..num_layers)
        .filter(|i| (i + 1).is_multiple_of(interval))
        .collect()
}

impl Family for SmolLm3 {
    fn architecture(&self) -> Architecture {
        Architecture::SmolLm3
    }

    fn names(&self) -> &'static [&'static str] {
        &["smollm3"]
    }

    fn traits(&self) -> &'static Traits {
        &SMOLLM3_TRAITS
    }

    fn gguf_params(&self, _: &GgufKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        Ok(FamilyParams {
            layers_without_rope: every_nth(shared.num_layers, NO_ROPE_INTERVAL),
            ..FamilyParams::default()
        })
    }

    /// `no_rope_layers` where the config lists them, else every `no_rope_layer_interval`-th
    /// (4) layer.
    fn hf_params(&self, keys: &HfKeys<'_>, shared: &SharedParams) -> Result<FamilyParams> {
        let c: SmolLm3Json = keys.family_fields()?;
        let n = shared.num_layers;
        let layers_without_rope = match c.no_rope_layers {
            Some(flags) if flags.len() != n => {
                return Err(keys.err(
                    "no_rope_layers",
                    format!("{} flags for {n} layers", flags.len()),
                ))
            }
            Some(flags) => match flags.iter().find(|&&f| f > 1) {
                Some(f) => return Err(keys.err("no_rope_layers", format!("{f}: expected 0 or 1"))),
                None => (0..n).filter(|&i| flags[i] == 0).collect(),
            },
            None => match c.no_rope_layer_interval.unwrap_or(NO_ROPE_INTERVAL) {
                0 => return Err(keys.err("no_rope_layer_interval", "must be at least 1")),
                interval => every_nth(n, interval),
            },
        };
        Ok(FamilyParams {
            layers_without_rope,
            ..FamilyParams::default()
        })
    }
    #[cfg(any(test, feature = "testing"))]
    fn hf_checkpoint(
        &self,
        config: &crate::config::ModelConfig,
    ) -> Option<super::export::HfCheckpoint> {
        // One flag a layer, 1 rotates.
        let flags: Vec<u8> = (0..config.num_layers)
            .map(|i| u8::from(!config.layers_without_rope.contains(&i)))
            .collect();
        Some(super::export::HfCheckpoint {
            fields: serde_json::json!({ "no_rope_layers": flags }),
            ..super::export::HfCheckpoint::plain("SmolLM3ForCausalLM", "smollm3")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fourth_layer_goes_without_rope() {
        assert_eq!(every_nth(8, 4), [3, 7]);
        assert_eq!(every_nth(36, 4).len(), 9);
        assert!(every_nth(3, 4).is_empty());
    }
}
