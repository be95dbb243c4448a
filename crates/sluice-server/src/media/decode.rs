//! An image's bytes into RGB pixels, as llama.cpp's mtmd reads them, with the limits checked
//! before anything large is allocated.
//!
//! llama.cpp (`tools/mtmd/mtmd-helper.cpp`) decodes with stb_image, asking for 3 channels
//! (`stbi_load_from_memory(buf, len, &nx, &ny, &nc, 3)`), and this follows stb's conversion:
//! - an alpha channel is dropped, not composited onto any background: a transparent pixel
//!   keeps the colour stored under it (stb's 4-to-3 and 2-to-3 cases copy the colour
//!   channels only);
//! - grey is copied to all three channels;
//! - 16-bit samples keep their high byte (stb's `orig >> 8`), not a rounded value;
//! - a GIF is its first frame, and a transparent pixel of it is black (stb never paints one,
//!   over a canvas it zeroed). Where the first frame is smaller than the screen, the pixels
//!   around it are black here; stb paints those the GIF's background colour;
//! - EXIF orientation and ICC profiles are ignored, as stb ignores them.
//!
//! JPEG pixels may differ from stb's by a few levels: the IDCT and chroma upsampling are each
//! decoder's own. stb reads no WebP (llama.cpp turns to ffmpeg, when built with video); WebP
//! follows the same alpha rule here.

use std::fmt;
use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageError, ImageFormat, ImageReader, Limits};
use sha2::{Digest, Sha256};

use crate::media::error::MediaError;
use crate::media::limits::MediaLimits;

/// An image as the vision tower's preprocessing reads it.
#[derive(Clone, PartialEq, Eq)]
pub struct DecodedImage {
    pub width: u32,
    pub height: u32,
    /// RGB8, row-major, `width * height * 3` bytes.
    pub rgb: Vec<u8>,
    /// SHA-256 of the width and height (each 4 bytes, little-endian) then `rgb`: one image
    /// sent twice, in any encoding that decodes to the same pixels, hashes alike (a key for
    /// caching its embeddings).
    pub sha256: [u8; 32],
}

impl fmt::Debug for DecodedImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DecodedImage({}x{}, sha256 ", self.width, self.height)?;
        for b in &self.sha256[..6] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("...)")
    }
}

impl DecodedImage {
    pub fn new(width: u32, height: u32, rgb: Vec<u8>) -> Self {
        let mut hash = Sha256::new();
        hash.update(width.to_le_bytes());
        hash.update(height.to_le_bytes());
        hash.update(&rgb);
        Self {
            width,
            height,
            rgb,
            sha256: hash.finalize().into(),
        }
    }
}

/// Decodes `bytes` (PNG, JPEG, WebP or GIF, told by their content). The byte limit is checked
/// first, then the pixel limit from the header alone, so an image that would decode to
/// gigabytes is refused before its pixels are allocated. Blocking: call it off the async
/// workers.
pub fn decode(bytes: &[u8], limits: &MediaLimits) -> Result<DecodedImage, MediaError> {
    if bytes.len() as u64 > limits.max_image_bytes {
        return Err(MediaError::TooLarge {
            bytes: bytes.len() as u64,
            limit: limits.max_image_bytes,
        });
    }
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| MediaError::Undecodable(e.to_string()))?;
    let format = reader.format().ok_or(MediaError::UnsupportedFormat)?;
    if !matches!(
        format,
        ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif
    ) {
        return Err(MediaError::UnsupportedFormat);
    }
    // A second guard under the pixel check: no decoder buffer past what the largest allowed
    // image needs (8 bytes a pixel: 16-bit RGBA), with room for metadata.
    let mut image_limits = Limits::default();
    image_limits.max_alloc = Some(
        limits
            .max_image_pixels
            .saturating_mul(8)
            .saturating_add(64 << 20),
    );
    reader.limits(image_limits);
    // Reads the header only.
    let decoder = reader.into_decoder().map_err(decode_error)?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(MediaError::NoPixels);
    }
    if u64::from(width) * u64::from(height) > limits.max_image_pixels {
        return Err(MediaError::TooManyPixels {
            width,
            height,
            limit: limits.max_image_pixels,
        });
    }
    let image = DynamicImage::from_decoder(decoder).map_err(decode_error)?;
    let rgb = to_rgb8(image, format == ImageFormat::Gif);
    Ok(DecodedImage::new(width, height, rgb))
}

