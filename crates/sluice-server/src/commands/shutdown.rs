//! Shutdown signals and the drain that follows one: `/health` turns 503 and new requests get
//! 503 at once, requests in flight run to completion until the drain timeout, and only then
//! does the server stop (so a load balancer sees the 503s and moves traffic away first).

use std::time::Duration;

use tokio::time::Instant;

use crate::engine::state::AppState;

/// SIGTERM or ctrl-c (SIGINT); or none, for a server inside another command (`sluice chat`
/// keeps ctrl-c to stop an answer, and the server ends with the process).
pub struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(not(unix))]
    listen: bool,
}

impl Signals {
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            #[cfg(unix)]
            term: Some(tokio::signal::unix::signal(
                tokio::signal::unix::SignalKind::terminate(),
            )?),
            #[cfg(not(unix))]
            listen: true,
        })
    }

    /// Signals that never come.
    pub fn none() -> Self {
        Self {
            #[cfg(unix)]
            term: None,
            #[cfg(not(unix))]
            listen: false,
        }
    }

    /// Waits for the next signal; returns its name.
    pub async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            let Some(term) = &mut self.term else {
                return std::future::pending().await;
            };
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            if !self.listen {
                return std::future::pending().await;
            }
            let _ = tokio::signal::ctrl_c().await;
            "ctrl-c"
        }
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every request finished.
    Idle,
    /// The drain timeout passed with requests still running.
    TimedOut,
    /// A second signal asked to stop now.
    Interrupted,
}

/// Waits until no generation request is in flight (neither in a handler nor in the engine),
/// the deadline passes, or another signal arrives.
pub async fn drain(
    state: &AppState,
    engine_in_flight: impl Fn() -> usize,
    timeout: Duration,
    signals: &mut Signals,
) -> Drained {
    let deadline = Instant::now() + timeout;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        if state.in_flight() == 0 && engine_in_flight() == 0 {
            return Drained::Idle;
        }
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::time::sleep_until(deadline) => return Drained::TimedOut,
            _ = signals.recv() => return Drained::Interrupted,
        }
    }
}
