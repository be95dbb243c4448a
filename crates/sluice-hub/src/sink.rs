//! The disk side of a download: a thread that hashes and writes the chunks the network side
//! hands it, so that receiving, hashing and writing overlap (on one thread they took turns,
//! and a download ran at 0.63x curl's rate on the same file).

use std::fs::File;
use std::io::{BufWriter, Write};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

/// Chunks in flight between the two sides (each one network read, some KiB to 1 MiB).
const QUEUE: usize = 64;
/// Bytes written to disk at a time.
const WRITE_BUFFER: usize = 1 << 20;

/// Bytes written between two background flushes to disk.
const SYNC_EVERY: u64 = 32 << 20;

/// Flushes the file to disk in the background as it grows, so that the flush the blob needs
/// before it enters the cache finds little left to write (one flush at the end cost ~0.1 s a
/// 100 MB file here, 20% of the download's time).
#[derive(Default)]
struct Syncer {
    since: u64,
    running: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Syncer {
    fn wrote(&mut self, file: &File, bytes: u64) {
        self.since += bytes;
        if self.since < SYNC_EVERY || self.running.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        // A failed background flush is reported by the last one, which covers the same bytes.
        let _ = self.wait();
        if let Ok(file) = file.try_clone() {
            self.since = 0;
            self.running = Some(std::thread::spawn(move || file.sync_data()));
        }
    }

    fn wait(&mut self) -> std::io::Result<()> {
        match self.running.take() {
            Some(t) => t.join().unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

/// What the writer ends with: the hash over every byte the file holds, and the bytes it
/// wrote this time; or the write that failed.
pub(crate) type Written = std::io::Result<(Sha256, u64)>;

pub(crate) struct Sink {
    chunks: mpsc::Sender<Bytes>,
    done: oneshot::Receiver<Written>,
}

impl Sink {
    /// Appends to `file`, continuing `hasher` (which has seen what `file` already holds).
    pub(crate) fn start(file: File, mut hasher: Sha256) -> Self {
        let (chunks, mut rx) = mpsc::channel::<Bytes>(QUEUE);
        let (tx, done) = oneshot::channel();
        std::thread::Builder::new()
            .name("sluice-download".into())
            .spawn(move || {
                let mut out = BufWriter::with_capacity(WRITE_BUFFER, file);
                let mut written = 0u64;
                let mut syncer = Syncer::default();
                let result = (|| {
                    while let Some(chunk) = rx.blocking_recv() {
                        hasher.update(&chunk);
                        out.write_all(&chunk)?;
                        written += chunk.len() as u64;
                        syncer.wrote(out.get_ref(), chunk.len() as u64);
                    }
                    out.flush()?;
                    syncer.wait()?;
                    // On disk before the blob is renamed into the cache: a crash must not leave
                    // a short file under a checked name (which nothing would check again).
                    out.get_ref().sync_data()
                })();
                let _ = tx.send(result.map(|()| (hasher, written)));
            })
            .expect("cannot start the download's writer thread");
        Self { chunks, done }
    }

    /// Hands a chunk to the writer; `false` when the writer has stopped (its error comes from
    /// [`Sink::finish`]).
    pub(crate) async fn push(&self, chunk: Bytes) -> bool {
        self.chunks.send(chunk).await.is_ok()
    }

    /// Waits for every chunk to be written.
    pub(crate) async fn finish(self) -> Written {
        drop(self.chunks);
        self.done
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the writer thread died")))
    }
}
