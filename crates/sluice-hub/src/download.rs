//! One file from the hub into the cache: resumed from a partial download's size by a range
//! request, retried when the connection drops, checked against the sha256 the listing gives
//! before it enters the snapshot, and never sent our token beyond the hub's own address.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::header::{HeaderMap, AUTHORIZATION, CONTENT_RANGE, ETAG, LOCATION, RANGE};
use reqwest::{StatusCode, Url};
use sha2::{Digest, Sha256};

use crate::cache::RepoCache;
use crate::error::{HubError, Result};
use crate::listing::RepoFile;
use crate::progress::DownloadProgress;
use crate::sink::Sink;
use crate::Hub;

/// Attempts a file gets when its connection drops, each resuming where the last stopped.
const ATTEMPTS: usize = 5;
/// Bytes read at a time from a partial download being hashed.
const READ_BUFFER: usize = 1 << 20;
/// Redirects followed (the hub sends LFS files to its CDN).
const MAX_REDIRECTS: usize = 10;

/// What the hub says of a file before its bytes.
struct FileAnswer {
    response: reqwest::Response,
    etag: Option<String>,
}

impl Hub {
    /// `file` of `commit` in the snapshot, fetched unless the cache holds it.
    pub(crate) async fn ensure_file(
        &self,
        cache: &RepoCache,
        repo: &str,
        commit: &str,
        file: &RepoFile,
        progress: &DownloadProgress,
    ) -> Result<PathBuf> {
        progress.file(&file.name);
        if let Some(path) = cache.cached_file(commit, &file.name) {
            progress.had(file.size.unwrap_or(0));
            progress.file_done();
            return Ok(path);
        }
        // An LFS blob another revision already fetched needs only its link.
        if let Some(sha) = &file.sha256 {
            if cache.blob(sha).is_file() {
                progress.had(file.size.unwrap_or(0));
                progress.file_done();
                return cache.link(commit, &file.name, sha);
            }
        }
        let url = format!(
            "{}/{repo}/resolve/{commit}/{}",
            self.settings.endpoint, file.name
        );
        let mut last_error = String::new();
        let mut attempt_bytes = 0;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                progress.lost(attempt_bytes);
                tracing::warn!(
                    repo,
                    file = %file.name,
                    attempt,
                    error = %last_error,
                    "the download stopped; resuming"
                );
                tokio::time::sleep(Duration::from_millis(250 << attempt.min(4))).await;
            }
            match self.fetch(cache, repo, commit, file, &url, progress).await {
                Ok(path) => {
                    progress.file_done();
                    return Ok(path);
                }
                Err(Fetch::Retry { error, bytes }) => {
                    last_error = error;
                    attempt_bytes = bytes;
                }
                Err(Fetch::Fatal(e)) => return Err(e),
            }
        }
        Err(HubError::Interrupted {
            repo: repo.to_string(),
            file: file.name.clone(),
            attempts: ATTEMPTS,
            last: last_error,
        })
    }

    /// One attempt: resume the partial blob, check it, move it into the snapshot.
    async fn fetch(
        &self,
        cache: &RepoCache,
        repo: &str,
        commit: &str,
        file: &RepoFile,
        url: &str,
        progress: &DownloadProgress,
    ) -> std::result::Result<PathBuf, Fetch> {
        // An LFS blob is named by its sha256, known before any byte; a file kept in git by the
        // etag its answer gives (such files are small: one fetched in part starts over).
        let (etag, git_answer) = match &file.sha256 {
            Some(sha) => (sha.clone(), None),
            None => {
                let answer = self.answer(url, 0).await?;
                let etag = answer.etag.clone().ok_or_else(|| HubError::BadAnswer {
                    what: format!("{} of {repo}", file.name),
                    reason: "no ETag".into(),
                })?;
                (etag, Some(answer))
            }
        };
        let nameable = !etag.is_empty()
            && etag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !nameable {
            return Err(Fetch::Fatal(HubError::BadAnswer {
                what: format!("{} of {repo}", file.name),
                reason: format!("the etag {etag:?} cannot name a file"),
            }));
        }
        let lock_path = cache.lock(&etag);
        let _lock = lock(&lock_path).await?;
        // Another process may have finished it while we waited for the lock.
        if cache.blob(&etag).is_file() {
            progress.had(file.size.unwrap_or(0));
            return Ok(cache.link(commit, &file.name, &etag)?);
        }
        let part = cache.incomplete(&etag);
        let parent = part.parent().expect("a blob has a folder");
        std::fs::create_dir_all(parent)
            .map_err(HubError::io("cannot create the blobs folder", parent))?;
        // What is on disk already is hashed first, so the check covers the whole file.
        let mut hasher = Sha256::new();
        let (mut have, response) = match git_answer {
            Some(answer) => (0, answer.response),
            None => {
                let have = hash_existing(&part, &mut hasher)?;
                (have, self.answer(url, have).await?.response)
            }
        };
        progress.had(have);
        let status = response.status();
        let total = match status {
            StatusCode::PARTIAL_CONTENT => total_of_range(response.headers()),
            StatusCode::RANGE_NOT_SATISFIABLE if Some(have) == file.size => Some(have),
            StatusCode::OK => {
                // The server ignored the range: start over.
                if have > 0 {
                    progress.lost(have);
                    hasher = Sha256::new();
                    have = 0;
                }
                response.content_length()
            }
            s => {
                return Err(Fetch::Fatal(HubError::Status {
                    endpoint: self.settings.endpoint.clone(),
                    what: format!("{} of {repo}", file.name),
                    status: s.as_u16(),
                }))
            }
        }
        .or(file.size);
        let out = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(have == 0)
            .append(have > 0)
            .open(&part)
            .map_err(HubError::io("cannot write the download", &part))?;
        let sink = Sink::start(out, hasher);
        let mut received = 0u64;
        let mut dropped = None;
        if status != StatusCode::RANGE_NOT_SATISFIABLE {
            let mut stream = response.bytes_stream();
            while let Some(chunk) = stream.next().await {
                match chunk {
                    Ok(chunk) => {
                        received += chunk.len() as u64;
                        progress.moved(chunk.len() as u64);
                        if !sink.push(chunk).await {
                            break;
                        }
                    }
                    Err(e) => {
                        dropped = Some(e.to_string());
                        break;
                    }
                }
            }
        }
        let (hasher, written) = sink
            .finish()
            .await
            .map_err(HubError::io("cannot write the download", &part))?;
        debug_assert_eq!(written, received);
        let got = have + written;
        if let Some(error) = dropped {
            return Err(Fetch::Retry { error, bytes: got });
        }
        if let Some(total) = total.filter(|&t| got < t) {
            return Err(Fetch::Retry {
                error: format!("the connection closed at byte {got} of {total}"),
                bytes: got,
            });
        }
        if let Some(want) = &file.sha256 {
            let digest = hex(&hasher.finalize());
            if &digest != want {
                let _ = std::fs::remove_file(&part);
                return Err(Fetch::Fatal(HubError::ChecksumMismatch {
                    repo: repo.to_string(),
                    file: file.name.clone(),
                    want: want.clone(),
                    got: digest,
                }));
            }
        }
        let blob = cache.blob(&etag);
        std::fs::rename(&part, &blob)
            .map_err(HubError::io(
                "cannot move the download into the cache",
                &blob,
            ))
            .map_err(Fetch::Fatal)?;
        cache.link(commit, &file.name, &etag).map_err(Fetch::Fatal)
    }

    /// GETs `url` from `from` on (or whole), following redirects by hand: the token goes
    /// only to the hub's own address (huggingface_hub does the same: a CDN's signed address
    /// needs none, and must not see it).
    async fn answer(&self, url: &str, from: u64) -> std::result::Result<FileAnswer, Fetch> {
        let mut url = Url::parse(url).map_err(|e| {
            Fetch::Fatal(HubError::BadAnswer {
                what: url.to_string(),
                reason: e.to_string(),
            })
        })?;
        let mut etag = None;
        for _ in 0..MAX_REDIRECTS {
            let mut request = self.client.get(url.clone());
            if from > 0 {
                request = request.header(RANGE, format!("bytes={from}-"));
            }
            if let (Some(token), true) = (&self.settings.token, self.is_hub(&url)) {
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            let response = request.send().await.map_err(|e| Fetch::Retry {
                error: e.to_string(),
                bytes: 0,
            })?;
            let headers = response.headers();
            if etag.is_none() {
                etag = headers
                    .get("x-linked-etag")
                    .or_else(|| headers.get(ETAG))
                    .and_then(|v| v.to_str().ok())
                    .map(clean_etag);
            }
            let status = response.status();
            if status.is_redirection() {
                let location = headers
                    .get(LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| url.join(l).ok())
                    .ok_or_else(|| {
                        Fetch::Fatal(HubError::BadAnswer {
                            what: url.to_string(),
                            reason: "a redirect without a usable Location".into(),
                        })
                    })?;
                url = location;
                continue;
            }
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                return Err(Fetch::Fatal(HubError::Unauthorized {
                    endpoint: self.settings.endpoint.clone(),
                    repo: url.path().to_string(),
                    status: status.as_u16(),
                    token_sent: self.settings.token.is_some(),
                }));
            }
            if status.is_server_error() {
                return Err(Fetch::Retry {
                    error: format!("the server answered {status}"),
                    bytes: 0,
                });
            }
            return Ok(FileAnswer { response, etag });
        }
        Err(Fetch::Fatal(HubError::BadAnswer {
            what: url.to_string(),
            reason: format!("more than {MAX_REDIRECTS} redirects"),
        }))
    }

    fn is_hub(&self, url: &Url) -> bool {
        Url::parse(&self.settings.endpoint).is_ok_and(|hub| hub.origin() == url.origin())
    }
}

