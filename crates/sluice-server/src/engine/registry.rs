//! The models one server serves, by name, each with its own engine thread and KV cache. The
//! default (first) model loads at start; another loads when a request first names it (or on
//! `POST /models/load`). Past `--max-loaded-models`, the least recently used model with no
//! request running is unloaded to make room: a model is never unloaded under a request, and a
//! request for a model that is loading, or waiting for room, waits (counted) rather than fail.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_engine::Engine;

use crate::edge::error::ApiError;
use crate::engine::served::ServedModel;

/// Loads model `i` of the list (blocking: seconds for a real model): the model as handlers
/// see it and the engine that runs it.
pub type Loader = Arc<dyn Fn(usize) -> anyhow::Result<(ServedModel, Engine)> + Send + Sync>;

/// How often a waiting request looks again (a model's last request ending wakes nobody: its
/// handle is simply dropped).
const RECHECK: Duration = Duration::from_millis(20);

/// Where a model stands, as `/v1/models` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    Loaded,
    Loading,
    Unloading,
    Unloaded,
}

impl ModelState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Loading => "loading",
            Self::Unloading => "unloading",
            Self::Unloaded => "unloaded",
        }
    }
}

enum Phase {
    Unloaded,
    Loading,
    /// `engine` is `None` where a test serves a model it started itself.
    Loaded {
        served: Arc<ServedModel>,
        engine: Option<Engine>,
    },
    Unloading,
    /// The last load failed; the next request tries again.
    Failed(String),
}

struct Slot {
    name: String,
    phase: Phase,
    last_used: Instant,
    /// Requests waiting for this model to load (or for room to load it).
    waiting: usize,
}

pub struct ModelRegistry {
    slots: Mutex<Vec<Slot>>,
    /// The configured LoRA adapters' names and their models' indices (a request naming one
    /// loads its model; adapters loaded at run time are found on the loaded models).
    adapters: Vec<(String, usize)>,
    changed: tokio::sync::Notify,
    /// 0: every model may be loaded at once.
    max_loaded: usize,
    loader: Option<Loader>,
}

impl ModelRegistry {
    /// `names[0]` is the default model; none is loaded yet.
    pub fn new(
        names: Vec<String>,
        adapters: Vec<(String, usize)>,
        loader: Loader,
        max_loaded: usize,
    ) -> Self {
        Self {
            adapters,
            ..Self::with_slots(names, Some(loader), max_loaded)
        }
    }

    fn with_slots(names: Vec<String>, loader: Option<Loader>, max_loaded: usize) -> Self {
        let now = Instant::now();
        Self {
            slots: Mutex::new(
                names
                    .into_iter()
                    .map(|name| Slot {
                        name,
                        phase: Phase::Unloaded,
                        last_used: now,
                        waiting: 0,
                    })
                    .collect(),
            ),
            adapters: Vec::new(),
            changed: tokio::sync::Notify::new(),
            max_loaded,
            loader,
        }
    }

    /// One model, already running (tests, and a server of one model before its load ends).
    pub fn single(model: ServedModel) -> Self {
        let registry = Self::with_slots(vec![model.name.clone()], None, 0);
        registry.insert(0, model, None);
        registry
    }

    /// Model `i` has been loaded by the caller (the default model, at start).
    pub fn insert(&self, i: usize, model: ServedModel, engine: Option<Engine>) {
        let mut slots = self.slots.lock().unwrap();
        slots[i].phase = Phase::Loaded {
            served: Arc::new(model),
            engine,
        };
        slots[i].last_used = Instant::now();
        drop(slots);
        self.changed.notify_waiters();
    }

