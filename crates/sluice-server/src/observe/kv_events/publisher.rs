//! The ZMQ side of KV events: a PUB socket that fans every batch out to its subscribers, and an
//! optional ROUTER socket that replays recent batches, as vLLM's `ZmqEventPublisher` does.
//!
//! Nothing here can hold up the engine: the engine thread hands batches over a bounded queue
//! it never waits on ([`sluice_engine::KvEventSender`]); this task encodes each batch once and
//! offers it to every subscriber's own send queue of `hwm` messages, and a subscriber whose
//! queue is full (slow, or stuck) loses that batch, counted in
//! `sluice_kv_events_dropped_total{reason="subscriber"}`. The sequence numbers show it the gap,
//! and the replay socket, or `GET /debug/kv_cache`, fills it.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use metrics::{counter, describe_gauge, gauge, Counter, Gauge};
use sluice_engine::metrics::KV_EVENTS_DROPPED;
use sluice_engine::KvEventBatch;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::wire::{encode_batch, EventFormat, Medium};
use super::zmtp::{self, handshake, put_command, put_message, read_frame, read_message};
use super::{EndpointMode, ZmqEndpoint};

pub const SUBSCRIBERS: &str = "sluice_kv_events_subscribers";

/// The sequence number of replay's end-of-replay message: -1 as a signed 8-byte integer.
const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

/// A peer has this long to finish the ZMTP handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the connecting PUB waits between attempts to reach its subscriber.
const RECONNECT_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct PublisherSettings {
    pub endpoint: ZmqEndpoint,
    pub replay: Option<ZmqEndpoint>,
    pub topic: String,
    /// Messages each subscriber's send queue holds (ZMQ's high-water mark).
    pub hwm: usize,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// How each event is laid out.
    pub format: EventFormat,
}

#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    #[error("cannot bind {endpoint}: {source}")]
    Bind {
        endpoint: ZmqEndpoint,
        source: io::Error,
    },
    #[error("the replay endpoint {0} must bind (tcp://*:PORT): subscribers connect to it")]
    ReplayMustBind(ZmqEndpoint),
}

/// The publisher's sockets, bound at start so that a bad endpoint fails the start.
pub struct KvEventPublisher {
    settings: PublisherSettings,
    pub_listener: Option<TcpListener>,
    replay_listener: Option<TcpListener>,
}

impl KvEventPublisher {
    pub async fn bind(settings: PublisherSettings) -> Result<Self, PublisherError> {
        let bind = |endpoint: &ZmqEndpoint| {
            let endpoint = endpoint.clone();
            async move {
                TcpListener::bind((endpoint.host(), endpoint.port()))
                    .await
                    .map_err(|source| PublisherError::Bind { endpoint, source })
            }
        };
        let pub_listener = match settings.endpoint.mode() {
            EndpointMode::Bind => Some(bind(&settings.endpoint).await?),
            EndpointMode::Connect => None,
        };
        let replay_listener = match &settings.replay {
            Some(r) if r.mode() == EndpointMode::Bind => Some(bind(r).await?),
            Some(r) => return Err(PublisherError::ReplayMustBind(r.clone())),
            None => None,
        };
        Ok(Self {
            settings,
            pub_listener,
            replay_listener,
        })
    }

    /// The PUB socket's address when it binds (its port, when the endpoint said 0).
    pub fn pub_addr(&self) -> Option<SocketAddr> {
        self.pub_listener.as_ref()?.local_addr().ok()
    }

    pub fn replay_addr(&self) -> Option<SocketAddr> {
        self.replay_listener.as_ref()?.local_addr().ok()
    }

    /// Publishes `batches` until the engine closes the queue.
    pub fn start(
        self,
        mut batches: mpsc::Receiver<KvEventBatch>,
        block_size: usize,
        medium: Medium,
    ) -> JoinHandle<()> {
        describe_gauge!(
            SUBSCRIBERS,
            "Subscribers connected to the KV-event PUB socket."
        );
        let hub = Arc::new(Hub {
            subscribers: Mutex::new(Vec::new()),
            history: Mutex::new(VecDeque::with_capacity(
                self.settings.buffer_steps.min(1024),
            )),
            topic: self.settings.topic.clone().into_bytes(),
            hwm: self.settings.hwm,
            buffer_steps: self.settings.buffer_steps,
            next_subscriber: AtomicU64::new(0),
            dropped: counter!(KV_EVENTS_DROPPED, "reason" => "subscriber"),
            subscriber_gauge: gauge!(SUBSCRIBERS),
        });
        let mut tasks = Vec::new();
        match self.pub_listener {
            Some(listener) => tasks.push(tokio::spawn(accept_subscribers(hub.clone(), listener))),
            None => tasks.push(tokio::spawn(connect_to_subscriber(
                hub.clone(),
                self.settings.endpoint.clone(),
            ))),
        }
        if let Some(listener) = self.replay_listener {
            tasks.push(tokio::spawn(accept_replays(hub.clone(), listener)));
        }
        let format = self.settings.format;
        tokio::spawn(async move {
            while let Some(batch) = batches.recv().await {
                let payload: Arc<[u8]> = encode_batch(&batch, block_size, medium, format).into();
                hub.publish(batch.seq, payload);
            }
            for task in tasks {
                task.abort();
            }
        })
    }
}

