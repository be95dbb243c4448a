//! `POST /v1/embeddings`: each input (a string, or token ids) becomes one prefill-only engine
//! request, run in the same step batches as generations; the engine pools its tokens' final
//! hidden states (`--pooling`) and L2-normalises the vector, which this handler truncates to
//! `dimensions` (renormalised) and encodes as floats or base64.

use std::time::Instant;

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use sluice_engine::{l2_normalize, FinishReason, LoraRequest, ValidRequest};

use crate::edge::error::{ApiError, ParamNames};
use crate::edge::field_policy;
use crate::engine::blocking::tokenize_blocking;
use crate::engine::fields;
use crate::engine::generation::{self, Generation, Item};
use crate::engine::state::{AppState, ServedModel};
use crate::openai::embeddings::{
    Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, EmbeddingVector, EncodingFormat,
};
use crate::openai::Prompt;
use crate::routes::json::ApiJson;

pub async fn handler(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<EmbeddingRequest>,
) -> Result<Json<EmbeddingResponse>, ApiError> {
    let started = Instant::now();
    let model = state.model_for(req.model.as_deref()).await?;
    let lora = fields::check_model(req.model.as_deref(), &model)?;
    field_policy::check_extra_fields(&req.extra)?;
    let size = model.engine.embedding_size();
    if let Some(d) = req.dimensions.filter(|&d| d == 0 || d > size) {
        return Err(ApiError::invalid(
            "dimensions",
            format!("dimensions = {d} is out of range: this model's embeddings have 1 to {size}."),
        ));
    }
    let tokenize_model = model.clone();
    let input = req.input;
    let requests =
        tokenize_blocking(move || validated_inputs(&tokenize_model, input, lora)).await?;
    let mut generation = Generation::submit(
        &state,
        model,
        generation::request_id("embd"),
        "embeddings",
        started,
        requests,
        true,
    )?;
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; generation.num_choices()];
    while let Some(item) = generation.next().await {
        match item {
            Item::Finished { event, .. } if event.reason == FinishReason::Error => {
                return Err(generation::engine_failure(&event))
            }
            Item::Finished { choice, event } => match (event.reason, event.embedding) {
                (FinishReason::Stop, Some(vector)) => {
                    if let Some(slot) = vectors.get_mut(choice) {
                        *slot = Some(vector);
                    }
                }
                _ => {
                    return Err(ApiError::unavailable(
                        "The server stopped the request before it finished (shutting down).",
                    ))
                }
            },
            // An embedding generates nothing.
            Item::Token { .. } => {}
            Item::Lost => return Err(generation::engine_lost()),
        }
    }
    let format = req.encoding_format.unwrap_or_default();
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, vector)| {
            let mut vector = vector.ok_or_else(generation::engine_lost)?;
            if let Some(d) = req.dimensions {
                vector.truncate(d);
                l2_normalize(&mut vector);
            }
            Ok(Embedding {
                object: "embedding",
                index,
                embedding: encode(vector, format),
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let prompt_tokens = generation.usage().prompt_tokens;
    Ok(Json(EmbeddingResponse {
        object: "list",
        data,
        model: generation.served_as.clone(),
        usage: EmbeddingUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    }))
}

/// Each input's token ids, validated as an embedding (it must fit one sequence). An empty
/// input is a 400, as OpenAI's; so is a request of more inputs than the waiting queue holds,
/// which could never be queued whole.
fn validated_inputs(
    model: &ServedModel,
    input: Prompt,
    lora: Option<LoraRequest>,
) -> Result<Vec<ValidRequest>, ApiError> {
    let count = match &input {
        Prompt::Text(_) | Prompt::Tokens(_) => 1,
        Prompt::Texts(texts) => texts.len(),
        Prompt::TokenLists(lists) => lists.len(),
    };
    if count == 0 {
        return Err(ApiError::invalid("input", "The input is empty."));
    }
    let max = model.engine.max_waiting();
    if count > max {
        return Err(ApiError::invalid(
            "input",
            format!(
                "{count} inputs were given; this server queues at most {max} at once \
                 (--max-waiting)."
            ),
        ));
    }
    let ids: Vec<Result<Vec<u32>, ApiError>> = match input {
        Prompt::Text(text) => vec![encode_text(model, text)],
        Prompt::Texts(texts) => texts.into_iter().map(|t| encode_text(model, t)).collect(),
        Prompt::Tokens(ids) => vec![Ok(ids)],
        Prompt::TokenLists(lists) => lists.into_iter().map(Ok).collect(),
    };
    ids.into_iter()
        .map(|ids| {
            let valid = model.engine.validate_embedding(ids?);
            let valid = match &lora {
                Some(lora) => valid.and_then(|v| v.with_adapter(lora.clone())),
                None => valid,
            };
            valid.map_err(|e| ApiError::from_invalid(e, &ParamNames::EMBEDDINGS))
        })
        .collect()
}

/// A text input's ids as the model's tokenizer frames a whole input: BOS and EOS where the
/// model wants them (an embedding model pooled on its last token reads the EOS there).
fn encode_text(model: &ServedModel, text: String) -> Result<Vec<u32>, ApiError> {
    if text.is_empty() {
        return Err(ApiError::invalid("input", "An input is an empty string."));
    }
    model
        .tokenizer()
        .encode_input(&text)
        .map_err(|e| ApiError::invalid("input", e.to_string()))
}

/// Floats as they are, or base64 of their little-endian bytes (what OpenAI's SDKs decode).
fn encode(vector: Vec<f32>, format: EncodingFormat) -> EmbeddingVector {
    match format {
        EncodingFormat::Float => EmbeddingVector::Float(vector),
        EncodingFormat::Base64 => {
            let bytes: Vec<u8> = vector.iter().flat_map(|f| f.to_le_bytes()).collect();
            EmbeddingVector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_little_endian_floats() {
        let EmbeddingVector::Base64(text) = encode(vec![1.0, -0.5], EncodingFormat::Base64) else {
            panic!("not base64");
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap();
        assert_eq!(
            bytes,
            [1.0f32.to_le_bytes(), (-0.5f32).to_le_bytes()].concat()
        );
    }
}
