//! How far a download has come: counted by the transfer, read by whoever reports it (a bar on
//! a terminal, a log line every few seconds otherwise, `/health`'s body while the server
//! loads).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Shared between the transfer and its readers; cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct DownloadProgress {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Bytes of every file to fetch, and of those already in the cache or fetched.
    bytes_total: AtomicU64,
    bytes_done: AtomicU64,
    /// Bytes this process moved (what the rate counts: not what the cache already held).
    bytes_moved: AtomicU64,
    files_total: AtomicU64,
    files_done: AtomicU64,
    finished: AtomicBool,
    /// Wakes the reporter at once when the download ends.
    done: tokio::sync::Notify,
    labels: Mutex<Labels>,
}

#[derive(Debug, Default)]
struct Labels {
    repo: String,
    file: String,
    started: Option<Instant>,
}

/// What a reader sees at one moment.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProgressSnapshot {
    pub repo: String,
    pub file: String,
    pub files_done: u64,
    pub files_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub bytes_per_second: u64,
    /// `None` until a rate is known.
    pub eta_seconds: Option<u64>,
    pub finished: bool,
}

impl DownloadProgress {
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn begin(&self, repo: &str, files: u64, bytes: u64) {
        let mut labels = self.inner.labels.lock().unwrap();
        labels.repo = repo.to_string();
        labels.started = Some(Instant::now());
        self.inner.files_total.store(files, Ordering::Relaxed);
        self.inner.bytes_total.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn file(&self, name: &str) {
        self.inner.labels.lock().unwrap().file = name.to_string();
    }

    /// `bytes` of the current file were already on disk (cached, or a partial download).
    pub(crate) fn had(&self, bytes: u64) {
        self.inner.bytes_done.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn moved(&self, bytes: u64) {
        self.inner.bytes_done.fetch_add(bytes, Ordering::Relaxed);
        self.inner.bytes_moved.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A failed attempt's bytes are fetched again: take them back.
    pub(crate) fn lost(&self, bytes: u64) {
        self.inner.bytes_done.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub(crate) fn file_done(&self) {
        self.inner.files_done.fetch_add(1, Ordering::Relaxed);
    }

    /// Ends the reporting (done, or given up).
    pub fn finish(&self) {
        self.inner.finished.store(true, Ordering::Release);
        self.inner.done.notify_waiters();
    }

    /// Sleeps `period`, or less if the download ends meanwhile.
    async fn wait(&self, period: Duration) {
        let done = self.inner.done.notified();
        if self.inner.finished.load(Ordering::Acquire) {
            return;
        }
        let _ = tokio::time::timeout(period, done).await;
    }

    pub fn snapshot(&self) -> ProgressSnapshot {
        let labels = self.inner.labels.lock().unwrap();
        let elapsed = labels.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
        let moved = self.inner.bytes_moved.load(Ordering::Relaxed);
        let done = self.inner.bytes_done.load(Ordering::Relaxed);
        let total = self.inner.bytes_total.load(Ordering::Relaxed);
        let rate = if elapsed > 0.0 {
            (moved as f64 / elapsed) as u64
        } else {
            0
        };
        ProgressSnapshot {
            repo: labels.repo.clone(),
            file: labels.file.clone(),
            files_done: self.inner.files_done.load(Ordering::Relaxed),
            files_total: self.inner.files_total.load(Ordering::Relaxed),
            bytes_done: done,
            bytes_total: total,
            bytes_per_second: rate,
            eta_seconds: (rate > 0).then(|| total.saturating_sub(done) / rate),
            finished: self.inner.finished.load(Ordering::Acquire),
        }
    }

    /// Reports the download until it finishes: a bar when stderr is a terminal, else a log
    /// line every `log_every`. Run it beside the download; it ends by itself.
    pub async fn report(self, log_every: Duration) {
        if std::io::stderr().is_terminal() {
            self.draw_bar().await
        } else {
            self.log_lines(log_every).await
        }
    }

    async fn draw_bar(self) {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        loop {
            let s = self.snapshot();
            bar.set_length(s.bytes_total);
            bar.set_position(s.bytes_done);
            bar.set_message(format!("{} {}", s.repo, s.file));
            if s.finished {
                bar.finish();
                return;
            }
            self.wait(Duration::from_millis(100)).await;
        }
    }

    async fn log_lines(self, every: Duration) {
        let mut last = Instant::now();
        loop {
            self.wait(every.saturating_sub(last.elapsed())).await;
            let s = self.snapshot();
            if s.finished {
                return;
            }
            if last.elapsed() < every {
                continue;
            }
            last = Instant::now();
            tracing::info!(
                repo = %s.repo,
                file = %s.file,
                files = format!("{}/{}", s.files_done, s.files_total),
                mib_done = s.bytes_done >> 20,
                mib_total = s.bytes_total >> 20,
                mib_per_second = format!("{:.1}", s.bytes_per_second as f64 / (1 << 20) as f64),
                eta_seconds = s.eta_seconds,
                "downloading"
            );
        }
    }
}