/// A subscriber's send queue, and its id to leave the list by.
struct SubscriberQueue {
    id: u64,
    tx: mpsc::Sender<Arc<Vec<u8>>>,
}

struct Hub {
    subscribers: Mutex<Vec<SubscriberQueue>>,
    /// `(sequence number, payload)` of the last `buffer_steps` batches, oldest first.
    history: Mutex<VecDeque<(u64, Arc<[u8]>)>>,
    topic: Vec<u8>,
    hwm: usize,
    buffer_steps: usize,
    next_subscriber: AtomicU64,
    dropped: Counter,
    subscriber_gauge: Gauge,
}

/// Locks a mutex whose data stays consistent even if a holder panicked (every critical
/// section here is a push, a pop or a scan).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Hub {
    fn publish(&self, seq: u64, payload: Arc<[u8]>) {
        let mut wire = Vec::with_capacity(self.topic.len() + payload.len() + 32);
        put_message(&mut wire, &[&self.topic, &seq.to_be_bytes(), &payload]);
        let wire = Arc::new(wire);
        {
            let mut subscribers = lock(&self.subscribers);
            subscribers.retain(|s| match s.tx.try_send(wire.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    self.dropped.increment(1);
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
            self.subscriber_gauge.set(subscribers.len() as f64);
        }
        let mut history = lock(&self.history);
        if history.len() == self.buffer_steps {
            history.pop_front();
        }
        if self.buffer_steps > 0 {
            history.push_back((seq, payload));
        }
    }

    fn add_subscriber(&self) -> (u64, mpsc::Receiver<Arc<Vec<u8>>>) {
        let (tx, rx) = mpsc::channel(self.hwm);
        let id = self.next_subscriber.fetch_add(1, Ordering::Relaxed);
        let mut subscribers = lock(&self.subscribers);
        subscribers.push(SubscriberQueue { id, tx });
        self.subscriber_gauge.set(subscribers.len() as f64);
        (id, rx)
    }

    fn remove_subscriber(&self, id: u64) {
        let mut subscribers = lock(&self.subscribers);
        subscribers.retain(|s| s.id != id);
        self.subscriber_gauge.set(subscribers.len() as f64);
    }

    /// The buffered batches numbered `start` or later.
    fn since(&self, start: u64) -> Vec<(u64, Arc<[u8]>)> {
        lock(&self.history)
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect()
    }
}

async fn accept_subscribers(hub: Arc<Hub>, listener: TcpListener) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: wait rather than spin.
                tracing::warn!(error = %e, "KV events: accept failed");
                tokio::time::sleep(RECONNECT_INTERVAL).await;
                continue;
            }
        };
        let hub = hub.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_subscriber(&hub, stream).await {
                tracing::debug!(%peer, error = %e, "KV events: subscriber left");
            }
        });
    }
}

/// The connecting side of vLLM's PUB (an endpoint without a wildcard): one subscriber that
/// binds, reached again whenever the connection drops.
async fn connect_to_subscriber(hub: Arc<Hub>, endpoint: ZmqEndpoint) {
    let mut warned = false;
    loop {
        match TcpStream::connect((endpoint.host(), endpoint.port())).await {
            Ok(stream) => {
                warned = false;
                tracing::info!(%endpoint, "KV events: connected to the subscriber");
                if let Err(e) = serve_subscriber(&hub, stream).await {
                    tracing::info!(%endpoint, error = %e, "KV events: subscriber connection ended");
                }
            }
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(%endpoint, error = %e, "KV events: cannot reach the subscriber; retrying every second");
            }
            Err(_) => {}
        }
        tokio::time::sleep(RECONNECT_INTERVAL).await;
    }
}

/// Sets up a new connection: no Nagle delay (messages are small and should leave at once),
/// then the ZMTP handshake as `socket_type`, within [`HANDSHAKE_TIMEOUT`].
async fn greet(stream: &mut TcpStream, socket_type: &str, peer_types: &[&str]) -> io::Result<()> {
    stream.set_nodelay(true)?;
    tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        handshake(stream, socket_type, peer_types),
    )
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "handshake timed out"))??;
    Ok(())
}

