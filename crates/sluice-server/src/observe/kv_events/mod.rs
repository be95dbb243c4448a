//! Publishing KV-cache events for prefix-aware routers (`--kv-events`): the engine records
//! every block the prefix cache gains or loses ([`sluice_engine::kv_events`]); this module
//! sends them in vLLM's ZMQ wire format ([`wire`]) over a small ZMTP implementation
//! ([`zmtp`], [`publisher`]), so llm-d's KV-cache indexer, Dynamo's KV router or any pyzmq
//! subscriber reads them as they read vLLM's.
//!
//! Endpoints follow vLLM's rule: one with a wildcard host (`tcp://*:5557`, `tcp://[::]:5557`)
//! binds and subscribers connect to it; any other (`tcp://router:5557`) connects to a
//! subscriber that binds there, the layout of llm-d's single indexer socket.

pub mod publisher;
pub mod wire;
pub mod zmtp;

use std::fmt;
use std::str::FromStr;

pub use publisher::{KvEventPublisher, PublisherError, PublisherSettings};
pub use wire::{EventFormat, Medium};

/// Whether a ZMQ socket binds or connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointMode {
    Bind,
    Connect,
}

/// A `tcp://HOST:PORT` endpoint as vLLM's `--kv-events-config` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZmqEndpoint {
    text: String,
    host: String,
    port: u16,
    mode: EndpointMode,
}

impl ZmqEndpoint {
    pub fn mode(&self) -> EndpointMode {
        self.mode
    }

    /// The host to bind or connect to: `*` is `0.0.0.0`, brackets are gone.
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl FromStr for ZmqEndpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let Some(address) = s.strip_prefix("tcp://") else {
            return Err(format!(
                "`{s}` is not a tcp://HOST:PORT endpoint (ipc:// and inproc:// are not supported)"
            ));
        };
        let (host, port) = address
            .rsplit_once(':')
            .ok_or_else(|| format!("`{s}` has no port: write tcp://HOST:PORT"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("`{s}`: the port must be a number from 0 to 65535"))?;
        if host.is_empty() {
            return Err(format!("`{s}` has no host: write tcp://*:PORT to bind"));
        }
        let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        let (host, mode) = match (host, bracketed) {
            ("*", _) => ("0.0.0.0".to_string(), EndpointMode::Bind),
            (_, Some("::")) => ("::".to_string(), EndpointMode::Bind),
            (_, Some(inner)) => (inner.to_string(), EndpointMode::Connect),
            (h, None) => (h.to_string(), EndpointMode::Connect),
        };
        Ok(Self {
            text: s.to_string(),
            host,
            port,
            mode,
        })
    }
}

impl fmt::Display for ZmqEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_bind_and_other_hosts_connect() {
        let e: ZmqEndpoint = "tcp://*:5557".parse().unwrap();
        assert_eq!(
            (e.host(), e.port(), e.mode()),
            ("0.0.0.0", 5557, EndpointMode::Bind)
        );
        let e: ZmqEndpoint = "tcp://[::]:5557".parse().unwrap();
        assert_eq!((e.host(), e.mode()), ("::", EndpointMode::Bind));
        let e: ZmqEndpoint = "tcp://epp.default.svc:5557".parse().unwrap();
        assert_eq!(
            (e.host(), e.mode()),
            ("epp.default.svc", EndpointMode::Connect)
        );
        let e: ZmqEndpoint = "tcp://[fe80::1]:9".parse().unwrap();
        assert_eq!((e.host(), e.mode()), ("fe80::1", EndpointMode::Connect));
        assert_eq!(e.to_string(), "tcp://[fe80::1]:9");
    }

    #[test]
    fn bad_endpoints_say_what_is_wrong() {
        for (text, says) in [
            ("ipc:///tmp/kv", "not a tcp://"),
            ("tcp://*", "no port"),
            ("tcp://*:http", "port must be a number"),
            ("tcp://*:70000", "port must be a number"),
            ("tcp://:5557", "no host"),
        ] {
            let err = text.parse::<ZmqEndpoint>().unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
