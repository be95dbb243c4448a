//! An image's RGB8 pixels into the tower's input, with llama.cpp's arithmetic to the bit
//! (tools/mtmd/mtmd-image.cpp: the fixed-size preprocessor Gemma 3 uses, its bilinear
//! filter and its default padding): the image scaled to fit the square with its aspect ratio
//! kept, centred on black, then each byte `b` becomes `(b / 255 - mean) / std` in f32.
//!
//! The resize is Pillow's separable resampling as llama.cpp writes it: per axis, each output
//! pixel's filter weights in f64, normalised to sum to one and turned to fixed point with 22
//! fraction bits (rounded half away from zero); a horizontal pass then a vertical one, each
//! summing integers with a rounding bias of 2^21 and clamping to 0-255, and a pass skipped for
//! an axis that keeps its length. Integers make the result exact on every machine, so a
//! different rounding anywhere would change pixels, not just bits.

use super::mmproj::{Result, VisionError, VisionSpec};

/// Fraction bits of the fixed-point filter weights (32 bits, less 8 for the pixel, less 2 of
/// headroom for the sums).
const PRECISION_BITS: u32 = 22;

/// The tower's input for an image of `width` x `height` RGB8 pixels (`rgb`, rows top to
/// bottom, 3 bytes a pixel): `spec.pixels_per_image()` f32 values, interleaved RGB, rows top
/// to bottom. [`resize_to_square`] then [`normalize`].
pub fn preprocess(spec: &VisionSpec, rgb: &[u8], width: usize, height: usize) -> Result<Vec<f32>> {
    Ok(normalize(
        spec,
        &resize_to_square(rgb, width, height, spec.image_size)?,
    ))
}

/// `(b / 255 - mean) / std` in f32 for each byte of RGB8 pixels, the channel's mean and std
/// (llama.cpp's `clip_image_f32::from_u8` then `normalize`).
pub fn normalize(spec: &VisionSpec, rgb: &[u8]) -> Vec<f32> {
    rgb.chunks_exact(3)
        .flat_map(|px| {
            (0..3).map(move |c| (f32::from(px[c]) / 255.0 - spec.image_mean[c]) / spec.image_std[c])
        })
        .collect()
}

/// The image scaled to fit a `size` x `size` square with its aspect ratio kept and centred on
/// black (llama.cpp's `PAD_CEIL`): scale `min(size / width, size / height)` and new sides
/// `ceil(side * scale)` (capped at `size`), in f32 as llama.cpp computes them; offsets
/// `(size - side) / 2`. An image of the square's size is returned as it is.
pub fn resize_to_square(rgb: &[u8], width: usize, height: usize, size: usize) -> Result<Vec<u8>> {
    if width == 0
        || height == 0
        || width.checked_mul(height).and_then(|p| p.checked_mul(3)) != Some(rgb.len())
    {
        return Err(VisionError::InvalidInput(format!(
            "an image of {width}x{height} pixels needs {} RGB bytes, got {}",
            width.saturating_mul(height).saturating_mul(3),
            rgb.len()
        )));
    }
    if size == 0 {
        return Err(VisionError::InvalidInput("a square of 0 pixels".into()));
    }
    if (width, height) == (size, size) {
        return Ok(rgb.to_vec());
    }
    let s = size as f32;
    let scale = (s / width as f32).min(s / height as f32);
    let fit = |side: usize| ((side as f32 * scale).ceil() as usize).clamp(1, size);
    let (new_w, new_h) = (fit(width), fit(height));
    let resized = resize(rgb, width, height, new_w, new_h);
    let mut out = vec![0u8; size * size * 3];
    let (ox, oy) = ((size - new_w) / 2, (size - new_h) / 2);
    for (y, row) in resized.chunks_exact(new_w * 3).enumerate() {
        out[((oy + y) * size + ox) * 3..][..new_w * 3].copy_from_slice(row);
    }
    Ok(out)
}

