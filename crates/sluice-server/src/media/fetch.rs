//! Image URLs fetched under the server's rules: only from the hosts `--allowed-media-domains`
//! lists (none listed: every URL refused), never from a private, loopback or link-local
//! address unless `--allow-private-media-urls` (so a request cannot make the server read its
//! own network), within a time limit for the whole fetch and a size limit for the body.
//!
//! The address rule is checked where the connection is made: the client resolves names with
//! [`CheckedResolver`], which refuses a name with any such address, so the address checked is
//! the address connected to (a name that resolves differently on a second lookup gains
//! nothing), and an address written in the URL is checked before connecting. Redirects are
//! followed by hand, each hop checked as the first URL is. No proxy is used (one would resolve
//! names where these checks cannot see), and bodies are not decompressed (no gzip feature).

use std::error::Error as StdError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::LOCATION;
use reqwest::redirect::Policy;
use reqwest::Url;

use crate::media::error::MediaError;
use crate::media::limits::{HostList, MediaLimits, MAX_REDIRECTS};

/// Whether an address is refused to image URLs.
pub type AddressFilter = Arc<dyn Fn(IpAddr) -> bool + Send + Sync>;

/// Addresses that are not the public internet: unspecified, loopback, private (RFC 1918, IPv6
/// unique-local), link-local (cloud metadata services live at 169.254.169.254), shared
/// (carrier-grade NAT), documentation, benchmarking, multicast and reserved ranges; an IPv4
/// address inside IPv6 (mapped, NAT64, 6to4) is judged as itself.
pub fn is_non_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_non_public_v4(v4),
        IpAddr::V6(v6) => is_non_public_v6(v6),
    }
}

fn is_non_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240
}

