//! What the server takes of images ([`MediaLimits`]), from its configuration: bytes and pixels
//! per image, images per prompt, and which hosts image URLs may be fetched from. The two
//! values written in vLLM's syntax (`--limit-mm-per-prompt`, `--allowed-media-domains`) are
//! parsed here.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

/// Most redirects one image URL may take; each hop is checked as the first URL is.
pub const MAX_REDIRECTS: usize = 5;

pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 20 << 20;
/// 50 megapixels: a 48-megapixel phone photo fits; its RGB pixels take 150 MB.
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 50_000_000;
pub const DEFAULT_IMAGES_PER_PROMPT: usize = 8;
pub const DEFAULT_FETCH_TIMEOUT_SECS: u64 = 10;

/// The server's rules for images, one set for every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaLimits {
    /// Largest image as sent or fetched (its encoded bytes).
    pub max_image_bytes: u64,
    /// Most pixels (width times height) an image may have, read from its header before it is
    /// decoded.
    pub max_image_pixels: u64,
    pub max_images_per_prompt: usize,
    /// Hosts image URLs may be fetched from; none: every URL is refused.
    pub allowed_hosts: HostList,
    /// Whether an image URL may reach a private, loopback or link-local address.
    pub allow_private: bool,
    /// Longest a fetch may take, redirects and body included.
    pub fetch_timeout: Duration,
}

impl Default for MediaLimits {
    fn default() -> Self {
        Self {
            max_image_bytes: DEFAULT_MAX_IMAGE_BYTES,
            max_image_pixels: DEFAULT_MAX_IMAGE_PIXELS,
            max_images_per_prompt: DEFAULT_IMAGES_PER_PROMPT,
            allowed_hosts: HostList::default(),
            allow_private: false,
            fetch_timeout: Duration::from_secs(DEFAULT_FETCH_TIMEOUT_SECS),
        }
    }
}

/// `--allowed-media-domains`: host names image URLs may be fetched from, compared whole and
/// without case (`example.com` does not allow `cdn.example.com`, as vLLM's list does not);
/// `*` allows every host (private addresses stay refused unless `--allow-private-media-urls`).
/// Written comma- or blank-separated, or as a list in the file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct HostList(pub Vec<String>);

impl HostList {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `host` (as a URL names it: `example.com`, `[::1]`) may be fetched from.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        self.0
            .iter()
            .any(|h| h == "*" || h.eq_ignore_ascii_case(host))
    }

    fn parse(list: &str) -> Result<Self, String> {
        let mut hosts = Vec::new();
        for host in list.split(|c: char| c == ',' || c.is_whitespace()) {
            if host.is_empty() {
                continue;
            }
            if host.contains('/') || host.contains('@') {
                return Err(format!(
                    "`{host}` is not a host name: list hosts (`upload.wikimedia.org`), not URLs"
                ));
            }
            hosts.push(host.trim_end_matches('.').to_ascii_lowercase());
        }
        Ok(Self(hosts))
    }
}

impl FromStr for HostList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

impl<'de> Deserialize<'de> for HostList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Many(Vec<String>),
        }
        let joined = match Raw::deserialize(d)? {
            Raw::One(s) => s,
            Raw::Many(v) => v.join(","),
        };
        Self::parse(&joined).map_err(serde::de::Error::custom)
    }
}

/// `--limit-mm-per-prompt`: most images one prompt may hold, in vLLM's syntax, a JSON object
/// by modality (`{"image": 4}`, or `{"image": {"count": 4}}`, whose `width` and `height`, vLLM's
/// memory-profiling hints, mean nothing here), or a bare number. Other modalities may only be
/// given 0: this server takes images, no video or audio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImagesPerPrompt(pub usize);

impl Default for ImagesPerPrompt {
    fn default() -> Self {
        Self(DEFAULT_IMAGES_PER_PROMPT)
    }
}

/// One modality's limit: a count, or vLLM's object with one.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawCount {
    Count(u64),
    Object {
        count: u64,
        #[allow(dead_code)]
        width: Option<u64>,
        #[allow(dead_code)]
        height: Option<u64>,
    },
}

