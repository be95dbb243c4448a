//! Every way an image input can be wrong, each a 400 naming the field it came in
//! ([`MediaError::at`]): the client sent something this server will not or cannot read.

use crate::edge::error::ApiError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MediaError {
    #[error(
        "`{0}` is not an image URL: send an http(s) URL or a data URI \
         (`data:image/png;base64,...`)."
    )]
    NotAUrl(String),
    #[error("a data URI must be `data:image/<format>;base64,<data>`: {0}")]
    BadDataUri(&'static str),
    #[error("the image's base64 data does not decode: {0}")]
    Base64(String),
    #[error(
        "the image is {bytes} bytes, more than the limit of {limit} bytes (--max-image-bytes)."
    )]
    TooLarge { bytes: u64, limit: u64 },
    #[error(
        "the image is {width}x{height} pixels, more than the limit of {limit} pixels \
         (--max-image-pixels)."
    )]
    TooManyPixels { width: u32, height: u32, limit: u64 },
    #[error("the image is empty (0 pixels wide or high).")]
    NoPixels,
    #[error("the image is not in a format this server reads: send PNG, JPEG, WebP or GIF.")]
    UnsupportedFormat,
    #[error("the image does not decode: {0}")]
    Undecodable(String),
    #[error(
        "{count} images in one prompt is more than the limit of {limit} (--limit-mm-per-prompt)."
    )]
    TooManyImages { count: usize, limit: usize },
    #[error(
        "this server fetches no image URLs: send the image as a data URI, or start the server \
         with --allowed-media-domains listing the hosts it may fetch from."
    )]
    UrlsNotAllowed,
    #[error(
        "the host `{0}` is not among the hosts images may be fetched from \
         (--allowed-media-domains)."
    )]
    HostNotAllowed(String),
    #[error(
        "`{host}` is at {addr}, a private, loopback or link-local address, which image URLs may \
         not reach (--allow-private-media-urls)."
    )]
    PrivateAddress {
        host: String,
        addr: std::net::IpAddr,
    },
    #[error("the image URL redirected to `{0}`, which is not an http(s) URL.")]
    BadRedirect(String),
    #[error("the image URL redirected more than {0} times.")]
    TooManyRedirects(usize),
    #[error(
        "fetching the image took longer than the limit of {0} s (--media-fetch-timeout-secs)."
    )]
    Timeout(u64),
    #[error("fetching the image answered HTTP {0}.")]
    HttpStatus(u16),
    #[error("the image could not be fetched: {0}")]
    Fetch(String),
}

impl MediaError {
    /// The 400 a client gets, naming `field` as its API calls it
    /// (`messages[1].content[0].image_url`).
    pub fn at(self, field: impl Into<String>) -> ApiError {
        ApiError::invalid(field, self.to_string())
    }
}