/// One subscriber, after the handshake: its subscriptions come in (3.0's subscribe messages
/// or 3.1's SUBSCRIBE/CANCEL commands), its queue's messages go out when a subscription
/// matches their topic. Returns when the peer goes away.
async fn serve_subscriber(hub: &Hub, mut stream: TcpStream) -> io::Result<()> {
    greet(&mut stream, "PUB", &["SUB", "XSUB"]).await?;
    let (mut reader, mut writer) = stream.into_split();
    let subscriptions: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
    let (pong_tx, mut pong_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let (id, mut queue) = hub.add_subscriber();
    let read = async {
        loop {
            let frame = read_frame(&mut reader).await?;
            let (subscribe, topic) = match frame.command() {
                Some((b"SUBSCRIBE", topic)) => (true, topic),
                Some((b"CANCEL", topic)) => (false, topic),
                Some((b"PING", data)) => {
                    // PING: a 2-byte TTL, then up to 16 bytes of context the PONG echoes.
                    let context = data.get(2..).unwrap_or_default();
                    let mut pong = Vec::new();
                    put_command(&mut pong, b"PONG", context);
                    let _ = pong_tx.send(pong);
                    continue;
                }
                Some(_) => continue,
                None => match frame.body.split_first() {
                    Some((1, topic)) => (true, topic),
                    Some((0, topic)) => (false, topic),
                    _ => continue,
                },
            };
            let mut subs = lock(&subscriptions);
            if subscribe {
                subs.push(topic.to_vec());
            } else if let Some(i) = subs.iter().position(|s| s == topic) {
                subs.swap_remove(i);
            }
        }
    };
    let write = async {
        loop {
            tokio::select! {
                message = queue.recv() => {
                    let Some(message) = message else { return Ok(()) };
                    let matches = lock(&subscriptions)
                        .iter()
                        .any(|s| hub.topic.starts_with(s));
                    if matches {
                        writer.write_all(&message).await?;
                    }
                }
                Some(pong) = pong_rx.recv() => writer.write_all(&pong).await?,
            }
        }
    };
    let result: io::Result<()> = tokio::select! {
        r = read => r,
        r = write => r,
    };
    hub.remove_subscriber(id);
    result
}

async fn accept_replays(hub: Arc<Hub>, listener: TcpListener) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(RECONNECT_INTERVAL).await;
            continue;
        };
        let hub = hub.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_replays(&hub, stream).await {
                tracing::debug!(%peer, error = %e, "KV events: replay client left");
            }
        });
    }
}

/// vLLM's replay protocol on a ROUTER socket: a request's last frame is the first sequence
/// number wanted (8 bytes, big-endian); the answer is one message `[seq, payload]` per buffered
/// batch from there on, then `[-1, ""]`, each behind the request's envelope (the empty
/// delimiter a REQ or DEALER peer sent before it).
async fn serve_replays(hub: &Hub, mut stream: TcpStream) -> io::Result<()> {
    greet(&mut stream, "ROUTER", &["REQ", "DEALER", "ROUTER"]).await?;
    loop {
        let request = read_message(&mut stream, |_, _| {}).await?;
        let Some((start, envelope)) = request.split_last() else {
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_slice()) else {
            tracing::debug!(
                len = start.len(),
                "KV events: replay request without an 8-byte sequence number"
            );
            continue;
        };
        let mut out = Vec::new();
        let reply = |out: &mut Vec<u8>, seq: &[u8], payload: &[u8]| {
            for part in envelope {
                zmtp::put_frame(out, part, true);
            }
            put_message(out, &[seq, payload]);
        };
        for (seq, payload) in hub.since(u64::from_be_bytes(start)) {
            reply(&mut out, &seq.to_be_bytes(), &payload);
            if out.len() > 1 << 20 {
                stream.write_all(&out).await?;
                out.clear();
            }
        }
        reply(&mut out, &END_OF_REPLAY, b"");
        stream.write_all(&out).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(hwm: usize, buffer_steps: usize) -> (Hub, Arc<AtomicU64>) {
        let dropped = Arc::new(AtomicU64::new(0));
        let hub = Hub {
            subscribers: Mutex::new(Vec::new()),
            history: Mutex::new(VecDeque::new()),
            topic: b"kv@pod@model".to_vec(),
            hwm,
            buffer_steps,
            next_subscriber: AtomicU64::new(0),
            dropped: Counter::from_arc(dropped.clone()),
            subscriber_gauge: Gauge::noop(),
        };
        (hub, dropped)
    }

    #[test]
    fn a_full_subscriber_queue_drops_and_counts_without_waiting() {
        let (hub, dropped) = hub(2, 3);
        let (_slow, _slow_rx) = hub.add_subscriber();
        let (_fast, mut fast_rx) = hub.add_subscriber();
        for seq in 0..5 {
            hub.publish(seq, Arc::from(&b"payload"[..]));
            // The fast one reads everything as it comes.
            let wire = fast_rx.try_recv().unwrap();
            assert!(wire.ends_with(b"payload"));
        }
        // The slow one took two (its high-water mark) and lost three.
        assert_eq!(dropped.load(Ordering::Relaxed), 3);
        // The history keeps the last three for replay.
        let seqs: Vec<u64> = hub.since(0).iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, [2, 3, 4]);
        assert_eq!(hub.since(4).len(), 1);
        assert!(hub.since(5).is_empty());
    }

    #[test]
    fn a_subscriber_that_left_is_forgotten() {
        let (hub, dropped) = hub(1, 0);
        let (id, rx) = hub.add_subscriber();
        drop(rx);
        hub.publish(0, Arc::from(&b""[..]));
        assert!(lock(&hub.subscribers).is_empty());
        hub.remove_subscriber(id);
        assert_eq!(dropped.load(Ordering::Relaxed), 0);
        assert!(hub.since(0).is_empty(), "buffer_steps 0 keeps nothing");
    }
}
