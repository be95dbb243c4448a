//! What every handler shares: the models served (their registry, once the default has loaded),
//! the download shown while it is fetched, the draining flag, and the count of requests in
//! flight that shutdown waits for.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::edge::error::ApiError;
use crate::engine::registry::ModelRegistry;
pub use crate::engine::served::{unix_now, ImageInputSpec, ModelFacts, ServedModel};
use crate::media::{Media, MediaLimits};

struct Inner {
    models: OnceLock<Arc<ModelRegistry>>,
    /// The model's download while it is fetched from the hub (`/health` shows it).
    download: OnceLock<sluice_hub::DownloadProgress>,
    draining: AtomicBool,
    in_flight: AtomicUsize,
    /// Longest time a client may take to send its request body.
    body_timeout: Duration,
    metrics: PrometheusHandle,
    /// The image limits and URL fetcher ([`AppState::set_media`]).
    media: OnceLock<Media>,
}

#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

impl AppState {
    pub fn new(body_timeout: Duration, metrics: PrometheusHandle) -> Self {
        Self {
            inner: Arc::new(Inner {
                models: OnceLock::new(),
                download: OnceLock::new(),
                draining: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                body_timeout,
                metrics,
                media: OnceLock::new(),
            }),
        }
    }

    /// The model has loaded: from now on requests are served and `/health` is 200.
    pub fn set_ready(&self, model: ServedModel) {
        self.set_models(Arc::new(ModelRegistry::single(model)));
    }

    /// Where `/health` reads the download's progress from while the model is fetched.
    pub fn track_download(&self, progress: sluice_hub::DownloadProgress) {
        let _ = self.inner.download.set(progress);
    }

    pub fn download(&self) -> Option<&sluice_hub::DownloadProgress> {
        self.inner.download.get()
    }

    /// The models served, the default one loaded: from now on requests are served.
    pub fn set_models(&self, models: Arc<ModelRegistry>) {
        if self.inner.models.set(models).is_err() {
            tracing::warn!("models were already being served; keeping the first");
        }
    }

    pub fn models(&self) -> Option<&Arc<ModelRegistry>> {
        self.inner.models.get()
    }

    /// The models, or the 503 a client gets while the default loads or the server drains.
    pub fn registry(&self) -> Result<&Arc<ModelRegistry>, ApiError> {
        if self.is_draining() {
            return Err(ApiError::unavailable("The server is shutting down."));
        }
        self.inner
            .models
            .get()
            .ok_or_else(|| ApiError::unavailable("The model is still loading; retry shortly."))
    }

    /// The model a request's `model` names (the default when it names none), loaded first
    /// if it is not; a 404 listing what is served when it names none of them.
    pub async fn model_for(&self, requested: Option<&str>) -> Result<Arc<ServedModel>, ApiError> {
        self.registry()?.get(requested).await
    }

    /// Every model loaded now.
    pub fn loaded_models(&self) -> Vec<Arc<ServedModel>> {
        self.inner
            .models
            .get()
            .map(|m| m.loaded())
            .unwrap_or_default()
    }

    /// Turns `/health` to 503 and refuses new requests; the engine is told separately.
    pub fn begin_drain(&self) {
        self.inner.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }

    pub fn body_timeout(&self) -> Duration {
        self.inner.body_timeout
    }

    pub fn metrics(&self) -> &PrometheusHandle {
        &self.inner.metrics
    }

    /// The configuration's image limits, set once at start.
    pub fn set_media(&self, media: Media) {
        if self.inner.media.set(media).is_err() {
            tracing::warn!("image limits were already set; keeping the first");
        }
    }

    /// The image limits and fetcher: those set at start, else the configuration's defaults
    /// (a server built without a configuration, as tests build one).
    pub fn media(&self) -> &Media {
        self.inner
            .media
            .get_or_init(|| Media::new(MediaLimits::default()))
    }

    /// Counts a generation request as in flight until the guard is dropped (its response
    /// finished, or its client went away).
    pub fn track(&self) -> InFlight {
        self.inner.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight {
            inner: self.inner.clone(),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::Acquire)
    }
}

/// One request in flight; see [`AppState::track`].
pub struct InFlight {
    inner: Arc<Inner>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.inner.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
