//! Where an image comes from, as a request names it: the bytes of a `data:` URI (or of
//! Anthropic's `base64` source) with the media type it declares, or an http(s) URL to fetch.
//! Parsing checks the shape only; the bytes are read by [`crate::media::decode`], the URL
//! fetched by [`crate::media::fetch`].

use std::fmt;
use std::sync::Arc;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use reqwest::Url;
use serde::Deserialize;

use crate::media::error::MediaError;

/// An image's bytes or where to fetch them.
#[derive(Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// Decoded from base64. `media_type` is what the client declared (`image/png`); the
    /// decoder goes by the bytes, as llama.cpp's (stb_image) does.
    Data {
        media_type: String,
        bytes: Arc<[u8]>,
    },
    Url(Url),
}

/// How closely the model is asked to look (OpenAI's `detail`). The vision towers served here
/// read every image at one fixed resolution, so each value is accepted and all read alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Detail {
    #[default]
    Auto,
    Low,
    High,
}

/// One image of a request, in the order the conversation holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInput {
    pub source: ImageSource,
    pub detail: Detail,
    /// The request field it came in, as its API names it
    /// (`messages[1].content[0].image_url`, `input[0].content[1].image_url`): every error
    /// about this image names it.
    pub field: String,
}

/// Base64 as clients write it: the standard alphabet, padded or not.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

impl ImageSource {
    /// An `image_url` as OpenAI's APIs send it: `data:image/...;base64,...` or an http(s)
    /// URL. Anything else (a bare path, raw base64, `file:`) is refused: this server reads
    /// no local files, and raw base64 is not OpenAI's shape.
    pub fn parse(url: &str) -> Result<Self, MediaError> {
        let trimmed = url.trim();
        // By bytes: the first five need not end on a character boundary (a fuzzer's URL).
        if trimmed
            .as_bytes()
            .get(..5)
            .is_some_and(|b| b.eq_ignore_ascii_case(b"data:"))
        {
            return Self::parse_data_uri(&trimmed[5..]);
        }
        match Url::parse(trimmed) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
                Ok(Self::Url(u))
            }
            _ => Err(MediaError::NotAUrl(shorten(trimmed))),
        }
    }

    /// The part of a data URI after `data:`: `image/png;base64,<data>`.
    fn parse_data_uri(rest: &str) -> Result<Self, MediaError> {
        let (header, data) = rest
            .split_once(',')
            .ok_or(MediaError::BadDataUri("it has no `,` before the data"))?;
        let (media_type, params) = header.split_once(';').unwrap_or((header, ""));
        let media_type = media_type.trim();
        if !media_type
            .get(..6)
            .is_some_and(|p| p.eq_ignore_ascii_case("image/"))
        {
            return Err(MediaError::BadDataUri("its media type is not image/..."));
        }
        // `base64` is the last parameter (RFC 2397); others (`charset=`) may come before.
        if !params
            .rsplit(';')
            .next()
            .is_some_and(|p| p.trim().eq_ignore_ascii_case("base64"))
        {
            return Err(MediaError::BadDataUri("it is not base64 (`;base64,`)"));
        }
        Self::from_base64(media_type, data)
    }

    /// Base64 data with its declared media type (a data URI's, or Anthropic's `base64`
    /// source). Line breaks and blanks inside the data are skipped: some clients wrap it.
    pub fn from_base64(media_type: &str, data: &str) -> Result<Self, MediaError> {
        let bytes = if data.bytes().any(|b| b.is_ascii_whitespace()) {
            let compact: Vec<u8> = data.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
            BASE64.decode(compact)
        } else {
            BASE64.decode(data)
        }
        .map_err(|e| MediaError::Base64(e.to_string()))?;
        Ok(Self::Data {
            media_type: media_type.to_ascii_lowercase(),
            bytes: bytes.into(),
        })
    }

    /// Bytes this source keeps in memory (a stored conversation counts them).
    pub fn size_bytes(&self) -> usize {
        match self {
            Self::Data { bytes, media_type } => bytes.len() + media_type.len(),
            Self::Url(url) => url.as_str().len(),
        }
    }
}

/// Logs and errors show a data source by its size, not its bytes.
impl fmt::Debug for ImageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Data { media_type, bytes } => {
                write!(f, "Data({media_type}, {} bytes)", bytes.len())
            }
            Self::Url(url) => write!(f, "Url({url})"),
        }
    }
}

/// A value quoted back in an error, cut short: it may be megabytes of base64.
fn shorten(s: &str) -> String {
    const MAX: usize = 64;
    match s.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &s[..cut]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A URL whose fifth byte is inside a character is refused, not a panic (the fuzzer's).
    #[test]
    fn non_ascii_urls_are_refused() {
        for url in ["::\u{1FBAF}\u{10FEA}%$", "dat\u{e9}:x", "\u{1F600}"] {
            assert!(
                matches!(ImageSource::parse(url), Err(MediaError::NotAUrl(_))),
                "{url}"
            );
        }
    }

    #[test]
    fn data_uris_and_urls_parse() {
        let ImageSource::Data { media_type, bytes } =
            ImageSource::parse("data:image/png;base64,aGVsbG8=").unwrap()
        else {
            panic!("not data")
        };
        assert_eq!(
            (media_type.as_str(), &bytes[..]),
            ("image/png", &b"hello"[..])
        );
        // Unpadded, wrapped, upper-case scheme, a parameter before `base64`.
        for uri in [
            "data:image/png;base64,aGVsbG8",
            "DATA:image/PNG;charset=x;BASE64,aGVs\nbG8=",
        ] {
            let ImageSource::Data { bytes, .. } = ImageSource::parse(uri).unwrap() else {
                panic!("{uri}")
            };
            assert_eq!(&bytes[..], b"hello", "{uri}");
        }
        assert_eq!(
            ImageSource::parse(" https://example.com/a.png ").unwrap(),
            ImageSource::Url(Url::parse("https://example.com/a.png").unwrap())
        );
    }

    #[test]
    fn other_shapes_are_refused() {
        for bad in [
            "aGVsbG8=",
            "file:///etc/passwd",
            "ftp://example.com/a.png",
            "/tmp/a.png",
            "https://",
            "",
        ] {
            assert!(
                matches!(ImageSource::parse(bad), Err(MediaError::NotAUrl(_))),
                "{bad}"
            );
        }
        for bad in [
            "data:image/png;base64",
            "data:text/plain;base64,aGVsbG8=",
            "data:image/png,hello",
            "data:image/png;utf8,hello",
        ] {
            assert!(
                matches!(ImageSource::parse(bad), Err(MediaError::BadDataUri(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            ImageSource::parse("data:image/png;base64,@@@@"),
            Err(MediaError::Base64(_))
        ));
        // A long value is quoted back cut short.
        let long = format!("x{}", "y".repeat(10_000));
        let MediaError::NotAUrl(shown) = ImageSource::parse(&long).unwrap_err() else {
            panic!()
        };
        assert!(shown.len() < 100, "{shown}");
    }
}