    pub fn names(&self) -> Vec<String> {
        self.slots
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.name.clone())
            .collect()
    }

    /// Every model with its state and, when loaded, the model.
    pub fn list(&self) -> Vec<(String, ModelState, Option<Arc<ServedModel>>)> {
        self.slots
            .lock()
            .unwrap()
            .iter()
            .map(|s| {
                let (state, served) = match &s.phase {
                    Phase::Loaded { served, .. } => (ModelState::Loaded, Some(served.clone())),
                    Phase::Loading => (ModelState::Loading, None),
                    Phase::Unloading => (ModelState::Unloading, None),
                    Phase::Unloaded | Phase::Failed(_) => (ModelState::Unloaded, None),
                };
                (s.name.clone(), state, served)
            })
            .collect()
    }

    /// The models loaded now.
    pub fn loaded(&self) -> Vec<Arc<ServedModel>> {
        self.list().into_iter().filter_map(|(_, _, m)| m).collect()
    }

    /// `(name, loaded, requests waiting for it to load)` of each model, for `/metrics`.
    pub fn states(&self) -> Vec<(String, bool, usize)> {
        self.slots
            .lock()
            .unwrap()
            .iter()
            .map(|s| {
                let loaded = matches!(s.phase, Phase::Loaded { .. });
                (s.name.clone(), loaded, s.waiting)
            })
            .collect()
    }

    /// Which model `requested` names: a served name, else a LoRA adapter of a loaded model;
    /// `None` (or one model served) the default. `Err`: the 404 listing what is served.
    fn index_of(&self, requested: Option<&str>) -> Result<usize, ApiError> {
        let slots = self.slots.lock().unwrap();
        let Some(name) = requested else {
            return Ok(0);
        };
        if let Some(i) = slots.iter().position(|s| s.name == name) {
            return Ok(i);
        }
        if let Some(&(_, i)) = self.adapters.iter().find(|(a, _)| a == name) {
            return Ok(i);
        }
        let adapter_of = slots.iter().position(|s| match &s.phase {
            Phase::Loaded { served, .. } => {
                served.loras.as_ref().is_some_and(|l| l.get(name).is_some())
            }
            _ => false,
        });
        match adapter_of {
            Some(i) => Ok(i),
            // One model: its own check (adapters included) says what is wrong.
            None if slots.len() == 1 => Ok(0),
            None => Err(ApiError::model_not_served(
                name,
                &slots.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            )),
        }
    }

    /// The model `requested` names, loading it first if need be (and unloading the least
    /// recently used idle one when `--max-loaded-models` is reached).
    pub async fn get(
        self: &Arc<Self>,
        requested: Option<&str>,
    ) -> Result<Arc<ServedModel>, ApiError> {
        let i = self.index_of(requested)?;
        let mut counted = false;
        let result = loop {
            let notified = self.changed.notified();
            match self.step(i, &mut counted) {
                Step::Ready(served) => break Ok(served),
                Step::Failed(e) => break Err(e),
                Step::Wait => {
                    let _ = tokio::time::timeout(RECHECK, notified).await;
                }
            }
        };
        if counted {
            self.slots.lock().unwrap()[i].waiting -= 1;
        }
        result
    }

    /// One look at model `i`: ready, or start what makes it so, and wait.
    fn step(self: &Arc<Self>, i: usize, counted: &mut bool) -> Step {
        let mut slots = self.slots.lock().unwrap();
        match &slots[i].phase {
            Phase::Loaded { served, .. } => {
                let served = served.clone();
                slots[i].last_used = Instant::now();
                return Step::Ready(served);
            }
            Phase::Failed(e) if *counted => {
                return Step::Failed(ApiError::unavailable(format!(
                    "The model `{}` failed to load: {e}",
                    slots[i].name
                )))
            }
            Phase::Loading | Phase::Unloading => {}
            Phase::Unloaded | Phase::Failed(_) => {
                let Some(loader) = self.loader.clone() else {
                    return Step::Failed(ApiError::unavailable("The model is not loaded."));
                };
                let busy = slots
                    .iter()
                    .filter(|s| {
                        matches!(
                            s.phase,
                            Phase::Loaded { .. } | Phase::Loading | Phase::Unloading
                        )
                    })
                    .count();
                if self.max_loaded == 0 || busy < self.max_loaded {
                    slots[i].phase = Phase::Loading;
                    let registry = self.clone();
                    tokio::task::spawn_blocking(move || registry.run_load(i, &loader));
                } else if let Some(victim) = least_recently_used_idle(&slots) {
                    let Phase::Loaded { served, engine } =
                        std::mem::replace(&mut slots[victim].phase, Phase::Unloading)
                    else {
                        unreachable!("the victim is loaded");
                    };
                    tracing::info!(
                        unloading = %slots[victim].name,
                        for_model = %slots[i].name,
                        max_loaded_models = self.max_loaded,
                        "unloading the least recently used model to make room"
                    );
                    let registry = self.clone();
                    tokio::task::spawn_blocking(move || {
                        registry.run_unload(victim, served, engine)
                    });
                }
            }
        }
        if !*counted {
            *counted = true;
            slots[i].waiting += 1;
        }
        Step::Wait
    }

    fn run_load(&self, i: usize, loader: &Loader) {
        let name = self.slots.lock().unwrap()[i].name.clone();
        let start = Instant::now();
        tracing::info!(model = %name, "loading a model on first use");
        // A panic in a load must not leave the model `Loading` with its requests waiting on it.
        let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loader(i)))
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the load panicked")));
        let phase = match loaded {
            Ok((served, engine)) => {
                tracing::info!(model = %name, load_ms = start.elapsed().as_millis() as u64, "model loaded");
                Phase::Loaded {
                    served: Arc::new(served),
                    engine: Some(engine),
                }
            }
            Err(e) => {
                tracing::error!(model = %name, error = %format!("{e:#}"), "the model failed to load");
                Phase::Failed(format!("{e:#}"))
            }
        };
        let mut slots = self.slots.lock().unwrap();
        slots[i].phase = phase;
        slots[i].last_used = Instant::now();
        drop(slots);
        self.changed.notify_waiters();
    }

    fn run_unload(&self, i: usize, served: Arc<ServedModel>, engine: Option<Engine>) {
        drop(served);
        if let Some(engine) = engine {
            let report = engine.shutdown(Duration::from_secs(5));
            if report.aborted > 0 {
                tracing::warn!(aborted = report.aborted, "sequences aborted by an unload");
            }
        }
        let mut slots = self.slots.lock().unwrap();
        tracing::info!(model = %slots[i].name, "model unloaded");
        slots[i].phase = Phase::Unloaded;
        drop(slots);
        self.changed.notify_waiters();
    }

    /// Unloads the model `name` once no request runs on it (`POST /models/unload`).
    pub async fn unload(self: &Arc<Self>, name: &str) -> Result<(), ApiError> {
        let i = self.index_of(Some(name))?;
        loop {
            let notified = self.changed.notified();
            // Decided under the lock, done after it: the lock is never held across an await.
            let taken = {
                let mut slots = self.slots.lock().unwrap();
                match &slots[i].phase {
                    Phase::Unloaded | Phase::Failed(_) => return Ok(()),
                    Phase::Loaded { engine: None, .. } => {
                        return Err(ApiError::unavailable(
                            "This model's engine is not the registry's to stop.",
                        ))
                    }
                    Phase::Loaded { served, .. } if is_idle(served) => {
                        match std::mem::replace(&mut slots[i].phase, Phase::Unloading) {
                            Phase::Loaded { served, engine } => Some((served, engine)),
                            _ => unreachable!("matched above"),
                        }
                    }
                    _ => None,
                }
            };
            if let Some((served, engine)) = taken {
                let registry = self.clone();
                return tokio::task::spawn_blocking(move || registry.run_unload(i, served, engine))
                    .await
                    .map_err(|e| ApiError::internal(format!("the unload panicked: {e}")));
            }
            let _ = tokio::time::timeout(RECHECK, notified).await;
        }
    }

    /// Every loaded engine stops taking requests (shutdown's drain).
    pub fn begin_drain(&self) {
        for m in self.loaded() {
            m.engine.begin_drain();
        }
    }

    /// Sequences in flight over every loaded engine.
    pub fn in_flight(&self) -> usize {
        self.loaded()
            .iter()
            .map(|m| m.engine.stats().in_flight())
            .sum()
    }

    /// Stops every engine the registry owns (blocking); sequences still running are
    /// aborted. Returns how many.
    pub fn shutdown(&self) -> usize {
        let engines: Vec<Engine> = {
            let mut slots = self.slots.lock().unwrap();
            slots
                .iter_mut()
                .filter_map(|s| match std::mem::replace(&mut s.phase, Phase::Unloaded) {
                    Phase::Loaded { engine, .. } => engine,
                    _ => None,
                })
                .collect()
        };
        engines
            .into_iter()
            .map(|e| e.shutdown(Duration::ZERO).aborted)
            .sum()
    }
}

enum Step {
    Ready(Arc<ServedModel>),
    Failed(ApiError),
    Wait,
}

/// A model no request holds: only the registry has it, and its engine runs nothing.
fn is_idle(served: &Arc<ServedModel>) -> bool {
    Arc::strong_count(served) == 1 && served.engine.stats().in_flight() == 0
}

fn least_recently_used_idle(slots: &[Slot]) -> Option<usize> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| match &s.phase {
            Phase::Loaded { served, engine } => engine.is_some() && is_idle(served),
            _ => false,
        })
        .min_by_key(|(_, s)| s.last_used)
        .map(|(i, _)| i)
}
