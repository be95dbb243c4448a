//! `GET /v1/models` and `GET /v1/models/{model}`: the one served model.

use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;

use crate::error::ApiError;
use crate::state::{AppState, ServedModel};

#[derive(Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// What the model was loaded from (vLLM's field): the model file's or directory's name.
    pub root: String,
    /// The base model of an adapter (vLLM's field); null for a base model, as every model
    /// sluice serves is.
    pub parent: Option<String>,
    pub max_model_len: usize,
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
    }
}

pub async fn list(State(state): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    let model = state.model()?;
    Ok(Json(ModelList {
        object: "list",
        data: vec![card(&model)],
    }))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    let model = state.model()?;
    if name != model.name {
        return Err(ApiError::model_not_found(&name));
    }
    Ok(Json(card(&model)))
}
