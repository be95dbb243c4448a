#!/usr/bin/env python3
"""A tiny random-weight Gemma 3 with its vision tower: a `gemma3` text model and a `gemma3`
projector (llama.cpp's `--mmproj` file: SigLIP, then Gemma 3's pooling projector), the weights
that llama.cpp, the oracle, and sluice both run, so that images can be tested without a real
4B checkpoint.

    python3 scripts/tiny-gemma3-vision.py --tokenizer models/gemma-3-270m-q4_k_m.gguf \
        --out models/tiny-gemma3-vision

writes, in --out:

- text-f32.gguf: `gemma3`, 6 layers (five sliding-window layers of 512, then one global:
  llama.cpp's pattern of 6), hidden 64, 2 query heads over 1 KV head of 32, GeGLU MLP of 128.
  The tokenizer is Gemma 3's own (every `tokenizer.*` key of the 270M file copied, 262,144
  tokens with `<start_of_image>` = 255999 and `<end_of_image>` = 256000); like that file it has
  no chat template (llama.cpp and sluice fall back to Gemma's built-in one).
- mmproj-f32.gguf and mmproj-f16.gguf: `clip.projector_type` gemma3. SigLIP at 112x112 pixels in
  patches of 14 (8x8 = 64 patches), hidden 96, 4 heads of 24, 3 layers, GELU MLP of 192;
  `clip.vision.projector.scale_factor` 2, so the 8x8 patches pool 2x2 into 16 tokens an image,
  each projected to the text model's 64. The F16 file holds the matrices in f16 as llama.cpp's
  converter writes them (the embeddings and every vector in f32); the F32 file's values of those
  matrices are rounded to f16 too, so both files are the same model, bit for bit.
- mmproj-q8_0.gguf: the encoder's matrices in Q8_0 (the gguf package's quantizer, from those
  f16 values; not the same numbers), `mm.input_projection` in f16 and the rest in f32, as
  llama.cpp's converter writes a Q8_0 projector.

How llama.cpp reads these (tools/mtmd/clip.cpp, models/siglip.cpp): the keys `clip.vision.*`
below, all required except the scale factor (default 4); `v.patch_embd.weight` [96, 3, 14, 14]
(a convolution of stride 14) with its bias; `v.position_embd.weight` [64, 96]; per layer
`v.blk.N.{ln1,attn_q,attn_k,attn_v,attn_out,ln2,ffn_up,ffn_down}` with weights and biases;
`v.post_ln`; `mm.soft_emb_norm.weight` (the converter has already added Gemma's +1) and
`mm.input_projection.weight` [96, 64] (vision rows, text columns: multiplied transposed).
The MLP is 192 wide, not 96: llama.cpp swaps a Gemma 3 file's `ffn_up` and `ffn_down` when
`ffn_down` has as many columns as the hidden size, which a square MLP always has.

Scales (half-widths of uniform draws; each tensor its own PCG64 stream seeded by
sha256("ARCH/TENSOR_NAME"), scripts/tiny-moe.py's `draw`) are chosen so that greedy tokens have
clear margins (the output norm's weights near 16 make logits of std ~18 over 262,144 tokens)
and so that the image decides them: the post-attention norms (near 2) let each token's
attention output outweigh its own embedding (rms ~1.2 after Gemma's sqrt(64) scaling), and
the image tokens are most of a short prompt's keys. tests/fixtures/vision/SHA256SUMS pins the
bytes (scripts/make-vision-models.sh).
"""
import argparse
import importlib.util
import os

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("tiny_moe", os.path.join(HERE, "tiny-moe.py"))
tiny = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tiny)

# The text model.
T_EMBD = 64
T_LAYERS = 6
T_HEADS = 2
T_HEADS_KV = 1
T_HEAD_DIM = 32
T_FF = 128
T_CTX = 8192
T_WINDOW = 512
T_EPS = 1e-6

