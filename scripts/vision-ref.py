#!/usr/bin/env python3
"""The numpy reference of a Gemma 3 vision tower (llama.cpp's `gemma3` projector: SigLIP, then
Gemma 3's pooling projector) and the test images, written as the fixtures of
crates/sluice-model/tests/vision.rs in tests/fixtures/vision/:

    python3 scripts/vision-ref.py --mmproj models/tiny-gemma3-vision/mmproj-f32.gguf \
        --out tests/fixtures/vision

- NAME.rgb (the image's RGB8 bytes, rows top to bottom) and NAME.png (the same pixels, for
  llama.cpp's server) for three images drawn from formulas: `gradient` 48x32 (upscaled and
  letterboxed), `checker` 112x112 (the tower's own size: copied as it is), `stripes` 240x60
  (downscaled and letterboxed);
- NAME.resized.rgb: the image after llama.cpp's resize to the tower's square (RGB8);
- reference.json: per image its size, files and the tower's output embeddings (16 tokens of
  64, `%.9g`: an f32 exactly), and `normalized`, the f32 pixel value of each byte 0-255 per
  channel, so that a preprocessed image is `normalized[c][resized[i]]` bit for bit.

The preprocessing is llama.cpp's (tools/mtmd/mtmd-image.cpp, `mtmd_image_preprocessor_fixed_size`
with Gemma 3's bilinear filter and the default padding `PAD_CEIL`), integer for integer: the
scale `min(size / w, size / h)` in f32, the new size `ceil(w * scale)` in f32 (capped at the
square), Pillow's separable bilinear filter (weights in f64, normalised per output pixel, then
fixed point with 22 fraction bits rounded half away from zero; horizontal pass then vertical,
each with a rounding bias of 2^21 and clamped to 0-255; a pass skipped where that side keeps its
length), the result centred on black with offsets `(size - new) / 2` (integer division); an
image already the square's size is copied. Then `byte / 255` and `(x - mean) / std` in f32.

The forward follows tools/mtmd/clip.cpp (`build_vit`, `build_attn`, `build_ffn`) and
models/siglip.cpp, in f64 from the f32 pixels and weights: the patch convolution (stride =
patch size) with both its operands rounded to f16 as llama.cpp's `ggml_conv_2d` rounds them
(its im2col is f16 on every backend, and the CPU's f16 product converts the kernel to f16),
plus bias, the learned position embeddings, per layer LayerNorm (mean and variance
over the row, `/ sqrt(var + eps)`, weight, bias), attention with biases (heads of
hidden/heads, scores scaled by 1/sqrt(head), softmax over every patch of the image: no mask),
residual, LayerNorm, the MLP `down(gelu_tanh(up(x)))` with biases, residual; the final
LayerNorm `v.post_ln`; then the patch grid (row-major, 8x8) average-pooled in squares of
scale_factor, RMSNorm (eps = the LayerNorm's) times `mm.soft_emb_norm.weight`, and the product
with `mm.input_projection.weight` ([vision, text]: `x @ W`).
"""
import argparse
import json
import math
import os
import struct
import zlib

import gguf
import numpy as np

PRECISION_BITS = 22


# ---- images ----

