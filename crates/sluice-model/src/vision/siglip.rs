//! The SigLIP encoder and Gemma 3's projector, as llama.cpp computes them (tools/mtmd/clip.cpp
//! `build_vit`, models/siglip.cpp), every image of a call in one batched forward: the matrix
//! products run over all images' patches at once, attention within each image
//! ([`super::attention`]). Every step computes each row (a patch, later a token) on its own,
//! so an image's embeddings are the same bits whichever images share its call.
//!
//! Per image: the patch convolution (a matrix product over each patch's `3 x p x p` values,
//! both operands rounded to f16 as llama.cpp's convolution rounds them) plus its bias and the learned position embeddings; per layer, pre-norm attention and a GELU
//! MLP, each added to the residual; the final LayerNorm. Then Gemma 3's projector: the patch
//! grid average-pooled in squares of `merge`, RMSNorm times `mm.soft_emb_norm.weight`, and
//! `mm.input_projection` into the text model's width.

use std::path::Path;

use rayon::prelude::*;
use sluice_kernels::cpu::rows::rms_norm;
use sluice_kernels::cpu::swiglu::{sigmoid_argument, GatedActivation};

use super::attention::{bidirectional, AttentionShape};
use super::mmproj::{MmprojFile, Result, TowerConfig, VisionError, VisionSpec, INPUT_PROJECTION};
use crate::weights::Linear;

/// Rows from which the row-wise steps (norms, GELU) split their rows over rayon's pool.
const PARALLEL_ROWS: usize = 64;

/// A LayerNorm's weight and optional bias.
struct Norm {
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
}

struct Layer {
    ln1: Norm,
    /// Q, K and V stacked (one product), with their biases.
    qkv: Linear,
    o: Linear,
    ln2: Norm,
    up: Linear,
    down: Linear,
}

/// A vision tower read from a projector file: its [`VisionSpec`] and weights.
pub struct VisionTower {
    config: TowerConfig,
    /// `v.patch_embd`: `[hidden, 3 * patch * patch]`, with its bias.
    patch: Linear,
    /// `v.position_embd`: `[patches, hidden]`.
    position: Vec<f32>,
    layers: Vec<Layer>,
    post_ln: Option<Norm>,
    soft_emb_norm: Vec<f32>,
    /// `mm.input_projection` transposed: `[text width, hidden]`.
    projection: Linear,
}

