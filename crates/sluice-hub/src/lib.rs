//! Models by Hugging Face hub name: `ORG/NAME[:QUANT]` resolved to the files a load needs,
//! fetched into the cache `huggingface_hub` shares (so either fills it for the other), resumed
//! after an interruption, checked against the hub's sha256 before use; `HF_HUB_OFFLINE=1`
//! serves from the cache alone.
//!
//! Why not hf-hub's transfer: its 0.5 download (the version this is written against) moves a
//! file into the snapshot before anything could check its sha256, sends the token to the CDN
//! host in its metadata request when the hub redirects there, and reads neither `HF_TOKEN`,
//! `HF_HUB_CACHE` nor `HF_HUB_OFFLINE`. We keep its naming of the cache (`Repo::folder_name`)
//! and do the transfer on reqwest ourselves: [`download`].

mod cache;
mod download;
mod error;
mod listing;
mod name;
mod progress;
mod select;
mod settings;
mod sink;

use std::path::PathBuf;

use reqwest::header::AUTHORIZATION;
use reqwest::StatusCode;

pub use cache::{cached_repos, CachedRepo, RepoCache};
pub use error::{HubError, Result};
pub use listing::{RepoFile, RepoListing};
pub use name::{HubName, ModelRef};
pub use progress::{DownloadProgress, ProgressSnapshot};
pub use select::{select, Selection, DEFAULT_QUANT};
pub use settings::{HubSettings, DEFAULT_ENDPOINT};

/// The revision a name resolves at unless `--revision` says otherwise.
pub const DEFAULT_REVISION: &str = "main";

/// A hub name made into files on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub name: HubName,
    pub commit: String,
    /// What the loader opens: the GGUF file (its first shard) or the snapshot folder.
    pub path: PathBuf,
    /// Every file the load reads.
    pub files: Vec<PathBuf>,
}

/// The client: one per process is enough.
pub struct Hub {
    settings: HubSettings,
    client: reqwest::Client,
}

impl Hub {
    pub fn new(settings: HubSettings) -> Result<Self> {
        let client = reqwest::Client::builder()
            // Redirects are followed by hand, so the token never leaves the hub's address.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|source| HubError::Unreachable {
                endpoint: settings.endpoint.clone(),
                source,
            })?;
        Ok(Self { settings, client })
    }

    pub fn settings(&self) -> &HubSettings {
        &self.settings
    }

    /// The files `name` asks for at `revision`, downloaded unless the cache holds them; from
    /// the cache alone when offline, or (with a warning) when the hub cannot be reached.
    /// `progress` is finished when this returns, whatever the outcome.
    pub async fn resolve(
        &self,
        name: &HubName,
        revision: &str,
        progress: &DownloadProgress,
    ) -> Result<Resolved> {
        let resolved = self.resolve_unfinished(name, revision, progress).await;
        progress.finish();
        resolved
    }

    async fn resolve_unfinished(
        &self,
        name: &HubName,
        revision: &str,
        progress: &DownloadProgress,
    ) -> Result<Resolved> {
        if self.settings.offline {
            return self.resolve_cached(name, revision);
        }
        let listing = match self.listing(name, revision).await {
            Ok(l) => l,
            Err(HubError::Unreachable { endpoint, source }) => {
                return match self.resolve_cached(name, revision) {
                    Ok(r) => {
                        tracing::warn!(%endpoint, error = %source, model = %name, "the hub cannot be reached; serving the cached snapshot");
                        Ok(r)
                    }
                    Err(_) => Err(HubError::Unreachable { endpoint, source }),
                };
            }
            Err(e) => return Err(e),
        };
        let names: Vec<&str> = listing.files.iter().map(|f| f.name.as_str()).collect();
        let selection = select(&name.repo, &names, name.quant.as_deref())?;
        let files: Vec<&RepoFile> = selection
            .files
            .iter()
            .filter_map(|f| listing.file(f))
            .collect();
        let cache = RepoCache::new(&self.settings.cache_dir, name);
        let bytes = files.iter().map(|f| f.size.unwrap_or(0)).sum();
        progress.begin(&name.to_string(), files.len() as u64, bytes);
        let mut paths = Vec::with_capacity(files.len());
        for file in files {
            paths.push(
                self.ensure_file(&cache, &name.repo, &listing.commit, file, progress)
                    .await?,
            );
        }
        cache.set_ref(revision, &listing.commit)?;
        Ok(Resolved {
            name: name.clone(),
            path: entry_path(&cache, &listing.commit, &selection),
            commit: listing.commit,
            files: paths,
        })
    }

    /// From the cache alone: the snapshot `revision` last resolved to, and in it the files
    /// `name` asks for, all present.
    pub fn resolve_cached(&self, name: &HubName, revision: &str) -> Result<Resolved> {
        let cache = RepoCache::new(&self.settings.cache_dir, name);
        let not_cached = |what: String| HubError::NotCached {
            cache: self.settings.cache_dir.clone(),
            what,
        };
        let commit = cache
            .commit_of(revision)
            .ok_or_else(|| not_cached(format!("snapshot of {} at {revision}", name.repo)))?;
        let held = cache.snapshot_files(&commit);
        let held: Vec<&str> = held.iter().map(String::as_str).collect();
        let selection = select(&name.repo, &held, name.quant.as_deref())
            .map_err(|e| not_cached(format!("{name} (what it holds: {e})")))?;
        let files = selection
            .files
            .iter()
            .map(|f| {
                cache
                    .cached_file(&commit, f)
                    .ok_or_else(|| not_cached(format!("{f} of {name}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Resolved {
            name: name.clone(),
            path: entry_path(&cache, &commit, &selection),
            commit,
            files,
        })
    }

    /// The repository's files at `revision`, each name checked.
    pub async fn listing(&self, name: &HubName, revision: &str) -> Result<RepoListing> {
        let url = format!(
            "{}/api/models/{}/revision/{}",
            self.settings.endpoint,
            name.repo,
            revision.replace('/', "%2F")
        );
        let mut request = self.client.get(&url).query(&[("blobs", "true")]);
        if let Some(token) = &self.settings.token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let unreachable = |source| HubError::Unreachable {
            endpoint: self.settings.endpoint.clone(),
            source,
        };
        let response = request.send().await.map_err(unreachable)?;
        match response.status() {
            s if s.is_success() => {}
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(HubError::Unauthorized {
                    endpoint: self.settings.endpoint.clone(),
                    repo: name.repo.clone(),
                    status: response.status().as_u16(),
                    token_sent: self.settings.token.is_some(),
                })
            }
            StatusCode::NOT_FOUND => {
                return Err(HubError::NotFound {
                    endpoint: self.settings.endpoint.clone(),
                    repo: name.repo.clone(),
                    revision: revision.to_string(),
                })
            }
            s => {
                return Err(HubError::Status {
                    endpoint: self.settings.endpoint.clone(),
                    what: format!("the file listing of {}", name.repo),
                    status: s.as_u16(),
                })
            }
        }
        let body = response.text().await.map_err(unreachable)?;
        RepoListing::from_api_json(&name.repo, &body)
    }
}

fn entry_path(cache: &RepoCache, commit: &str, selection: &Selection) -> PathBuf {
    let snapshot = cache.snapshot(commit);
    match &selection.entry {
        Some(file) => snapshot.join(file),
        None => snapshot,
    }
}