fn is_non_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_non_public_v4(v4);
    }
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) reach the IPv4 address they carry.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_non_public_v4(embedded(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return is_non_public_v4(embedded(s[1], s[2]));
    }
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        // IPv4-compatible (::a.b.c.d, deprecated) and the rest of ::/96.
        || s[..6] == [0; 6]
        || (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
}

/// The refusal a resolver hands back through reqwest, found again in the error's sources.
#[derive(Debug, thiserror::Error)]
#[error("`{host}` resolves to {addr}, a non-public address")]
struct RefusedAddress {
    host: String,
    addr: IpAddr,
}

/// The client's resolver: the system's, refusing a name any of whose addresses is refused.
struct CheckedResolver {
    refused: AddressFilter,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let refused = self.refused.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            // The port is the URL's: reqwest sets it on each address it connects to.
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some(bad) = addrs.iter().find(|a| refused(a.ip())) {
                let refusal: Box<dyn StdError + Send + Sync> = Box::new(RefusedAddress {
                    host,
                    addr: bad.ip(),
                });
                return Err(refusal);
            }
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// Fetches image URLs ([module docs](self)); one for the server, shared by every request.
pub struct Fetcher {
    /// Built at the first fetch: a server that fetches no URLs never loads TLS roots.
    client: OnceLock<Result<reqwest::Client, String>>,
    allowed_hosts: HostList,
    max_bytes: u64,
    timeout: Duration,
    refused: AddressFilter,
}

impl Fetcher {
    /// A fetcher for `limits`: non-public addresses refused unless `allow_private`.
    pub fn new(limits: &MediaLimits) -> Self {
        let refused: AddressFilter = if limits.allow_private {
            Arc::new(|_| false)
        } else {
            Arc::new(is_non_public)
        };
        Self::with_filter(limits, refused)
    }

    /// A fetcher whose address rule is `refused` (tests trust their own loopback server so).
    pub fn with_filter(limits: &MediaLimits, refused: AddressFilter) -> Self {
        Self {
            client: OnceLock::new(),
            allowed_hosts: limits.allowed_hosts.clone(),
            max_bytes: limits.max_image_bytes,
            timeout: limits.fetch_timeout,
            refused,
        }
    }

    fn client(&self) -> Result<&reqwest::Client, MediaError> {
        self.client
            .get_or_init(|| {
                reqwest::Client::builder()
                    .redirect(Policy::none())
                    .no_proxy()
                    .dns_resolver(Arc::new(CheckedResolver {
                        refused: self.refused.clone(),
                    }))
                    .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| MediaError::Fetch(format!("the HTTP client did not start: {e}")))
    }

    /// The body `url` answers with, after its redirects.
    pub async fn fetch(&self, url: &Url) -> Result<Vec<u8>, MediaError> {
        if self.allowed_hosts.is_empty() {
            return Err(MediaError::UrlsNotAllowed);
        }
        tokio::time::timeout(self.timeout, self.follow(url.clone()))
            .await
            .map_err(|_| MediaError::Timeout(self.timeout.as_secs_f64().ceil() as u64))?
    }

    async fn follow(&self, mut url: Url) -> Result<Vec<u8>, MediaError> {
        for _ in 0..=MAX_REDIRECTS {
            self.check(&url)?;
            let response = self
                .client()?
                .get(url.clone())
                .send()
                .await
                .map_err(send_error)?;
            let status = response.status();
            if status.is_redirection() {
                let next = response
                    .headers()
                    .get(LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .ok_or(MediaError::HttpStatus(status.as_u16()))?;
                url = match url.join(next) {
                    Ok(u) if matches!(u.scheme(), "http" | "https") => u,
                    _ => return Err(MediaError::BadRedirect(next.chars().take(200).collect())),
                };
                continue;
            }
            if !status.is_success() {
                return Err(MediaError::HttpStatus(status.as_u16()));
            }
            return self.read_body(response).await;
        }
        Err(MediaError::TooManyRedirects(MAX_REDIRECTS))
    }

    /// The host is allowed, and an address written in the URL is not refused (a name's
    /// addresses are checked by the resolver).
    fn check(&self, url: &Url) -> Result<(), MediaError> {
        let host = url.host_str().unwrap_or_default();
        if !self.allowed_hosts.allows(host) {
            return Err(MediaError::HostNotAllowed(host.to_string()));
        }
        // The URL parser has written an address in its one canonical form (`0x7f.1` is
        // `127.0.0.1`), IPv6 in brackets.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let Ok(ip) = bare.parse::<IpAddr>() else {
            return Ok(());
        };
        if (self.refused)(ip) {
            return Err(MediaError::PrivateAddress {
                host: host.to_string(),
                addr: ip,
            });
        }
        Ok(())
    }

    /// The body, refused as soon as it passes the size limit (by its declared length, or
    /// while it streams).
    async fn read_body(&self, mut response: reqwest::Response) -> Result<Vec<u8>, MediaError> {
        let too_large = |bytes: u64| MediaError::TooLarge {
            bytes,
            limit: self.max_bytes,
        };
        if let Some(length) = response.content_length().filter(|&l| l > self.max_bytes) {
            return Err(too_large(length));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(send_error)? {
            let total = (body.len() + chunk.len()) as u64;
            if total > self.max_bytes {
                return Err(too_large(total));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// A failed request as the client is told it: a refused address by name, else what went
/// wrong, with its causes (reqwest's own message names only the URL).
fn send_error(e: reqwest::Error) -> MediaError {
    let mut source: Option<&(dyn StdError + 'static)> = e.source();
    let mut causes = Vec::new();
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<RefusedAddress>() {
            return MediaError::PrivateAddress {
                host: refused.host.clone(),
                addr: refused.addr,
            };
        }
        causes.push(s.to_string());
        source = s.source();
    }
    let what = if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "the body broke off"
    } else {
        "the request failed"
    };
    match causes.last() {
        Some(cause) => MediaError::Fetch(format!("{what}: {cause}")),
        None => MediaError::Fetch(what.to_string()),
    }
}

#[cfg(test)]
mod tests;
