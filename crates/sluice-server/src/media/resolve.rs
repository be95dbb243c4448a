//! A request's images, all at once: each fetched (a URL) or taken as sent (a data URI), then
//! decoded on the blocking pool, every image of the request in parallel. Any failure is a 400
//! naming the field of the first failing image, in the conversation's order.

use std::sync::Arc;

use futures_util::future::join_all;

use crate::edge::error::ApiError;
use crate::media::decode::{decode, DecodedImage};
use crate::media::error::MediaError;
use crate::media::fetch::Fetcher;
use crate::media::limits::MediaLimits;
use crate::media::source::{ImageInput, ImageSource};

/// The server's image handling: its limits and its URL fetcher, shared by every request.
pub struct Media {
    limits: Arc<MediaLimits>,
    fetcher: Fetcher,
}

impl Media {
    pub fn new(limits: MediaLimits) -> Self {
        let fetcher = Fetcher::new(&limits);
        Self::with_fetcher(limits, fetcher)
    }

    /// With a fetcher of its own (tests give one that trusts their loopback server).
    pub fn with_fetcher(limits: MediaLimits, fetcher: Fetcher) -> Self {
        Self {
            limits: Arc::new(limits),
            fetcher,
        }
    }

    pub fn limits(&self) -> &MediaLimits {
        &self.limits
    }

    /// Refuses more images than `--limit-mm-per-prompt`, naming the first one past it.
    pub fn check_count<'a>(
        &self,
        images: impl IntoIterator<Item = &'a ImageInput>,
    ) -> Result<(), ApiError> {
        let limit = self.limits.max_images_per_prompt;
        let images: Vec<&ImageInput> = images.into_iter().collect();
        match images.get(limit) {
            Some(first_past) => Err(MediaError::TooManyImages {
                count: images.len(),
                limit,
            }
            .at(first_past.field.clone())),
            None => Ok(()),
        }
    }

    /// Every image decoded, in order ([module docs](self)); the count checked first.
    pub async fn resolve(&self, images: &[&ImageInput]) -> Result<Vec<DecodedImage>, ApiError> {
        self.check_count(images.iter().copied())?;
        let results = join_all(images.iter().map(|image| self.resolve_one(image))).await;
        results
            .into_iter()
            .zip(images)
            .map(|(result, image)| result.map_err(|e| e.at(image.field.clone())))
            .collect::<Result<Vec<_>, ApiError>>()
    }

    async fn resolve_one(&self, image: &ImageInput) -> Result<DecodedImage, MediaError> {
        let bytes: Arc<[u8]> = match &image.source {
            ImageSource::Data { bytes, .. } => bytes.clone(),
            ImageSource::Url(url) => self.fetcher.fetch(url).await?.into(),
        };
        let limits = self.limits.clone();
        tokio::task::spawn_blocking(move || decode(&bytes, &limits))
            .await
            .map_err(|e| MediaError::Undecodable(format!("the decoder stopped: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use image::{DynamicImage, ImageFormat, RgbImage};

    use super::*;
    use crate::media::source::Detail;

    fn png(width: u32, height: u32) -> Arc<[u8]> {
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(RgbImage::new(width, height))
            .write_to(&mut out, ImageFormat::Png)
            .unwrap();
        out.into_inner().into()
    }

    fn input(bytes: Arc<[u8]>, field: &str) -> ImageInput {
        ImageInput {
            source: ImageSource::Data {
                media_type: "image/png".into(),
                bytes,
            },
            detail: Detail::Auto,
            field: field.into(),
        }
    }

    #[tokio::test]
    async fn images_resolve_in_order_and_errors_name_their_field() {
        let media = Media::new(MediaLimits {
            max_images_per_prompt: 3,
            ..MediaLimits::default()
        });
        let a = input(png(2, 1), "messages[0].content[0].image_url");
        let b = input(png(1, 3), "messages[0].content[2].image_url");
        let decoded = media.resolve(&[&a, &b]).await.unwrap();
        let sizes: Vec<(u32, u32)> = decoded.iter().map(|d| (d.width, d.height)).collect();
        assert_eq!(sizes, [(2, 1), (1, 3)]);

        let bad = input(Arc::from(&b"junk"[..]), "messages[1].content[0].image_url");
        let worse = input(
            Arc::from(&b"more junk"[..]),
            "messages[2].content[0].image_url",
        );
        let e = media.resolve(&[&a, &bad, &worse]).await.unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("messages[1].content[0].image_url"));
        assert!(
            e.message.contains("PNG, JPEG, WebP or GIF"),
            "{}",
            e.message
        );

        let e = media.resolve(&[&a, &a, &a, &b]).await.unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[2].image_url"));
        assert!(e.message.contains("4 images"), "{}", e.message);

        let url = ImageInput {
            source: ImageSource::parse("https://example.com/a.png").unwrap(),
            detail: Detail::High,
            field: "input[0].content[1].image_url".into(),
        };
        let e = media.resolve(&[&url]).await.unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].content[1].image_url"));
        assert!(
            e.message.contains("--allowed-media-domains"),
            "{}",
            e.message
        );
    }
}
