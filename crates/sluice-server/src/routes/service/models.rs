//! `GET /v1/models` and `GET /v1/models/{model}`: the served model, then each LoRA adapter
//! served beside it (its `parent` the base model, as vLLM lists them).

use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;

use crate::edge::error::ApiError;
use crate::engine::lora::ServedAdapter;
use crate::engine::state::{AppState, ServedModel};

#[derive(Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// What the model was loaded from (vLLM's field): the model file's or directory's name.
    pub root: String,
    /// The base model of a LoRA adapter (vLLM's field); null for the base model.
    pub parent: Option<String>,
    pub max_model_len: usize,
    /// sluice's own: the architecture as GGUF names it (`qwen3moe`; `llama` for Mixtral).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<&'static str>,
    /// Every parameter, each expert of a mixture counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<usize>,
    /// The parameters one token multiplies by: a mixture's router, shared expert and its k
    /// chosen experts; the same as `parameters` for a dense model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_parameters: Option<usize>,
    /// A mixture of experts: how many experts a layer holds and a token runs; null for a
    /// dense model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mixture_of_experts: Option<Option<MixtureOfExperts>>,
}

#[derive(Debug, Serialize)]
pub struct MixtureOfExperts {
    pub experts: usize,
    pub experts_per_token: usize,
}

#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

fn card(model: &ServedModel) -> ModelCard {
    ModelCard {
        id: model.name.clone(),
        object: "model",
        created: model.created,
        owned_by: "sluice",
        root: model.root.clone(),
        parent: None,
        max_model_len: model.capacity(),
        architecture: model.facts.as_ref().map(|f| f.architecture),
        parameters: model.facts.as_ref().map(|f| f.parameters),
        active_parameters: model.facts.as_ref().map(|f| f.active_parameters),
        mixture_of_experts: model.facts.as_ref().map(|f| {
            f.experts
                .map(|(experts, experts_per_token)| MixtureOfExperts {
                    experts,
                    experts_per_token,
                })
        }),
    }
}

/// An adapter's card: the base's context and shape, its own name, load time and root.
fn adapter_card(model: &ServedModel, name: String, adapter: &ServedAdapter) -> ModelCard {
    ModelCard {
        id: name,
        created: adapter.created,
        root: adapter.root.clone(),
        parent: Some(model.name.clone()),
        ..card(model)
    }
}

pub async fn list(State(state): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    let model = state.model()?;
    let mut data = vec![card(&model)];
    if let Some(loras) = &model.loras {
        data.extend(
            loras
                .list()
                .into_iter()
                .map(|(name, adapter)| adapter_card(&model, name, &adapter)),
        );
    }
    Ok(Json(ModelList {
        object: "list",
        data,
    }))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    let model = state.model()?;
    if name == model.name {
        return Ok(Json(card(&model)));
    }
    match model.loras.as_ref().and_then(|loras| loras.get(&name)) {
        Some(adapter) => Ok(Json(adapter_card(&model, name, &adapter))),
        None => Err(ApiError::model_not_found(&name)),
    }
}