def images():
    """The test images, RGB8 arrays [height, width, 3], by name."""
    y, x = np.mgrid[0:32, 0:48]
    gradient = np.stack([x * 255 // 47, y * 255 // 31, 255 - (x + y) * 255 // 78], -1)
    y, x = np.mgrid[0:112, 0:112]
    cell = ((x // 14) + (y // 14)) % 2
    checker = np.where(cell[..., None] == 1, [230, 40, 40], [20, 20, 200])
    y, x = np.mgrid[0:60, 0:240]
    stripes = np.stack([
        127.5 + 127.5 * np.sin(x / 5.0),
        (x * 3 + y * 7) % 256,
        np.where((x // 20) % 2 == 0, 240, 16) + 0 * y,
    ], -1)
    return {
        "gradient": gradient.astype(np.uint8),
        "checker": checker.astype(np.uint8),
        "stripes": np.clip(np.rint(stripes), 0, 255).astype(np.uint8),
    }


def png_bytes(img):
    """`img` (RGB8 [h, w, 3]) as a PNG file: one IDAT, every row with filter 0."""
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) \
        + chunk(b"IEND", b"")


# ---- preprocessing (llama.cpp's, integer for integer) ----

def bilinear(x):
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def weights(in_size, out_size):
    """Pillow's coefficients for one axis: per output pixel (first input, count, int weights)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    out = []
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        ss = 1.0 / filterscale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        w = [bilinear((x + xmin - center + 0.5) * ss) for x in range(xmax)]
        ww = sum_in_order(w)
        if ww != 0.0:
            w = [v / ww for v in w]
        fixed = [int(v * float(1 << PRECISION_BITS) + (-0.5 if v < 0 else 0.5)) for v in w]
        out.append((xmin, xmax, fixed))
    return out


def sum_in_order(values):
    total = 0.0
    for v in values:
        total += v
    return total


def clip8(v):
    return min(max(v >> PRECISION_BITS, 0), 255)


def resample(img, axis_weights, axis):
    """One pass of the filter along `axis` (1: horizontal, 0: vertical) of an RGB8 image."""
    src = img.astype(np.int64)
    shape = list(img.shape)
    shape[axis] = len(axis_weights)
    out = np.zeros(shape, dtype=np.uint8)
    bias = 1 << (PRECISION_BITS - 1)
    for o, (first, count, k) in enumerate(axis_weights):
        acc = np.full(src.take(0, axis=axis).shape, bias, dtype=np.int64)
        for j in range(count):
            acc += src.take(first + j, axis=axis) * k[j]
        vals = np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8)
        if axis == 1:
            out[:, o] = vals
        else:
            out[o] = vals
    return out


def resize_pillow(img, w, h):
    sh, sw, _ = img.shape
    if w != sw:
        img = resample(img, weights(sw, w), 1)
    if h != sh:
        img = resample(img, weights(sh, h), 0)
    return img


def resize_to_square(img, size):
    """llama.cpp's resize to `size` x `size` with PAD_CEIL and black padding."""
    h, w, _ = img.shape
    if (w, h) == (size, size):
        return img.copy()
    f = np.float32
    scale = min(f(size) / f(w), f(size) / f(h))
    nw = min(int(math.ceil(f(w) * scale)), size)
    nh = min(int(math.ceil(f(h) * scale)), size)
    resized = resize_pillow(img, nw, nh)
    out = np.zeros((size, size, 3), dtype=np.uint8)
    ox, oy = (size - nw) // 2, (size - nh) // 2
    out[oy:oy + nh, ox:ox + nw] = resized
    return out


def normalized_table(mean, std):
    """The f32 pixel value of each byte, per channel: `(b / 255 - mean) / std` in f32."""
    f = np.float32
    b = np.arange(256, dtype=np.float32) / f(255.0)
    return [((b - f(m)) / f(s)).astype(np.float32) for m, s in zip(mean, std)]


# ---- the tower ----

class Mmproj:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        self.meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
        self.t = {}
        for t in r.tensors:
            a = np.array(t.data)
            if t.tensor_type == gguf.GGMLQuantizationType.F16:
                a = a.astype(np.float32)
            assert a.dtype == np.float32, f"{t.name}: {t.tensor_type.name}"
            self.t[t.name] = a.reshape([int(d) for d in reversed(t.shape)]).astype(np.float64)
        assert self.meta["clip.projector_type"] == "gemma3"
        self.size = self.meta["clip.vision.image_size"]
        self.patch = self.meta["clip.vision.patch_size"]
        self.embd = self.meta["clip.vision.embedding_length"]
        self.heads = self.meta["clip.vision.attention.head_count"]
        self.layers = self.meta["clip.vision.block_count"]
        self.eps = self.meta["clip.vision.attention.layer_norm_epsilon"]
        self.merge = self.meta.get("clip.vision.projector.scale_factor", 4)
        self.mean = self.meta["clip.vision.image_mean"]
        self.std = self.meta["clip.vision.image_std"]


def f16(x):
    """`x` rounded to f16's values (ties to even)."""
    return x.astype(np.float16).astype(np.float64)


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def encode(m, pixels):
    """The tower on one preprocessed image (f32 [size, size, 3] interleaved): [tokens, text]."""
    t, p, n = m.t, m.patch, m.size // m.patch
    img = pixels.astype(np.float64).reshape(m.size, m.size, 3).transpose(2, 0, 1)  # [3, H, W]
    # im2col: patch (py, px) row-major, its values in the kernel's [3, p, p] order.
    cols = img.reshape(3, n, p, n, p).transpose(1, 3, 0, 2, 4).reshape(n * n, 3 * p * p)
    # llama.cpp's convolution multiplies in f16 (its im2col is f16, and the f16 product rounds
    # the kernel to f16 too), summing in f32.
    cols = f16(cols)
    kernel = f16(t["v.patch_embd.weight"].reshape(m.embd, -1))
    x = cols @ kernel.T + t["v.patch_embd.bias"]
    x = x + t["v.position_embd.weight"]
    d = m.embd // m.heads
    for i in range(m.layers):
        b = f"v.blk.{i}."
        h = layer_norm(x, t[b + "ln1.weight"], t[b + "ln1.bias"], m.eps)
        q, k, v = (h @ t[b + f"attn_{s}.weight"].T + t[b + f"attn_{s}.bias"] for s in "qkv")
        heads = []
        for j in range(m.heads):
            qs, ks, vs = (a[:, j * d:(j + 1) * d] for a in (q, k, v))
            s = qs @ ks.T / math.sqrt(d)
            s = np.exp(s - s.max(-1, keepdims=True))
            heads.append((s / s.sum(-1, keepdims=True)) @ vs)
        a = np.concatenate(heads, -1) @ t[b + "attn_out.weight"].T + t[b + "attn_out.bias"]
        x = x + a
        h = layer_norm(x, t[b + "ln2.weight"], t[b + "ln2.bias"], m.eps)
        h = gelu_tanh(h @ t[b + "ffn_up.weight"].T + t[b + "ffn_up.bias"])
        x = x + h @ t[b + "ffn_down.weight"].T + t[b + "ffn_down.bias"]
    x = layer_norm(x, t["v.post_ln.weight"], t["v.post_ln.bias"], m.eps)
    k, o = m.merge, n // m.merge
    pooled = x.reshape(o, k, o, k, m.embd).mean((1, 3)).reshape(o * o, m.embd)
    rms = np.sqrt((pooled ** 2).mean(-1, keepdims=True) + m.eps)
    normed = pooled / rms * t["mm.soft_emb_norm.weight"]
    return normed @ t["mm.input_projection.weight"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mmproj", required=True, help="the F32 projector file")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    m = Mmproj(args.mmproj)
    table = normalized_table(m.mean, m.std)
    os.makedirs(args.out, exist_ok=True)
    entries = []
    for name, img in images().items():
        h, w, _ = img.shape
        with open(os.path.join(args.out, f"{name}.rgb"), "wb") as f:
            f.write(img.tobytes())
        with open(os.path.join(args.out, f"{name}.png"), "wb") as f:
            f.write(png_bytes(img))
        resized = resize_to_square(img, m.size)
        with open(os.path.join(args.out, f"{name}.resized.rgb"), "wb") as f:
            f.write(resized.tobytes())
        pixels = np.stack([table[c][resized[..., c]] for c in range(3)], -1)
        emb = encode(m, pixels)
        entries.append({
            "name": name, "width": w, "height": h,
            "rgb": f"{name}.rgb", "png": f"{name}.png", "resized": f"{name}.resized.rgb",
            "embeddings": [[float("%.9g" % np.float32(v)) for v in row] for row in emb],
        })
        print(f"{name}: {w}x{h}, embeddings {emb.shape}, rms {np.sqrt((emb ** 2).mean()):.3f}")
    for a in range(len(entries)):
        for b in range(a + 1, len(entries)):
            ea, eb = (np.array(entries[i]["embeddings"]) for i in (a, b))
            print(f"{entries[a]['name']} vs {entries[b]['name']}: rms difference "
                  f"{np.sqrt(((ea - eb) ** 2).mean()):.3f}")
    doc = {
        "mmproj": os.path.basename(args.mmproj),
        "image_size": m.size,
        "tokens_per_image": (m.size // m.patch // m.merge) ** 2,
        "normalized": [[float("%.9g" % v) for v in ch] for ch in table],
        "images": entries,
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