# The vision tower.
IMAGE_SIZE = 112
PATCH = 14
V_EMBD = 96
V_HEADS = 4
V_FF = 192
V_LAYERS = 3
V_EPS = 1e-6
SCALE_FACTOR = 2
IMAGE_MEAN = [0.5, 0.5, 0.5]
IMAGE_STD = [0.5, 0.5, 0.5]
N_PATCHES = (IMAGE_SIZE // PATCH) ** 2


def draw(arch, name, shape, a, c=0.0):
    return tiny.draw(arch, name, shape, a, c)


def f16_grid(x):
    """`x` rounded to f16's values, kept as f32: what an F16 file holds."""
    return x.astype(np.float16).astype(np.float32)


def text_tensors():
    """The gemma3 text model's tensors, by llama.cpp's names, in numpy (row-major) shapes."""
    out = []

    def add(name, shape, a, c=0.0):
        out.append((name, draw("gemma3-text", name, shape, a, c)))

    add("token_embd.weight", (tiny_vocab, T_EMBD), 0.25)
    q_rows, kv_rows = T_HEADS * T_HEAD_DIM, T_HEADS_KV * T_HEAD_DIM
    for i in range(T_LAYERS):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", (T_EMBD,), 0.1, 1.0)
        add(b + "attn_q.weight", (q_rows, T_EMBD), 0.2)
        add(b + "attn_k.weight", (kv_rows, T_EMBD), 0.2)
        add(b + "attn_v.weight", (kv_rows, T_EMBD), 0.2)
        add(b + "attn_q_norm.weight", (T_HEAD_DIM,), 0.1, 1.0)
        add(b + "attn_k_norm.weight", (T_HEAD_DIM,), 0.2, 1.5)
        add(b + "attn_output.weight", (T_EMBD, q_rows), 0.2)
        add(b + "post_attention_norm.weight", (T_EMBD,), 0.2, 2.0)
        add(b + "ffn_norm.weight", (T_EMBD,), 0.1, 1.0)
        add(b + "ffn_gate.weight", (T_FF, T_EMBD), 0.2)
        add(b + "ffn_up.weight", (T_FF, T_EMBD), 0.2)
        add(b + "ffn_down.weight", (T_EMBD, T_FF), 0.1)
        add(b + "post_ffw_norm.weight", (T_EMBD,), 0.1, 0.5)
    add("output_norm.weight", (T_EMBD,), 1.0, 16.0)
    return out


# Tensors the F16 file holds in f16 (llama.cpp's converter: every matrix but the embeddings;
# `mm.input_projection` always f16).
def is_f16_matrix(name):
    return name.startswith("v.blk.") and name.endswith(".weight") and "ln" not in name \
        or name == "mm.input_projection.weight"


def vision_tensors():
    """The projector's tensors in numpy shapes; the f16 matrices already on f16's grid."""
    out = []

    def add(name, shape, a, c=0.0):
        x = draw("gemma3-mmproj", name, shape, a, c)
        out.append((name, f16_grid(x) if is_f16_matrix(name) else x))

    add("v.patch_embd.weight", (V_EMBD, 3, PATCH, PATCH), 0.1)
    add("v.patch_embd.bias", (V_EMBD,), 0.1)
    add("v.position_embd.weight", (N_PATCHES, V_EMBD), 0.1)
    for i in range(V_LAYERS):
        b = f"v.blk.{i}."
        add(b + "ln1.weight", (V_EMBD,), 0.1, 1.0)
        add(b + "ln1.bias", (V_EMBD,), 0.05)
        for t in ["attn_q", "attn_k", "attn_v"]:
            add(b + t + ".weight", (V_EMBD, V_EMBD), 0.15)
            add(b + t + ".bias", (V_EMBD,), 0.05)
        add(b + "attn_out.weight", (V_EMBD, V_EMBD), 0.1)
        add(b + "attn_out.bias", (V_EMBD,), 0.05)
        add(b + "ln2.weight", (V_EMBD,), 0.1, 1.0)
        add(b + "ln2.bias", (V_EMBD,), 0.05)
        add(b + "ffn_up.weight", (V_FF, V_EMBD), 0.25)
        add(b + "ffn_up.bias", (V_FF,), 0.05)
        add(b + "ffn_down.weight", (V_EMBD, V_FF), 0.1)
        add(b + "ffn_down.bias", (V_EMBD,), 0.05)
    add("v.post_ln.weight", (V_EMBD,), 0.1, 1.0)
    add("v.post_ln.bias", (V_EMBD,), 0.05)
    add("mm.soft_emb_norm.weight", (V_EMBD,), 0.1, 1.0)
    add("mm.input_projection.weight", (V_EMBD, T_EMBD), 0.15)
    return out


def copy_tokenizer(w, path):
    """Every `tokenizer.*` key of the GGUF file `path`, with its type, into the writer `w`."""
    global tiny_vocab
    r = gguf.GGUFReader(path)
    for name, field in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        main = field.types[0]
        value = field.contents()
        if main == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, value, main, sub_type=field.types[-1])
        else:
            w.add_key_value(name, value, main)
        if name == "tokenizer.ggml.tokens":
            tiny_vocab = len(value)
            assert value[255999] == "<start_of_image>" and value[256000] == "<end_of_image>"


tiny_vocab = 0


def write_text(path, tokenizer):
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_name("tiny-gemma3-vision text")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    copy_tokenizer(w, tokenizer)
    w.add_context_length(T_CTX)
    w.add_embedding_length(T_EMBD)
    w.add_block_count(T_LAYERS)
    w.add_feed_forward_length(T_FF)
    w.add_head_count(T_HEADS)
    w.add_head_count_kv(T_HEADS_KV)
    w.add_key_length(T_HEAD_DIM)
    w.add_value_length(T_HEAD_DIM)
    w.add_layer_norm_rms_eps(T_EPS)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(T_WINDOW)
    for name, x in text_tensors():
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_mmproj(path, fmt):
    w = gguf.GGUFWriter(path, "clip")
    w.add_type("mmproj")
    w.add_name("tiny-gemma3-vision mmproj")
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[fmt])
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "gemma3")
    w.add_uint32("clip.vision.projection_dim", T_EMBD)
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
    for name, x in vision_tensors():
        if fmt == "q8_0" and is_f16_matrix(name) and name != "mm.input_projection.weight":
            q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif fmt != "f32" and is_f16_matrix(name):
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


FILES = ["text-f32", "mmproj-f32", "mmproj-f16", "mmproj-q8_0"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a Gemma 3 GGUF whose tokenizer is copied")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=FILES, help="write one file (default: all four)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    todo = [args.only] if args.only else FILES
    for what in todo:
        path = os.path.join(args.out, what + ".gguf")
        tmp = path + ".tmp"
        if what == "text-f32":
            write_text(tmp, args.tokenizer)
        else:
            write_mmproj(tmp, what.split("-")[1])
        os.replace(tmp, path)
        print(path)


if __name__ == "__main__":
    main()