impl RawCount {
    fn count(&self) -> u64 {
        match self {
            Self::Count(n) | Self::Object { count: n, .. } => *n,
        }
    }
}

impl ImagesPerPrompt {
    fn from_modalities(map: BTreeMap<String, RawCount>) -> Result<Self, String> {
        let mut images = DEFAULT_IMAGES_PER_PROMPT;
        for (modality, limit) in map {
            match (modality.as_str(), limit.count()) {
                ("image", n) => {
                    images = usize::try_from(n).map_err(|_| format!("{n} is too large"))?
                }
                (_, 0) => {}
                (other, _) => {
                    return Err(format!(
                        "`{other}` input is not taken by this server (images only); give it 0 \
                         or leave it out"
                    ))
                }
            }
        }
        Ok(Self(images))
    }
}

impl FromStr for ImagesPerPrompt {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Ok(n) = s.parse::<usize>() {
            return Ok(Self(n));
        }
        let map: BTreeMap<String, RawCount> = serde_json::from_str(s).map_err(|e| {
            format!("`{s}` is neither a number nor a JSON object such as {{\"image\": 4}}: {e}")
        })?;
        Self::from_modalities(map)
    }
}

impl fmt::Display for ImagesPerPrompt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for ImagesPerPrompt {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0 as u64)
    }
}

impl<'de> Deserialize<'de> for ImagesPerPrompt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u64),
            Text(String),
            Modalities(BTreeMap<String, RawCount>),
        }
        match Raw::deserialize(d)? {
            Raw::Count(n) => usize::try_from(n)
                .map(Self)
                .map_err(|_| serde::de::Error::custom(format!("{n} is too large"))),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
            Raw::Modalities(map) => Self::from_modalities(map).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_limit_takes_vllms_json_or_a_number() {
        let p = |s: &str| s.parse::<ImagesPerPrompt>();
        assert_eq!(p("3"), Ok(ImagesPerPrompt(3)));
        assert_eq!(p(r#"{"image": 4}"#), Ok(ImagesPerPrompt(4)));
        assert_eq!(p(r#"{"image": 2, "video": 0}"#), Ok(ImagesPerPrompt(2)));
        assert_eq!(
            p(r#"{"image": {"count": 5, "width": 512, "height": 512}}"#),
            Ok(ImagesPerPrompt(5))
        );
        assert_eq!(p(r#"{"audio": 0}"#), Ok(ImagesPerPrompt::default()));
        assert!(p(r#"{"video": 1}"#).unwrap_err().contains("`video`"));
        assert!(p("many").is_err());
        assert!(p(r#"{"image": -1}"#).is_err());
        // The file's forms: a number, a table, a string.
        let de = |v: serde_json::Value| serde_json::from_value::<ImagesPerPrompt>(v);
        assert_eq!(de(serde_json::json!(6)).unwrap(), ImagesPerPrompt(6));
        assert_eq!(
            de(serde_json::json!({"image": 7})).unwrap(),
            ImagesPerPrompt(7)
        );
        assert_eq!(
            de(serde_json::json!("{\"image\": 1}")).unwrap(),
            ImagesPerPrompt(1)
        );
    }

    #[test]
    fn hosts_are_whole_names_without_case() {
        let hosts: HostList = "upload.wikimedia.org, Example.COM. [::1]".parse().unwrap();
        assert_eq!(hosts.0, ["upload.wikimedia.org", "example.com", "[::1]"]);
        assert!(hosts.allows("example.com"));
        assert!(hosts.allows("EXAMPLE.com."));
        assert!(hosts.allows("[::1]"));
        assert!(!hosts.allows("cdn.example.com"));
        assert!(!hosts.allows("wikimedia.org"));
        let any: HostList = "*".parse().unwrap();
        assert!(any.allows("anything.test"));
        assert!(HostList::default().is_empty());
        assert!(!HostList::default().allows("example.com"));
        assert!("https://example.com/".parse::<HostList>().is_err());
        let from_list: HostList =
            serde_json::from_value(serde_json::json!(["a.test", "b.test"])).unwrap();
        assert_eq!(from_list.0, ["a.test", "b.test"]);
    }
}
