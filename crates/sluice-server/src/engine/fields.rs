//! Turns OpenAI request fields into the engine's [`Request`], the one record a request is
//! from here to the sampler, and checks what only the wire format can get wrong (the `model`
//! name, `top_k`'s spelling of "no limit", `logit_bias` keys). Ranges are not
//! checked here: the engine's [`sluice_engine::ValidRequest::new`] checks every one, once,
//! when [`crate::engine::generation::validate`] is given the request with its prompt.

use sluice_engine::{LoraRequest, Request, SamplingParams, StopParams};

use crate::edge::error::ApiError;
use crate::engine::state::ServedModel;
use crate::openai::SamplingFields;

/// The `model` field names the served model (or is left out, as vLLM allows), or one of the
/// LoRA adapters it serves: then the adapter the request runs with. Anything else is a 404.
pub fn check_model(
    requested: Option<&str>,
    served: &ServedModel,
) -> Result<Option<LoraRequest>, ApiError> {
    match requested {
        None => Ok(None),
        Some(name) if name == served.name => Ok(None),
        Some(name) => served
            .loras
            .as_ref()
            .and_then(|loras| loras.get(name))
            .map(|adapter| Some(adapter.request))
            .ok_or_else(|| ApiError::model_not_found(name)),
    }
}

/// The engine's request as the endpoint's fields set it: how many sequences, how many tokens
/// each may generate (`None`: the rest of the context, which [`sluice_engine::ValidRequest`]
/// resolves once the prompt is known), how each is sampled and stopped. `logprobs` is the
/// number of alternatives asked for (under the endpoint's own field name). Its prompt is
/// empty, and its constraint unset, until the endpoint has tokenized and compiled them.
pub fn request(
    f: &SamplingFields,
    max_tokens: Option<usize>,
    logprobs: Option<usize>,
) -> Result<Request, ApiError> {
    let defaults = SamplingParams::default();
    // JSON numbers are f64; the engine samples in f32. A value out of f32's range becomes
    // infinite, which no range accepts.
    let narrow = |v: Option<f64>, default: f32| v.map_or(default, |v| v as f32);
    // vLLM spells "no top-k" as -1; 0 means the same to the engine.
    let top_k = match f.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k = {k} is invalid: use -1 (or 0) for no limit, or a positive count."),
            ))
        }
    };
    // llama.cpp spells "no top-n-sigma" as -1; 0 means the same to the engine.
    let top_n_sigma = match f.top_n_sigma {
        Some(-1.0) => 0.0,
        v => narrow(v, defaults.top_n_sigma),
    };
    let mut logit_bias = Vec::new();
    for (key, &bias) in f.logit_bias.iter().flatten() {
        let token: u32 = key.trim().parse().map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                format!("logit_bias keys must be token ids, got `{key}`."),
            )
        })?;
        logit_bias.push((token, bias as f32));
    }
    logit_bias.sort_unstable_by_key(|&(t, _)| t);
    let sampling = SamplingParams {
        temperature: narrow(f.temperature, defaults.temperature),
        top_p: narrow(f.top_p, defaults.top_p),
        top_k,
        min_p: narrow(f.min_p, defaults.min_p),
        top_n_sigma,
        presence_penalty: narrow(f.presence_penalty, defaults.presence_penalty),
        frequency_penalty: narrow(f.frequency_penalty, defaults.frequency_penalty),
        repetition_penalty: narrow(f.repetition_penalty, defaults.repetition_penalty),
        logit_bias,
        seed: f.seed.map(|s| s.0),
        logprobs,
    };
    let stop_defaults = StopParams::default();
    let stop = StopParams {
        stop: f.stop.clone().unwrap_or_default().0,
        stop_token_ids: f.stop_token_ids.clone().unwrap_or_default(),
        ignore_eos: f.ignore_eos.unwrap_or(stop_defaults.ignore_eos),
        min_tokens: f.min_tokens.unwrap_or(stop_defaults.min_tokens),
        include_stop_str_in_output: f
            .include_stop_str_in_output
            .unwrap_or(stop_defaults.include_stop_str_in_output),
        skip_special_tokens: f
            .skip_special_tokens
            .unwrap_or(stop_defaults.skip_special_tokens),
    };
    Ok(Request {
        prompt: Vec::new(),
        n: f.n.unwrap_or(1),
        max_tokens,
        sampling,
        stop,
        constraint: None,
        lora: None,
        images: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn param(r: Result<Request, ApiError>) -> Option<String> {
        r.err().and_then(|e| e.param)
    }

    /// Only what the wire format can get wrong is refused here; ranges are the engine's.
    #[test]
    fn malformed_fields_name_their_parameter() {
        let f = |edit: &dyn Fn(&mut SamplingFields)| {
            let mut f = SamplingFields::default();
            edit(&mut f);
            param(request(&f, None, None))
        };
        assert_eq!(f(&|_| ()), None);
        assert_eq!(f(&|f| f.top_k = Some(-2)).as_deref(), Some("top_k"));
        assert_eq!(
            f(&|f| f.logit_bias = Some(HashMap::from([("abc".into(), 1.0)]))).as_deref(),
            Some("logit_bias")
        );
        assert_eq!(f(&|f| f.temperature = Some(2.5)), None);
    }

    #[test]
    fn fields_map_onto_engine_params() {
        let f = SamplingFields {
            n: Some(3),
            temperature: Some(0.0),
            top_k: Some(-1),
            logit_bias: Some(HashMap::from([("7".into(), -100.0)])),
            seed: Some(crate::openai::Seed(42)),
            ignore_eos: Some(true),
            ..SamplingFields::default()
        };
        let r = request(&f, Some(9), Some(2)).unwrap();
        let (s, stop) = (&r.sampling, &r.stop);
        assert_eq!((r.n, r.max_tokens), (3, Some(9)));
        assert!(s.is_greedy());
        assert_eq!(s.top_k, 0);
        assert_eq!(s.logit_bias, vec![(7, -100.0)]);
        assert_eq!((s.seed, s.logprobs), (Some(42), Some(2)));
        assert!(stop.ignore_eos);
    }
}
