//! The prefix cache, for routers and operators: `GET /debug/kv_cache` lists the cached blocks
//! with the number of the last KV-event batch they include (a subscriber that joined late or
//! lost batches starts from it and applies the batches after it), and `POST
//! /reset_prefix_cache` empties the cache, as vLLM's route of that name does (one
//! `AllBlocksCleared` event).
//!
//! Both are served only with `--kv-events`: the listing holds every cached prompt's token ids
//! (other clients' prompts), and a reset costs every client its cached prefixes, so neither
//! is open on a server that has not been set up for routers.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use sluice_engine::EngineHandle;

use crate::edge::error::ApiError;
use crate::engine::state::AppState;

#[derive(Debug, Serialize)]
pub struct KvCacheResponse {
    /// The last KV-event batch the listed blocks include; null before the first batch or
    /// without `--kv-events`.
    pub last_seq: Option<u64>,
    pub block_size: usize,
    pub num_blocks: usize,
    pub blocks: Vec<CachedBlock>,
}

#[derive(Debug, Serialize)]
pub struct CachedBlock {
    /// The block's chain hash, as `BlockStored` events name it.
    pub hash: u64,
    /// Null for a sequence's first block.
    pub parent_hash: Option<u64>,
    pub token_ids: Vec<u32>,
    /// The LoRA adapter whose K/V it holds; null for the base model.
    pub lora_name: Option<String>,
}

/// The engine, for either route: a 404 on a server without `--kv-events`.
async fn engine_with_kv_events(state: &AppState, route: &str) -> Result<EngineHandle, ApiError> {
    let engine = state.model_for(None).await?.engine.clone();
    if !engine.records_kv_events() {
        return Err(ApiError::from_status(
            StatusCode::NOT_FOUND,
            format!(
                "{route} is served only when the server publishes KV-cache events (--kv-events)."
            ),
        ));
    }
    Ok(engine)
}

fn engine_stopped() -> ApiError {
    ApiError::unavailable("The engine has stopped.")
}

pub async fn snapshot(State(state): State<AppState>) -> Result<Json<KvCacheResponse>, ApiError> {
    let snap = engine_with_kv_events(&state, "GET /debug/kv_cache")
        .await?
        .kv_cache_snapshot()
        .await
        .ok_or_else(engine_stopped)?;
    let mut blocks: Vec<CachedBlock> = snap
        .blocks
        .into_iter()
        .map(|b| CachedBlock {
            hash: b.hash,
            parent_hash: b.parent_hash,
            token_ids: b.token_ids,
            lora_name: b.lora_name.map(|n| n.to_string()),
        })
        .collect();
    blocks.sort_unstable_by_key(|b| b.hash);
    Ok(Json(KvCacheResponse {
        last_seq: snap.last_seq,
        block_size: snap.block_size,
        num_blocks: blocks.len(),
        blocks,
    }))
}

#[derive(Debug, Serialize)]
pub struct ResetResponse {
    /// Blocks the prefix cache held.
    pub cleared_blocks: usize,
}

pub async fn reset_prefix_cache(
    State(state): State<AppState>,
) -> Result<Json<ResetResponse>, ApiError> {
    let cleared_blocks = engine_with_kv_events(&state, "POST /reset_prefix_cache")
        .await?
        .reset_prefix_cache()
        .await
        .ok_or_else(engine_stopped)?;
    Ok(Json(ResetResponse { cleared_blocks }))
}
