#!/usr/bin/env python3
"""A random-weight `gemma3` projector (llama.cpp's `--mmproj` file) of the real Gemma 3 vision
tower's shape, SigLIP-400M, so that issue 72's speed target can be measured against llama.cpp's
server without downloading a checkpoint:

    "$(scripts/lib/gguf-venv.sh)" scripts/synth-mmproj.py [--text-hidden 640] \
        [--out /tmp/mmproj-siglip400m.gguf]

The shape is Gemma 3 4B's (and 12B's, 27B's) tower: 896x896 pixels in patches of 14 (64x64 =
4096 patches), hidden 1152, GELU MLP of 4304, 27 layers of 16 heads (72 each), layer-norm eps
1e-6, `clip.vision.projector.scale_factor` 4 (the 64x64 patches pool 4x4 into 256 tokens an
image), then Gemma's RMS norm and a projection into `--text-hidden`: 640 by default (Gemma 3
270M's hidden size, so that models/gemma-3-270m-q4_k_m.gguf can be the text model), 2560 for
Gemma 3 4B's. The tower is almost all of an image's cost; the projection is one 1152 x hidden
product over 256 rows.

Keys and tensor names are exactly scripts/tiny-gemma3-vision.py's (known to load in both
llama.cpp and sluice). Storage is a published `mmproj-*-f16.gguf`'s as that writer's F16 file
has it: the encoder's matrices and `mm.input_projection` in f16, the patch and position
embeddings, norms and biases in f32.

Scales: uniform draws (each tensor its own PCG64 stream seeded by sha256("ARCH/NAME"),
scripts/tiny-moe.py's `draw`) of half-width a = g * sqrt(3 / fan_in), so a product of unit
inputs has std g: q, k, v and ffn_up g = 1 (after each layer norm), attn_out and ffn_down
g = 0.3 of their inputs' size, so the 54 residual additions grow the stream to a few units
and nothing overflows f16 or f32. The patch convolution (fan-in 3*14*14) gives std ~0.5 for
pixels in [-1, 1].
"""
import argparse
import importlib.util
import math
import os

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("tiny_moe", os.path.join(HERE, "tiny-moe.py"))
tiny = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tiny)

IMAGE_SIZE = 896
PATCH = 14
V_EMBD = 1152
V_HEADS = 16
V_FF = 4304
V_LAYERS = 27
V_EPS = 1e-6
SCALE_FACTOR = 4
IMAGE_MEAN = [0.5, 0.5, 0.5]
IMAGE_STD = [0.5, 0.5, 0.5]
N_PATCHES = (IMAGE_SIZE // PATCH) ** 2
ARCH = "gemma3-siglip400m-mmproj"


def is_f16_matrix(name):
    """scripts/tiny-gemma3-vision.py's rule: every encoder matrix and the input projection."""
    return name.startswith("v.blk.") and name.endswith(".weight") and "ln" not in name \
        or name == "mm.input_projection.weight"


def half_width(gain, fan_in):
    return gain * math.sqrt(3.0 / fan_in)


def tensors(text_hidden):
    """(name, numpy array) in numpy (row-major) shapes, one at a time."""
    def t(name, shape, a, c=0.0):
        x = tiny.draw(ARCH, name, shape, a, c)
        return name, (x.astype(np.float16) if is_f16_matrix(name) else x)

    yield t("v.patch_embd.weight", (V_EMBD, 3, PATCH, PATCH), half_width(1.0, 3 * PATCH * PATCH))
    yield t("v.patch_embd.bias", (V_EMBD,), 0.05)
    yield t("v.position_embd.weight", (N_PATCHES, V_EMBD), 0.2)
    for i in range(V_LAYERS):
        b = f"v.blk.{i}."
        yield t(b + "ln1.weight", (V_EMBD,), 0.1, 1.0)
        yield t(b + "ln1.bias", (V_EMBD,), 0.05)
        for m in ["attn_q", "attn_k", "attn_v"]:
            yield t(b + m + ".weight", (V_EMBD, V_EMBD), half_width(1.0, V_EMBD))
            yield t(b + m + ".bias", (V_EMBD,), 0.05)
        yield t(b + "attn_out.weight", (V_EMBD, V_EMBD), half_width(0.3, V_EMBD))
        yield t(b + "attn_out.bias", (V_EMBD,), 0.02)
        yield t(b + "ln2.weight", (V_EMBD,), 0.1, 1.0)
        yield t(b + "ln2.bias", (V_EMBD,), 0.05)
        yield t(b + "ffn_up.weight", (V_FF, V_EMBD), half_width(1.0, V_EMBD))
        yield t(b + "ffn_up.bias", (V_FF,), 0.05)
        # GELU of unit inputs has rms ~0.65: 0.3 / 0.65 of it.
        yield t(b + "ffn_down.weight", (V_EMBD, V_FF), half_width(0.3 / 0.65, V_FF))
        yield t(b + "ffn_down.bias", (V_EMBD,), 0.02)
    yield t("v.post_ln.weight", (V_EMBD,), 0.1, 1.0)
    yield t("v.post_ln.bias", (V_EMBD,), 0.05)
    yield t("mm.soft_emb_norm.weight", (V_EMBD,), 0.1, 1.0)
    yield t("mm.input_projection.weight", (V_EMBD, text_hidden), half_width(1.0, V_EMBD))


def write(path, text_hidden):
    w = gguf.GGUFWriter(path, "clip")
    w.add_type("mmproj")
    w.add_name("synthetic gemma3 siglip-400m mmproj")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "gemma3")
    w.add_uint32("clip.vision.projection_dim", text_hidden)
    w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    w.add_uint32("clip.vision.patch_size", PATCH)
    w.add_uint32("clip.vision.embedding_length", V_EMBD)
    w.add_uint32("clip.vision.feed_forward_length", V_FF)
    w.add_uint32("clip.vision.block_count", V_LAYERS)
    w.add_uint32("clip.vision.attention.head_count", V_HEADS)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", V_EPS)
    w.add_array("clip.vision.image_mean", IMAGE_MEAN)
    w.add_array("clip.vision.image_std", IMAGE_STD)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.projector.scale_factor", SCALE_FACTOR)
    for name, x in tensors(text_hidden):
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text-hidden", type=int, default=640,
                    help="the text model's hidden size (640: Gemma 3 270M; 2560: Gemma 3 4B)")
    ap.add_argument("--out", default="/tmp/mmproj-siglip400m.gguf")
    args = ap.parse_args()
    tmp = args.out + ".tmp"
    write(tmp, args.text_hidden)
    os.replace(tmp, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
