//! `sluice serve`: bind, answer 503 while the model loads, serve, and drain on SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::commands::shutdown::{self, Drained, Signals};
use crate::config::{Config, ServeArgs};
use crate::edge::http::HttpServer;
use crate::engine::hub;
use crate::engine::load::{self, ModelSettings};
use crate::engine::registry::{Loader, ModelRegistry};
use crate::engine::state::AppState;
use crate::media::Media;
use crate::observe::kv_events::{KvEventPublisher, Medium, PublisherSettings};
use crate::routes::{self, HttpSettings};

/// How long connections get to close after the drain, before the process exits anyway.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::resolve(&args)?;
    crate::commands::logging::init(config.log_format, &config.log_level)?;
    tracing::debug!(?config, "configuration");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sluice-http")
        .build()
        .context("cannot start the async runtime")?;
    // The signal handlers need the runtime.
    let result = runtime.block_on(async {
        let signals = Signals::new().context("cannot install signal handlers")?;
        serve(config, signals, None).await
    });
    // A model load still running on a blocking thread (signal during load) is abandoned.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Serves `config` until `signals` says stop. `ready`, when given, hears the address once the
/// default model has loaded (`sluice chat` serving a model in-process).
pub async fn serve(
    config: Config,
    mut signals: Signals,
    ready: Option<tokio::sync::oneshot::Sender<std::net::SocketAddr>>,
) -> anyhow::Result<()> {
    // Before the engine starts: it registers its metrics with whatever recorder is installed.
    let metrics = crate::observe::metrics::install();
    let listener = TcpListener::bind((config.host.as_str(), config.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", config.host, config.port))?;
    let state = AppState::new(config.request_timeout(), metrics.clone());
    state.set_media(Media::new(config.media_limits()));
    let app = routes::router(state.clone(), &HttpSettings::from_config(&config));
    let server = HttpServer::spawn(listener, app, config.request_timeout());
    tracing::info!(
        address = %server.local_addr(),
        model = %config.model.first().display(),
        "listening; /health answers 503 until the model has loaded"
    );
    let upkeep = tokio::spawn(async move {
        let mut tick = tokio::time::interval(crate::observe::metrics::UPKEEP_INTERVAL);
        loop {
            tick.tick().await;
            metrics.run_upkeep();
        }
    });
    // Bound before the model loads, so that a bad endpoint fails the start at once.
    let kv_events = match &config.kv_events {
        Some(endpoint) => Some(
            KvEventPublisher::bind(PublisherSettings {
                endpoint: (**endpoint).clone(),
                replay: config.kv_events_replay.as_ref().map(|r| (**r).clone()),
                topic: config.kv_events_topic.clone(),
                hwm: config.kv_events_hwm,
                buffer_steps: config.kv_events_buffer_steps,
                format: config.kv_events_format,
            })
            .await
            .context("--kv-events")?,
        ),
        None => None,
    };

    let mut settings = ModelSettings::from_config(&config);
    // A hub name becomes files in the cache first (downloaded if missing; /health shows how
    // far), then loads as a path does. Every served model is fetched before the server is
    // ready, so that a later load on first use reads only the disk.
    let progress = sluice_hub::DownloadProgress::new();
    state.track_download(progress.clone());
    let models = config.models();
    let fetch = async {
        settings.model = hub::resolve(&settings.model, &config.revision, &progress).await?;
        if let Some(draft) = &settings.draft_model {
            let draft = hub::resolve(
                draft,
                &config.revision,
                &sluice_hub::DownloadProgress::new(),
            )
            .await
            .context("the draft model")?;
            settings.draft_model = Some(draft);
        }
        let mut others = Vec::new();
        for choice in models.iter().skip(1) {
            let path = hub::resolve(
                &choice.path,
                &config.revision,
                &sluice_hub::DownloadProgress::new(),
            )
            .await
            .with_context(|| format!("the model {}", choice.name))?;
            others.push(settings.for_other_model(
                path,
                choice,
                config.max_lora_rank,
                config.max_loras,
            ));
        }
        anyhow::Ok(others)
    };
    let fetched = tokio::select! {
        fetched = fetch => fetched,
        signal = signals.recv() => {
            tracing::info!(signal, "shutdown requested while fetching the model");
            server.shutdown(CLOSE_GRACE).await;
            upkeep.abort();
            return Ok(());
        }
    };
    let others = match fetched {
        Ok(others) => others,
        Err(e) => {
            server.shutdown(CLOSE_GRACE).await;
            return Err(e);
        }
    };
    // The default reloads (after an unload) with its own settings, less the KV-event stream
    // whose publisher is bound to its first engine.
    let mut reload = settings.clone();
    reload.engine.kv_events = false;
    let loading = tokio::task::spawn_blocking(move || load::load(&settings));
    let loaded = tokio::select! {
        loaded = loading => loaded,
        signal = signals.recv() => {
            tracing::info!(signal, "shutdown requested while loading the model");
            server.shutdown(CLOSE_GRACE).await;
            upkeep.abort();
            return Ok(());
        }
    };
    let loaded = match loaded {
        Ok(Ok(loaded)) => loaded,
        Ok(Err(e)) => {
            server.shutdown(CLOSE_GRACE).await;
            return Err(e);
        }
        Err(e) => {
            server.shutdown(CLOSE_GRACE).await;
            anyhow::bail!("model loading panicked: {e}");
        }
    };
    let mut engine = loaded.engine;
    // The publisher's task ends by itself when the engine, and with it the event queue, goes.
    if let Some(publisher) = kv_events {
        let Some(batches) = engine.take_kv_events() else {
            anyhow::bail!("--kv-events: the engine was started without KV events");
        };
        tracing::info!(
            endpoint = %config.kv_events.as_ref().map(|e| e.to_string()).unwrap_or_default(),
            bound = ?publisher.pub_addr(),
            replay = ?publisher.replay_addr(),
            topic = %config.kv_events_topic,
            "publishing KV-cache events"
        );
        // Where the KV cache lives: the `cuda` build keeps it on the GPU.
        let medium = if cfg!(feature = "cuda") {
            Medium::Gpu
        } else {
            Medium::Cpu
        };
        publisher.start(batches, config.block_size, medium);
    }
    let name = loaded.model.name.clone();
    // The other models load on first use, each with the default's settings and its own
    // engine; model 0 is the default, already loaded.
    let names: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
    // Which model each configured adapter belongs to, so that a request naming one loads it.
    let adapters: Vec<(String, usize)> = models
        .iter()
        .enumerate()
        .flat_map(|(i, m)| {
            m.lora_modules
                .iter()
                .map(move |(name, _)| (name.clone(), i))
        })
        .collect();
    let all: Vec<ModelSettings> = std::iter::once(reload).chain(others).collect();
    let loader: Loader = Arc::new(move |i: usize| {
        let loaded = load::load(&all[i])?;
        Ok((loaded.model, loaded.engine))
    });
    let registry = Arc::new(ModelRegistry::new(
        names.clone(),
        adapters,
        loader,
        config.max_loaded_models,
    ));
    registry.insert(0, loaded.model, Some(engine));
    state.set_models(registry.clone());
    tracing::info!(
        address = %server.local_addr(),
        model = %name,
        served = ?names,
        max_loaded_models = config.max_loaded_models,
        "ready"
    );
    if let Some(ready) = ready {
        // A caller that stopped waiting has nothing to hear.
        let _ = ready.send(server.local_addr());
    }

    let signal = signals.recv().await;
    tracing::info!(
        signal,
        in_flight = state.in_flight(),
        timeout_secs = config.drain_timeout_secs,
        "draining: refusing new requests, finishing those in flight"
    );
    state.begin_drain();
    registry.begin_drain();
    let drained = shutdown::drain(
        &state,
        || registry.in_flight(),
        config.drain_timeout(),
        &mut signals,
    )
    .await;
    match drained {
        Drained::Idle => tracing::info!("all requests finished"),
        Drained::TimedOut => tracing::warn!("drain timeout passed; aborting what is left"),
        Drained::Interrupted => tracing::warn!("second signal; aborting what is left"),
    }
    // Anything still running is aborted here: its streams end with finish_reason "abort".
    let aborted = tokio::task::spawn_blocking(move || registry.shutdown())
        .await
        .context("the engines' shutdown panicked")?;
    if aborted > 0 {
        tracing::warn!(aborted, "sequences aborted at shutdown");
    }
    server.shutdown(CLOSE_GRACE).await;
    upkeep.abort();
    tracing::info!("stopped");
    Ok(())
}