enum Fetch {
    /// The connection dropped or the server failed: another attempt resumes.
    Retry {
        error: String,
        bytes: u64,
    },
    Fatal(HubError),
}

impl From<HubError> for Fetch {
    fn from(e: HubError) -> Self {
        Self::Fatal(e)
    }
}

/// `W/"abc"` -> `abc`.
fn clean_etag(v: &str) -> String {
    v.trim_start_matches("W/").trim_matches('"').to_string()
}

/// The whole size of `bytes a-b/TOTAL`.
fn total_of_range(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_RANGE)?
        .to_str()
        .ok()?
        .rsplit('/')
        .next()?
        .parse()
        .ok()
}

/// Feeds the bytes of a partial download to `hasher`; its length (0 when there is none).
fn hash_existing(part: &Path, hasher: &mut Sha256) -> Result<u64> {
    let mut file = match File::open(part) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(HubError::io("cannot read the partial download", part)(e)),
    };
    let mut buf = vec![0u8; READ_BUFFER];
    let mut len = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .map_err(HubError::io("cannot read the partial download", part))?;
        if n == 0 {
            return Ok(len);
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Holds the blob's lock file (huggingface_hub's place for it), so that two processes never
/// append to one partial download; waits for the other to finish.
async fn lock(path: &Path) -> Result<File> {
    let parent = path.parent().expect("a lock has a folder");
    std::fs::create_dir_all(parent)
        .map_err(HubError::io("cannot create the lock folder", parent))?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(HubError::io("cannot open the lock file", path))?;
    let mut waited = Duration::ZERO;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => {
                if waited.is_zero() {
                    tracing::info!(lock = %path.display(), "another process downloads this file; waiting");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                waited += Duration::from_millis(200);
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(HubError::io("cannot lock the download", path)(e))
            }
        }
    }
}