fn decode_error(e: ImageError) -> MediaError {
    match e {
        ImageError::Unsupported(_) => MediaError::UnsupportedFormat,
        ImageError::Limits(_) => MediaError::Undecodable(
            "decoding it would need more memory than this server allows an image".into(),
        ),
        other => MediaError::Undecodable(other.to_string()),
    }
}

/// stb_image's conversion to 3 channels ([module docs](self)); `gif`: a transparent pixel is
/// black.
fn to_rgb8(image: DynamicImage, gif: bool) -> Vec<u8> {
    fn grey(samples: impl Iterator<Item = u8>, len: usize) -> Vec<u8> {
        let mut rgb = Vec::with_capacity(len * 3);
        for y in samples {
            rgb.extend_from_slice(&[y, y, y]);
        }
        rgb
    }
    let pixels = (image.width() as usize) * (image.height() as usize);
    match image {
        DynamicImage::ImageRgb8(b) => b.into_raw(),
        DynamicImage::ImageRgba8(b) => {
            let mut rgb = Vec::with_capacity(pixels * 3);
            for p in b.as_raw().chunks_exact(4) {
                if gif && p[3] == 0 {
                    rgb.extend_from_slice(&[0, 0, 0]);
                } else {
                    rgb.extend_from_slice(&p[..3]);
                }
            }
            rgb
        }
        DynamicImage::ImageLuma8(b) => grey(b.as_raw().iter().copied(), pixels),
        DynamicImage::ImageLumaA8(b) => grey(b.as_raw().iter().step_by(2).copied(), pixels),
        DynamicImage::ImageRgb16(b) => b.as_raw().iter().map(|&s| (s >> 8) as u8).collect(),
        DynamicImage::ImageRgba16(b) => b
            .as_raw()
            .chunks_exact(4)
            .flat_map(|p| [(p[0] >> 8) as u8, (p[1] >> 8) as u8, (p[2] >> 8) as u8])
            .collect(),
        DynamicImage::ImageLuma16(b) => grey(b.as_raw().iter().map(|&s| (s >> 8) as u8), pixels),
        DynamicImage::ImageLumaA16(b) => grey(
            b.as_raw().iter().step_by(2).map(|&s| (s >> 8) as u8),
            pixels,
        ),
        // Float images come from no format read here; the crate's own conversion.
        other => other.to_rgb8().into_raw(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::codecs::gif::GifEncoder;
    use image::{Frame, ImageBuffer, Rgb, RgbImage, Rgba, RgbaImage};

    fn encode(image: DynamicImage, format: ImageFormat) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        image.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    /// A 3x2 image of distinct colours.
    fn sample() -> RgbImage {
        ImageBuffer::from_fn(3, 2, |x, y| Rgb([(x * 80) as u8, (y * 200) as u8, 30]))
    }

    #[test]
    fn png_and_webp_decode_to_their_pixels() {
        let limits = MediaLimits::default();
        for format in [ImageFormat::Png, ImageFormat::WebP] {
            let bytes = encode(DynamicImage::ImageRgb8(sample()), format);
            let d = decode(&bytes, &limits).unwrap();
            assert_eq!((d.width, d.height), (3, 2), "{format:?}");
            assert_eq!(d.rgb, sample().into_raw(), "{format:?}");
            assert_eq!(d, DecodedImage::new(3, 2, sample().into_raw()));
        }
    }

    #[test]
    fn jpeg_decodes_close_to_its_pixels() {
        let flat: RgbImage = ImageBuffer::from_pixel(16, 16, Rgb([200, 100, 50]));
        let bytes = encode(DynamicImage::ImageRgb8(flat), ImageFormat::Jpeg);
        let d = decode(&bytes, &MediaLimits::default()).unwrap();
        assert_eq!((d.width, d.height, d.rgb.len()), (16, 16, 16 * 16 * 3));
        for p in d.rgb.chunks_exact(3) {
            for (got, want) in p.iter().zip([200u8, 100, 50]) {
                assert!(got.abs_diff(want) <= 3, "{p:?}");
            }
        }
    }

    /// Alpha is dropped (the colour under it kept), grey spread to three channels, 16-bit
    /// samples cut to their high byte: stb_image's conversion.
    #[test]
    fn alpha_grey_and_16_bit_convert_as_stb_image_does() {
        let limits = MediaLimits::default();
        let rgba: RgbaImage =
            ImageBuffer::from_vec(2, 1, vec![10, 20, 30, 0, 40, 50, 60, 128]).unwrap();
        let d = decode(
            &encode(DynamicImage::ImageRgba8(rgba), ImageFormat::Png),
            &limits,
        )
        .unwrap();
        assert_eq!(d.rgb, [10, 20, 30, 40, 50, 60]);
        let grey = image::GrayAlphaImage::from_vec(2, 1, vec![7, 0, 250, 255]).unwrap();
        let d = decode(
            &encode(DynamicImage::ImageLumaA8(grey), ImageFormat::Png),
            &limits,
        )
        .unwrap();
        assert_eq!(d.rgb, [7, 7, 7, 250, 250, 250]);
        let deep: ImageBuffer<Rgb<u16>, Vec<u16>> =
            ImageBuffer::from_vec(1, 1, vec![0x12ff, 0xff80, 0x0001]).unwrap();
        let d = decode(
            &encode(DynamicImage::ImageRgb16(deep), ImageFormat::Png),
            &limits,
        )
        .unwrap();
        assert_eq!(d.rgb, [0x12, 0xff, 0x00]);
    }

    /// A GIF is its first frame; its transparent pixels are black.
    #[test]
    fn a_gif_is_its_first_frame() {
        let mut bytes = Vec::new();
        {
            let mut encoder = GifEncoder::new(&mut bytes);
            let first: RgbaImage = ImageBuffer::from_vec(
                2,
                1,
                vec![255, 0, 0, 255, 0, 255, 0, 0], // red, then a transparent green
            )
            .unwrap();
            let second: RgbaImage = ImageBuffer::from_pixel(2, 1, Rgba([0, 0, 255, 255]));
            encoder
                .encode_frames([Frame::new(first), Frame::new(second)])
                .unwrap();
        }
        let d = decode(&bytes, &MediaLimits::default()).unwrap();
        assert_eq!((d.width, d.height), (2, 1));
        assert_eq!(d.rgb, [255, 0, 0, 0, 0, 0]);
    }

    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// A PNG of `width` x `height` RGB pixels, its header only and a few bytes of data: what a
    /// decompression bomb looks like before it is inflated.
    fn png_header(width: u32, height: u32) -> Vec<u8> {
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut chunk = |kind: &[u8], data: &[u8]| {
            png.extend_from_slice(&(data.len() as u32).to_be_bytes());
            let mut body = kind.to_vec();
            body.extend_from_slice(data);
            png.extend_from_slice(&body);
            png.extend_from_slice(&crc32(&body).to_be_bytes());
        };
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&width.to_be_bytes());
        ihdr.extend_from_slice(&height.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        chunk(b"IHDR", &ihdr);
        chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]);
        chunk(b"IEND", &[]);
        png
    }

    #[test]
    fn a_30000_square_png_is_refused_from_its_header() {
        let bomb = png_header(30_000, 30_000);
        assert!(bomb.len() < 100);
        assert_eq!(
            decode(&bomb, &MediaLimits::default()),
            Err(MediaError::TooManyPixels {
                width: 30_000,
                height: 30_000,
                limit: MediaLimits::default().max_image_pixels
            })
        );
        // Within the limit, the same header goes on to the data, which is short.
        let limits = MediaLimits {
            max_image_pixels: 1 << 40,
            ..MediaLimits::default()
        };
        assert!(matches!(
            decode(&png_header(4, 4), &limits),
            Err(MediaError::Undecodable(_))
        ));
    }

    #[test]
    fn bad_bytes_are_named_for_what_is_wrong() {
        let limits = MediaLimits::default();
        assert_eq!(
            decode(b"not an image at all", &limits),
            Err(MediaError::UnsupportedFormat)
        );
        // BMP and TIFF are told by their signatures but not read here.
        assert_eq!(
            decode(b"BM\x00\x00\x00\x00\x00\x00\x00\x00", &limits),
            Err(MediaError::UnsupportedFormat)
        );
        assert_eq!(
            decode(b"II*\x00\x08\x00\x00\x00", &limits),
            Err(MediaError::UnsupportedFormat)
        );
        let mut png = encode(DynamicImage::ImageRgb8(sample()), ImageFormat::Png);
        png.truncate(png.len() / 2);
        assert!(matches!(
            decode(&png, &limits),
            Err(MediaError::Undecodable(_))
        ));
        let small = MediaLimits {
            max_image_bytes: 10,
            ..MediaLimits::default()
        };
        assert_eq!(
            decode(&[0u8; 11], &small),
            Err(MediaError::TooLarge {
                bytes: 11,
                limit: 10
            })
        );
    }
}