/// Pillow's bilinear resize of `rgb` (`width` x `height`) to `new_w` x `new_h`.
fn resize(rgb: &[u8], width: usize, height: usize, new_w: usize, new_h: usize) -> Vec<u8> {
    let mut img = rgb.to_vec();
    if new_w != width {
        let taps = Taps::new(width, new_w);
        let mut out = vec![0u8; new_w * height * 3];
        for (src, dst) in img
            .chunks_exact(width * 3)
            .zip(out.chunks_exact_mut(new_w * 3))
        {
            for (o, px) in dst.chunks_exact_mut(3).enumerate() {
                let (first, weights) = taps.of(o);
                for (c, v) in px.iter_mut().enumerate() {
                    let sum = weights
                        .iter()
                        .enumerate()
                        .map(|(j, &w)| i64::from(src[(first + j) * 3 + c]) * w)
                        .fold(1i64 << (PRECISION_BITS - 1), |a, b| a + b);
                    *v = clip8(sum);
                }
            }
        }
        img = out;
    }
    if new_h != height {
        let taps = Taps::new(height, new_h);
        let row = new_w * 3;
        let mut out = vec![0u8; row * new_h];
        for (o, dst) in out.chunks_exact_mut(row).enumerate() {
            let (first, weights) = taps.of(o);
            for (i, v) in dst.iter_mut().enumerate() {
                let sum = weights
                    .iter()
                    .enumerate()
                    .map(|(j, &w)| i64::from(img[(first + j) * row + i]) * w)
                    .fold(1i64 << (PRECISION_BITS - 1), |a, b| a + b);
                *v = clip8(sum);
            }
        }
        img = out;
    }
    img
}

/// A fixed-point sum back to a byte, clamped.
fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// One axis's filter: for each output pixel the first input pixel it reads and its
/// fixed-point weights.
struct Taps {
    first: Vec<usize>,
    weights: Vec<Vec<i64>>,
}

impl Taps {
    fn new(in_size: usize, out_size: usize) -> Self {
        let scale = in_size as f64 / out_size as f64;
        // Downscaling widens the filter to the input pixels an output pixel covers.
        let filterscale = scale.max(1.0);
        let support = filterscale;
        let ss = 1.0 / filterscale;
        let mut first = Vec::with_capacity(out_size);
        let mut weights = Vec::with_capacity(out_size);
        for xx in 0..out_size {
            let center = (xx as f64 + 0.5) * scale;
            // Truncated toward zero then clamped, as C's cast and llama.cpp's bounds do.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let count = xmax.saturating_sub(xmin);
            let w: Vec<f64> = (0..count)
                .map(|x| bilinear(((x + xmin) as f64 - center + 0.5) * ss))
                .collect();
            let total = w.iter().fold(0.0f64, |a, &b| a + b);
            let fixed = w
                .iter()
                .map(|&v| {
                    let v = if total != 0.0 { v / total } else { v };
                    let half = if v < 0.0 { -0.5 } else { 0.5 };
                    (v * f64::from(1u32 << PRECISION_BITS) + half) as i64
                })
                .collect();
            first.push(xmin);
            weights.push(fixed);
        }
        Self { first, weights }
    }

    fn of(&self, o: usize) -> (usize, &[i64]) {
        (self.first[o], &self.weights[o])
    }
}

/// The triangle filter of bilinear resampling.
fn bilinear(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flat image stays flat through any resize: every weight row sums to 2^22 within the
    /// rounding of its taps, and the bias rounds the result back to the same byte.
    #[test]
    fn a_flat_image_keeps_its_colour_inside_the_letterbox() {
        let (w, h, size) = (37, 13, 28);
        let rgb: Vec<u8> = (0..w * h).flat_map(|_| [200u8, 17, 99]).collect();
        let out = resize_to_square(&rgb, w, h, size).unwrap();
        // 37x13 scales by 28/37 to 28x10 (ceil of 9.84), centred 9 rows down.
        for y in 0..size {
            for x in 0..size {
                let px = &out[(y * size + x) * 3..][..3];
                let inside = (9..19).contains(&y);
                assert_eq!(
                    px,
                    if inside {
                        &[200, 17, 99][..]
                    } else {
                        &[0, 0, 0][..]
                    },
                    "({x}, {y})"
                );
            }
        }
    }

    #[test]
    fn a_wrong_byte_count_is_an_error_not_a_panic() {
        let err = resize_to_square(&[0; 10], 2, 2, 4).unwrap_err().to_string();
        assert!(err.contains("needs 12 RGB bytes, got 10"), "{err}");
        assert!(resize_to_square(&[], 0, 5, 4).is_err());
    }
}
