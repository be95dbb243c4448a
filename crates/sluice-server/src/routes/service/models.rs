//! `GET /v1/models` and `GET /v1/models/{model}`: every served model with its state (loaded,
//! loading, unloading, unloaded), each loaded one followed by the LoRA adapters served beside
//! it (their `parent` the base model, as vLLM lists them); `POST /models/load` and
//! `/models/unload` load or unload one by name.

use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::edge::error::ApiError;
use crate::engine::lora::ServedAdapter;
use crate::engine::registry::{ModelRegistry, ModelState};
use crate::engine::state::{AppState, ServedModel};
use crate::routes::json::ApiJson;

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
    /// Unknown (absent) while the model is not loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<usize>,
    /// sluice's own: loaded, loading, unloading or unloaded.
    pub state: &'static str,
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
    /// What the model reads: `text`, and `image` when it takes images; absent while it is
    /// not loaded. The chat page shows its attach button by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_modalities: Option<Vec<&'static str>>,
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
        state: ModelState::Loaded.as_str(),
        max_model_len: Some(model.capacity()),
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
        input_modalities: Some(if model.image_input.is_some() {
            vec!["text", "image"]
        } else {
            vec!["text"]
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

/// A model served but not loaded now: its name and state only.
fn unloaded_card(name: String, state: ModelState) -> ModelCard {
    ModelCard {
        root: name.clone(),
        id: name,
        object: "model",
        created: 0,
        owned_by: "sluice",
        parent: None,
        state: state.as_str(),
        max_model_len: None,
        architecture: None,
        parameters: None,
        active_parameters: None,
        mixture_of_experts: None,
        input_modalities: None,
    }
}

/// A loaded model's card and its adapters' cards.
fn cards(model: &ServedModel) -> Vec<ModelCard> {
    let mut data = vec![card(model)];
    if let Some(loras) = &model.loras {
        data.extend(
            loras
                .list()
                .into_iter()
                .map(|(name, adapter)| adapter_card(model, name, &adapter)),
        );
    }
    data
}

pub async fn list(State(state): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    let mut data = Vec::new();
    for (name, model_state, served) in state.registry()?.list() {
        match served {
            Some(model) => data.extend(cards(&model)),
            None => data.push(unloaded_card(name, model_state)),
        }
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
    let list = state.registry()?.list();
    for (id, model_state, served) in &list {
        match served {
            Some(model) => {
                if let Some(card) = cards(model).into_iter().find(|c| c.id == name) {
                    return Ok(Json(card));
                }
            }
            None if *id == name => return Ok(Json(unloaded_card(name, *model_state))),
            None => {}
        }
    }
    let names: Vec<&str> = list.iter().map(|(n, _, _)| n.as_str()).collect();
    Err(ApiError::model_not_served(&name, &names))
}

/// The body of `POST /models/load` and `/models/unload`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRequest {
    pub model: String,
}

#[derive(Debug, Serialize)]
pub struct ModelStateBody {
    pub model: String,
    pub state: &'static str,
}

/// Loads the model now (waiting for room as a request would) and answers once it is loaded.
pub async fn load(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ModelRequest>,
) -> Result<Json<ModelStateBody>, ApiError> {
    let models = state.registry()?.clone();
    require_served(&models, &req.model)?;
    models.get(Some(&req.model)).await?;
    Ok(Json(ModelStateBody {
        model: req.model,
        state: ModelState::Loaded.as_str(),
    }))
}

/// Unloads the model once no request runs on it, and answers once it is unloaded.
pub async fn unload(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ModelRequest>,
) -> Result<Json<ModelStateBody>, ApiError> {
    let models = state.registry()?.clone();
    require_served(&models, &req.model)?;
    models.unload(&req.model).await?;
    Ok(Json(ModelStateBody {
        model: req.model,
        state: ModelState::Unloaded.as_str(),
    }))
}

/// These routes name served models only (not adapters, not the default by omission).
fn require_served(models: &ModelRegistry, name: &str) -> Result<(), ApiError> {
    let names = models.names();
    if names.iter().any(|n| n == name) {
        return Ok(());
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Err(ApiError::model_not_served(name, &names))
}