impl VisionTower {
    /// Reads a projector file: its keys, then every tensor, each checked by name and shape
    /// before the weights are laid out for the kernels. Needs the packed f32 kernels (AVX2 and
    /// FMA, or AVX-512), which the encoder's attention runs on.
    pub fn open(path: &Path) -> Result<Self> {
        if !sluice_kernels::cpu::gemm::available() {
            return Err(VisionError::Unsupported {
                path: path.to_path_buf(),
                what: "CPU for the vision tower: it needs AVX2, FMA and F16C (or AVX-512)".into(),
            });
        }
        let mut file = MmprojFile::open(path)?;
        let config = file.config()?;
        let (h, ff) = (config.hidden, config.ff);
        let p = config.spec.patch_size;
        let patch_bias = file.opt_vector("v.patch_embd.bias", h)?;
        let patch = file.f16_linear("v.patch_embd.weight", &[h, 3, p, p], patch_bias)?;
        let position = file.values("v.position_embd.weight", &[config.patches(), h])?;
        let attn = config.heads * config.head_dim;
        let mut layers = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            let name = |t: &str| format!("v.blk.{i}.{t}");
            let (q, k, v, o) = (
                name("attn_q.weight"),
                name("attn_k.weight"),
                name("attn_v.weight"),
                name("attn_out.weight"),
            );
            let biases = [
                file.opt_vector(&name("attn_q.bias"), attn)?,
                file.opt_vector(&name("attn_k.bias"), attn)?,
                file.opt_vector(&name("attn_v.bias"), attn)?,
            ];
            let qkv = file.linear(
                &[
                    (q.as_str(), &[attn, h][..]),
                    (k.as_str(), &[attn, h][..]),
                    (v.as_str(), &[attn, h][..]),
                ],
                &biases,
            )?;
            let o_bias = file.opt_vector(&name("attn_out.bias"), h)?;
            let o = file.linear(&[(o.as_str(), &[h, attn][..])], &[o_bias])?;
            let (mut up, mut down) = ("ffn_up", "ffn_down");
            // llama.cpp's rule for Gemma 3 files (clip.cpp, `is_ffn_swapped`): old converters
            // wrote the MLP's two matrices under each other's names, so when `ffn_down` takes
            // the hidden size as its input it is read as `ffn_up` and the other way round.
            // (A square MLP would always swap; no SigLIP has one.)
            if file.dims(&name("ffn_down.weight"))?.last() == Some(&h) {
                std::mem::swap(&mut up, &mut down);
            }
            let up_bias = file.opt_vector(&name(&format!("{up}.bias")), ff)?;
            let up = file.linear(
                &[(name(&format!("{up}.weight")).as_str(), &[ff, h][..])],
                &[up_bias],
            )?;
            let down_bias = file.opt_vector(&name(&format!("{down}.bias")), h)?;
            let down = file.linear(
                &[(name(&format!("{down}.weight")).as_str(), &[h, ff][..])],
                &[down_bias],
            )?;
            layers.push(Layer {
                ln1: norm(&mut file, &name("ln1"), h)?,
                qkv,
                o,
                ln2: norm(&mut file, &name("ln2"), h)?,
                up,
                down,
            });
            file.file.release_pages()?;
        }
        let post_ln = if file.has("v.post_ln.weight") {
            Some(norm(&mut file, "v.post_ln", h)?)
        } else {
            None
        };
        let soft_emb_norm = file.vector("mm.soft_emb_norm.weight", h)?;
        let projection =
            file.transposed_linear(INPUT_PROJECTION, h, config.spec.embedding_width)?;
        Ok(Self {
            config,
            patch,
            position,
            layers,
            post_ln,
            soft_emb_norm,
            projection,
        })
    }

    pub fn spec(&self) -> &VisionSpec {
        &self.config.spec
    }

    /// Bytes the weights take in memory.
    pub fn weight_bytes(&self) -> usize {
        let vectors = self.position.len() + self.soft_emb_norm.len();
        self.patch.weight_bytes()
            + self.projection.weight_bytes()
            + vectors * 4
            + self
                .layers
                .iter()
                .map(|l| {
                    l.qkv.weight_bytes()
                        + l.o.weight_bytes()
                        + l.up.weight_bytes()
                        + l.down.weight_bytes()
                })
                .sum::<usize>()
    }

    /// The embeddings of `images` (each preprocessed: [`super::preprocess`]) into `out`:
    /// `images.len() x tokens_per_image x embedding_width` values, image after image, token
    /// after token (the pooled grid row-major). One forward for all images; an image's values
    /// do not depend on the others.
    pub fn encode(&self, images: &[&[f32]], out: &mut [f32]) -> Result<()> {
        let spec = &self.config.spec;
        let n = images.len();
        if let Some((i, img)) = images
            .iter()
            .enumerate()
            .find(|(_, img)| img.len() != spec.pixels_per_image())
        {
            return Err(VisionError::InvalidInput(format!(
                "image {i} has {} values, the tower takes {} ({}x{} RGB)",
                img.len(),
                spec.pixels_per_image(),
                spec.image_size,
                spec.image_size
            )));
        }
        let want = n * spec.tokens_per_image * spec.embedding_width;
        if out.len() != want {
            return Err(VisionError::InvalidInput(format!(
                "{n} images give {want} values, the output holds {}",
                out.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let c = &self.config;
        let (h, patches) = (c.hidden, c.patches());
        let rows = n * patches;
        let mut x = vec![0f32; rows * h];
        self.patch.forward_into(&im2col(images, c), rows, &mut x)?;
        for img in x.chunks_exact_mut(patches * h) {
            for (v, p) in img.iter_mut().zip(&self.position) {
                *v += p;
            }
        }
        let attn_width = c.heads * c.head_dim;
        let mut normed = vec![0f32; rows * h];
        let mut qkv = vec![0f32; rows * 3 * attn_width];
        let mut attn = vec![0f32; rows * attn_width];
        let mut delta = vec![0f32; rows * h];
        let mut hidden = vec![0f32; rows * c.ff];
        let shape = AttentionShape {
            images: n,
            patches,
            heads: c.heads,
            head_dim: c.head_dim,
        };
        for layer in &self.layers {
            layer_norm(&x, &layer.ln1, c.eps, &mut normed);
            layer.qkv.forward_into(&normed, rows, &mut qkv)?;
            bidirectional(&qkv, shape, &mut attn);
            layer.o.forward_into(&attn, rows, &mut delta)?;
            add(&mut x, &delta);
            layer_norm(&x, &layer.ln2, c.eps, &mut normed);
            layer.up.forward_into(&normed, rows, &mut hidden)?;
            gelu(&mut hidden, c.ff);
            layer.down.forward_into(&hidden, rows, &mut delta)?;
            add(&mut x, &delta);
        }
        if let Some(post) = &self.post_ln {
            layer_norm(&x, post, c.eps, &mut normed);
            std::mem::swap(&mut x, &mut normed);
        }
        let tokens = n * spec.tokens_per_image;
        let pooled = pool(&x, c, n);
        let mut projected_in = vec![0f32; tokens * h];
        rms_norm(&pooled, &self.soft_emb_norm, c.eps, &mut projected_in);
        self.projection.forward_into(&projected_in, tokens, out)?;
        Ok(())
    }
}

/// LayerNorm `name` (`.weight`, optional `.bias`) of width `h`.
fn norm(file: &mut MmprojFile, name: &str, h: usize) -> Result<Norm> {
    Ok(Norm {
        weight: file.vector(&format!("{name}.weight"), h)?,
        bias: file.opt_vector(&format!("{name}.bias"), h)?,
    })
}

/// Each image's patches as rows of the convolution's inputs: patch `(py, px)` of an image at
/// row `py * side + px`, its values in the kernel's `[channel][y][x]` order, read from the
/// interleaved RGB pixels and rounded to f16, as ggml's `im2col` for `ggml_conv_2d` writes
/// them on every backend (the product then runs in f16 inputs with f32 sums: see
/// `MmprojFile::f16_linear`).
fn im2col(images: &[&[f32]], c: &TowerConfig) -> Vec<f32> {
    let (p, side, size) = (c.spec.patch_size, c.side(), c.spec.image_size);
    let cols = 3 * p * p;
    let mut out = vec![0f32; images.len() * c.patches() * cols];
    for (img, dst) in images.iter().zip(out.chunks_exact_mut(c.patches() * cols)) {
        for (patch, row) in dst.chunks_exact_mut(cols).enumerate() {
            let (py, px) = (patch / side, patch % side);
            for ch in 0..3 {
                for y in 0..p {
                    for x in 0..p {
                        let (iy, ix) = (py * p + y, px * p + x);
                        row[(ch * p + y) * p + x] = to_f16(img[(iy * size + ix) * 3 + ch]);
                    }
                }
            }
        }
    }
    out
}

/// ggml's LayerNorm on each row of `x` into `out`: the mean and the variance summed in f64,
/// `(x - mean) / sqrt(var + eps)` in f32, then times the weight and plus the bias.
fn layer_norm(x: &[f32], norm: &Norm, eps: f32, out: &mut [f32]) {
    let width = norm.weight.len();
    let row = |(src, dst): (&[f32], &mut [f32])| {
        let mean = (src.iter().map(|&v| f64::from(v)).sum::<f64>() / width as f64) as f32;
        let mut sum2 = 0f64;
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = v - mean;
            sum2 += f64::from(*d * *d);
        }
        let variance = (sum2 / width as f64) as f32;
        let scale = 1.0 / (variance + eps).sqrt();
        for (i, d) in dst.iter_mut().enumerate() {
            *d = *d * scale * norm.weight[i];
            if let Some(b) = &norm.bias {
                *d += b[i];
            }
        }
    };
    if x.len() / width < PARALLEL_ROWS {
        x.chunks_exact(width)
            .zip(out.chunks_exact_mut(width))
            .for_each(row);
    } else {
        x.par_chunks_exact(width)
            .zip(out.par_chunks_exact_mut(width))
            .for_each(row);
    }
}

/// GELU with the tanh approximation (SigLIP's `gelu_pytorch_tanh`, llama.cpp's `ggml_gelu`),
/// in place, in the sigmoid form of `sluice_kernels::cpu::swiglu`: `x / (1 + e^-z)` with
/// `z = 2 sqrt(2/pi) (x + 0.044715 x^3)`.
fn gelu(values: &mut [f32], width: usize) {
    let row = |r: &mut [f32]| {
        for v in r {
            let z = sigmoid_argument(GatedActivation::GeluTanh, *v);
            *v /= 1.0 + (-z).exp();
        }
    };
    if values.len() / width < PARALLEL_ROWS {
        values.chunks_exact_mut(width).for_each(row);
    } else {
        values.par_chunks_exact_mut(width).for_each(row);
    }
}

/// `v` rounded to the nearest f16 (ties to even), as an f32.
fn to_f16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

fn add(x: &mut [f32], delta: &[f32]) {
    for (a, b) in x.iter_mut().zip(delta) {
        *a += b;
    }
}

/// Each image's patch grid average-pooled in `merge x merge` squares (ggml's `pool_2d`:
/// the square summed in f32 row by row, then divided by its size): `[images * tokens, hidden]`,
/// the pooled grid row-major.
fn pool(x: &[f32], c: &TowerConfig, images: usize) -> Vec<f32> {
    let (h, side, k) = (c.hidden, c.side(), c.merge);
    let out_side = side / k;
    let mut out = vec![0f32; images * out_side * out_side * h];
    let area = (k * k) as f32;
    for (img, dst) in x
        .chunks_exact(c.patches() * h)
        .zip(out.chunks_exact_mut(out_side * out_side * h))
    {
        for (t, token) in dst.chunks_exact_mut(h).enumerate() {
            let (oy, ox) = (t / out_side, t % out_side);
            for (d, o) in token.iter_mut().enumerate() {
                let mut sum = 0f32;
                for ky in 0..k {
                    for kx in 0..k {
                        sum += img[((oy * k + ky) * side + ox * k + kx) * h + d];
                    }
                }
                *o = sum / area;
            }
        }
    }
    out
}
