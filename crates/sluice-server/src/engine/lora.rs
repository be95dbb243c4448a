//! The LoRA adapters a server serves beside its base model, by name: those of
//! `--lora-modules`, loaded at start, and those `POST /v1/load_lora_adapter` adds while it
//! runs (with `--allow-runtime-lora-updating`). A request's `model` field picks one
//! ([`crate::engine::fields::check_model`]); the engine runs it in one of its adapter slots.
//!
//! Each load reads and checks the adapter against the base model once (its rank against
//! `--max-lora-rank`, every tensor's shape) and gives it a new id: the prefix cache keys blocks
//! by that id, so an adapter loaded again under the same name never reuses the K/V its earlier
//! weights computed. Unloading removes the name at once; requests already running with the
//! adapter finish with it (they hold its weights). Loading in place (vLLM's `load_inplace`)
//! swaps the weights under a served name the same way: running requests keep the old ones,
//! later ones get the new (under a new id, so no K/V of the old is reused).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use sluice_engine::{AdapterKey, LoraRequest};
use sluice_model::{LoraAdapter, ModelConfig};

/// Why an adapter could not be loaded or unloaded; the message names the adapter.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error("The LoRA adapter `{0}` is already loaded; set load_inplace to replace it.")]
    Exists(String),
    #[error("The LoRA adapter `{0}` is not loaded.")]
    NotFound(String),
    #[error("`{name}` is the base model's name, not an adapter's.")]
    BaseName { name: String },
    #[error("Cannot load the LoRA adapter `{name}`: {reason}")]
    Invalid { name: String, reason: String },
}

/// One adapter being served.
#[derive(Clone)]
pub struct ServedAdapter {
    pub request: LoraRequest,
    /// Unix seconds when it was loaded (`/v1/models`' `created`).
    pub created: u64,
    /// The adapter's file or directory name, never a path on this host (`/v1/models`' root).
    pub root: String,
}

pub struct LoraRegistry {
    config: ModelConfig,
    base_name: String,
    max_rank: usize,
    /// `--allow-runtime-lora-updating`: the load and unload routes answer.
    pub runtime_updates: bool,
    next_id: AtomicU64,
    adapters: RwLock<BTreeMap<String, ServedAdapter>>,
}

impl LoraRegistry {
    pub fn new(
        config: ModelConfig,
        base_name: String,
        max_rank: usize,
        runtime_updates: bool,
    ) -> Self {
        Self {
            config,
            base_name,
            max_rank,
            runtime_updates,
            next_id: AtomicU64::new(1),
            adapters: RwLock::new(BTreeMap::new()),
        }
    }

    /// Reads the adapter at `path` and serves it as `name`; `replace`: in place of an adapter
    /// already served under the name (refused otherwise). Blocking: it reads the files.
    pub fn load(&self, name: &str, path: &Path, replace: bool) -> Result<(), LoraError> {
        if name == self.base_name {
            return Err(LoraError::BaseName { name: name.into() });
        }
        if !replace && self.get(name).is_some() {
            return Err(LoraError::Exists(name.into()));
        }
        let adapter = LoraAdapter::load(path, &self.config, self.max_rank).map_err(|e| {
            LoraError::Invalid {
                name: name.into(),
                reason: e.to_string(),
            }
        })?;
        let served = ServedAdapter {
            request: LoraRequest {
                key: AdapterKey {
                    id: self.next_id.fetch_add(1, Ordering::Relaxed),
                    name: name.into(),
                },
                adapter: Arc::new(adapter),
            },
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            root: file_name(path),
        };
        let mut adapters = self.adapters.write().unwrap_or_else(|e| e.into_inner());
        // Loaded twice at once: the first one in stays (unless replacing, where the last does).
        if !replace && adapters.contains_key(name) {
            return Err(LoraError::Exists(name.into()));
        }
        let replaced = adapters.insert(name.to_string(), served).is_some();
        tracing::info!(
            adapter = name,
            rank = adapters[name].request.adapter.rank(),
            replaced,
            "LoRA adapter loaded"
        );
        Ok(())
    }

    /// Stops serving `name`; requests running with it finish with it.
    pub fn unload(&self, name: &str) -> Result<(), LoraError> {
        let removed = self
            .adapters
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        match removed {
            Some(_) => {
                tracing::info!(adapter = name, "LoRA adapter unloaded");
                Ok(())
            }
            None => Err(LoraError::NotFound(name.into())),
        }
    }

    /// The adapter served as `name`, for a request that names it.
    pub fn get(&self, name: &str) -> Option<ServedAdapter> {
        self.adapters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Every adapter served, by name.
    pub fn list(&self) -> Vec<(String, ServedAdapter)> {
        self.adapters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(name, a)| (name.clone(), a.clone()))
            .collect()
    }
}

fn file_name(path: &Path) -> String {
    let path: PathBuf = path.components().collect();
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
