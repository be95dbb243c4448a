//! The connection loop: accepts TCP connections and serves the router on each with hyper
//! (HTTP/1.1 and HTTP/2). Our own loop rather than `axum::serve` for two things it does not
//! offer: a deadline on reading request headers (a slow-loris client trickling header bytes
//! would otherwise hold its connection forever), and a bounded graceful shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running server; [`HttpServer::shutdown`] stops it.
pub struct HttpServer {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Serves `app` on `listener` until shut down. `header_timeout` bounds how long a client
    /// may take to send a request's headers.
    pub fn spawn(listener: TcpListener, app: Router, header_timeout: Duration) -> Self {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut builder = Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            builder.http2().timer(TokioTimer::new());
            let graceful = GracefulShutdown::new();
            loop {
                let (stream, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(c) => c,
                        Err(e) => {
                            // Out of file descriptors and the like: back off, keep serving.
                            tracing::warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    _ = stopped.changed() => break,
                };
                // Streams send one small chunk per token; don't let Nagle hold them back.
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(app.clone());
                let conn = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, "connection ended with an error: {e}");
                    }
                });
            }
            drop(listener);
            // Idle keep-alive connections close now; busy ones after their response.
            graceful.shutdown().await;
        });
        Self { addr, stop, task }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets open connections finish their current response for up to
    /// `grace`, then drops whatever is left.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            tracing::warn!("connections still open after {grace:?}; closing them");
            task.abort();
        }
    }
}
