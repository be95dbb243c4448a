//! Sliding-window attention as a layer kind the families share: which layers are local, their
//! window and their rotary base, as GGUF files describe them.

use candle_core::quantized::gguf_file::Value;

use super::SharedParams;
use crate::config::SlidingWindow;
use crate::error::Result;
use crate::gguf_keys::GgufKeys;

/// How a family's GGUF files describe sliding-window layers (llama.cpp's reading of
/// `attention.sliding_window`, `attention.sliding_window_pattern` and `rope.freq_base_swa`).
#[derive(Debug)]
pub(crate) struct WindowRule {
    /// With no pattern in the file, layers `i % N < N - 1` are local.
    pub default_period: usize,
    /// A window of at least one token is required (else no window, or 0, is every layer
    /// global).
    pub required: bool,
    /// The local layers' rotary base where the file gives no `rope.freq_base_swa`.
    pub local_theta: LocalTheta,
}

/// The local layers' rotary base by default.
#[derive(Debug)]
pub(crate) enum LocalTheta {
    Own(f32),
    /// The global layers' base.
    Global,
}

/// The sliding-window layers as `rule` reads them: `attention.sliding_window` (none, or 0, is
/// every layer global unless the rule requires a window); `attention.sliding_window_pattern`,
/// an array of one flag a layer or a period N (layers `i % N < N - 1` local; the rule's period
/// when absent); `rope.freq_base_swa`, the local layers' rotary base (the rule's default when
/// absent).
pub(crate) fn gguf_sliding_window(
    keys: &GgufKeys<'_>,
    rule: &WindowRule,
    shared: &SharedParams,
) -> Result<Option<SlidingWindow>> {
    let num_layers = shared.num_layers;
    let window_key = keys.key("attention.sliding_window");
    let window = match keys.opt(&window_key, GgufKeys::get_usize)? {
        Some(0) | None if rule.required => {
            return Err(keys.err(
                &window_key,
                "the sliding-window layers need a window of at least one token",
            ))
        }
        None | Some(0) => return Ok(None),
        Some(w) => w,
    };
    let pattern_key = keys.key("attention.sliding_window_pattern");
    let local: Vec<bool> = match keys.metadata().get(&pattern_key) {
        Some(Value::Array(flags)) => {
            let flags: Option<Vec<bool>> = flags
                .iter()
                .map(|f| match f {
                    Value::Bool(b) => Some(*b),
                    _ => None,
                })
                .collect();
            match flags {
                Some(flags) if flags.len() == num_layers => flags,
                Some(flags) => {
                    return Err(keys.err(
                        &pattern_key,
                        format!("{} flags for {num_layers} layers", flags.len()),
                    ))
                }
                None => return Err(keys.err(&pattern_key, "an array of booleans or a period")),
            }
        }
        Some(_) => {
            let period = keys.get_usize(&pattern_key)?;
            (0..num_layers)
                .map(|i| period == 0 || i % period < period - 1)
                .collect()
        }
        None => {
            let period = rule.default_period;
            (0..num_layers).map(|i| i % period < period - 1).collect()
        }
    };
    let default_theta = match rule.local_theta {
        LocalTheta::Own(theta) => theta,
        LocalTheta::Global => shared.rope_theta,
    };
    let theta_key = keys.key("rope.freq_base_swa");
    let local_rope_theta = keys
        .opt(&theta_key, GgufKeys::get_f32)?
        .unwrap_or(default_theta);
    if !(local_rope_theta.is_finite() && local_rope_theta > 0.0) {
        return Err(keys.err(&theta_key, "must be positive"));
    }
    Ok(Some(SlidingWindow {
        window,
        local,
        local_rope_theta,
    }))
}
