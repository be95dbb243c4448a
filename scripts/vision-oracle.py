#!/usr/bin/env python3
"""Checks the numpy reference of the vision tower (tests/fixtures/vision/reference.json, from
scripts/vision-ref.py) against llama.cpp's own tower: each test image through libmtmd (the
library llama-server's `--mmproj` runs), called by ctypes, and its output embeddings compared
with the reference's. Needs numpy (the venv of scripts/lib/gguf-venv.sh).

    BIN=$(LLAMA_TARGETS=llama-server scripts/llama-server.sh)
    python scripts/vision-oracle.py --bin "$BIN" --models models/tiny-gemma3-vision \
        --fixtures tests/fixtures/vision

For each projector file (F32 and F16): llama.cpp's text model and projector loaded on the CPU
(2 threads, flash attention off: the tower's f32 attention), every image given as its RGB8
bytes (`mtmd_bitmap_init`), tokenized around the default media marker, its image chunk encoded
(`mtmd_encode_chunk`) and `mtmd_get_output_embd` read. Prints the largest and mean difference
per image and fails past --bound (default 2e-3). What stays between them is llama.cpp's own
f16 rounding: its CPU GELU is a table of f16 inputs and outputs, which the reference computes
in f64, and on the F16 file every product rounds its activations to f16 too (measured, on
values of rms 0.85, 2026-12-04: at most 6.2e-4 on the F32 file, 9.3e-4 on the F16 one).

The ctypes structures are those of the pinned llama.cpp (llama-cpp-python 0.3.36's vendored
tree, scripts/llama-server.sh): `llama_model_params` and `mtmd_context_params` passed by value.
"""
import argparse
import ctypes as C
import json
import os
import sys

import numpy as np


class ModelParams(C.Structure):
    _fields_ = [("devices", C.c_void_p), ("tensor_buft_overrides", C.c_void_p),
                ("n_gpu_layers", C.c_int32), ("split_mode", C.c_int), ("load_mode", C.c_int),
                ("lazy_mode", C.c_int), ("main_gpu", C.c_int32), ("tensor_split", C.c_void_p),
                ("progress_callback", C.c_void_p), ("progress_callback_user_data", C.c_void_p),
                ("kv_overrides", C.c_void_p), ("vocab_only", C.c_bool), ("check_tensors", C.c_bool),
                ("use_extra_bufts", C.c_bool), ("no_host", C.c_bool), ("no_alloc", C.c_bool),
                ("load_mtp", C.c_bool)]


class MtmdParams(C.Structure):
    _fields_ = [("use_gpu", C.c_bool), ("device", C.c_void_p), ("print_timings", C.c_bool),
                ("n_threads", C.c_int), ("image_marker", C.c_char_p), ("media_marker", C.c_char_p),
                ("flash_attn_type", C.c_int), ("warmup", C.c_bool), ("image_min_tokens", C.c_int),
                ("image_max_tokens", C.c_int), ("cb_eval", C.c_void_p), ("cb_eval_user_data", C.c_void_p),
                ("batch_max_tokens", C.c_int32), ("progress_callback", C.c_void_p),
                ("progress_callback_user_data", C.c_void_p)]


class InputText(C.Structure):
    _fields_ = [("text", C.c_char_p), ("text_len", C.c_size_t), ("add_special", C.c_bool),
                ("parse_special", C.c_bool)]


IMAGE_CHUNK = 1  # MTMD_INPUT_CHUNK_TYPE_IMAGE
FLASH_ATTN_DISABLED = 0
MTMD_FUNCTIONS = [
    ("mtmd_bitmap_init", C.c_void_p, [C.c_uint32, C.c_uint32, C.c_char_p]),
    ("mtmd_bitmap_free", None, [C.c_void_p]),
    ("mtmd_input_chunks_init", C.c_void_p, []),
    ("mtmd_input_chunks_free", None, [C.c_void_p]),
    ("mtmd_tokenize", C.c_int32, [C.c_void_p, C.c_void_p, C.POINTER(InputText), C.POINTER(C.c_void_p), C.c_size_t]),
    ("mtmd_input_chunks_size", C.c_size_t, [C.c_void_p]),
    ("mtmd_input_chunks_get", C.c_void_p, [C.c_void_p, C.c_size_t]),
    ("mtmd_input_chunk_get_type", C.c_int, [C.c_void_p]),
    ("mtmd_input_chunk_get_n_tokens", C.c_size_t, [C.c_void_p]),
    ("mtmd_encode_chunk", C.c_int32, [C.c_void_p, C.c_void_p]),
    ("mtmd_get_output_embd", C.POINTER(C.c_float), [C.c_void_p]),
    ("mtmd_default_marker", C.c_char_p, []),
    ("mtmd_free", None, [C.c_void_p]),
]


def libraries(bin_dir):
    llama = C.CDLL(os.path.join(bin_dir, "libllama.so"))
    mtmd = C.CDLL(os.path.join(bin_dir, "libmtmd.so"))
    llama.llama_model_default_params.restype = ModelParams
    llama.llama_model_load_from_file.restype = C.c_void_p
    llama.llama_model_load_from_file.argtypes = [C.c_char_p, ModelParams]
    llama.llama_model_n_embd.restype = C.c_int32
    llama.llama_model_n_embd.argtypes = [C.c_void_p]
    mtmd.mtmd_context_params_default.restype = MtmdParams
    mtmd.mtmd_init_from_file.restype = C.c_void_p
    mtmd.mtmd_init_from_file.argtypes = [C.c_char_p, C.c_void_p, MtmdParams]
    for name, restype, argtypes in MTMD_FUNCTIONS:
        f = getattr(mtmd, name)
        f.restype, f.argtypes = restype, argtypes
    llama.llama_backend_init()
    return llama, mtmd


def llama_embeddings(mtmd, ctx, rgb, width, height, n_embd):
    """llama.cpp's tower output for one RGB8 image: [tokens, n_embd]."""
    bmp = mtmd.mtmd_bitmap_init(width, height, rgb)
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        marker = mtmd.mtmd_default_marker()
        text = InputText(marker, len(marker), False, True)
        bitmaps = (C.c_void_p * 1)(bmp)
        if mtmd.mtmd_tokenize(ctx, chunks, C.byref(text), bitmaps, 1) != 0:
            sys.exit("mtmd_tokenize failed")
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) != IMAGE_CHUNK:
                continue
            n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            if mtmd.mtmd_encode_chunk(ctx, chunk) != 0:
                sys.exit("mtmd_encode_chunk failed")
            out = np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(ctx), shape=(n * n_embd,))
            return out.copy().reshape(n, n_embd)
        sys.exit("no image chunk")
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="llama.cpp's build/bin (libllama.so, libmtmd.so)")
    ap.add_argument("--models", required=True, help="the tiny pair (scripts/make-vision-models.sh)")
    ap.add_argument("--fixtures", required=True, help="tests/fixtures/vision")
    ap.add_argument("--bound", type=float, default=2e-3)
    args = ap.parse_args()
    with open(os.path.join(args.fixtures, "reference.json")) as f:
        reference = json.load(f)
    llama, mtmd = libraries(args.bin)
    params = llama.llama_model_default_params()
    params.n_gpu_layers = 0
    model = llama.llama_model_load_from_file(os.path.join(args.models, "text-f32.gguf").encode(), params)
    if not model:
        sys.exit("cannot load the text model")
    n_embd = llama.llama_model_n_embd(model)
    worst = 0.0
    for mmproj in ["mmproj-f32.gguf", "mmproj-f16.gguf"]:
        p = mtmd.mtmd_context_params_default()
        p.use_gpu, p.n_threads, p.warmup, p.print_timings = False, 2, False, False
        p.flash_attn_type = FLASH_ATTN_DISABLED
        ctx = mtmd.mtmd_init_from_file(os.path.join(args.models, mmproj).encode(), model, p)
        if not ctx:
            sys.exit(f"cannot load {mmproj}")
        for img in reference["images"]:
            with open(os.path.join(args.fixtures, img["rgb"]), "rb") as f:
                rgb = f.read()
            got = llama_embeddings(mtmd, ctx, rgb, img["width"], img["height"], n_embd)
            want = np.array(img["embeddings"], dtype=np.float32)
            if got.shape != want.shape:
                sys.exit(f"{mmproj} {img['name']}: llama.cpp gives {got.shape}, the reference {want.shape}")
            d = np.abs(got - want)
            worst = max(worst, float(d.max()))
            print(f"{mmproj} {img['name']}: llama.cpp vs the reference: largest difference "
                  f"{d.max():.2e}, mean {d.mean():.2e} (values of rms {np.sqrt((want ** 2).mean()):.2f})",
                  file=sys.stderr)
        mtmd.mtmd_free(ctx)
    if worst > args.bound:
        sys.exit(f"llama.cpp's tower stands {worst:.2e} from the reference, past {args.bound}")
    print(f"llama.cpp's tower agrees with the reference within {worst:.2e}", file=sys.stderr)


if __name__ == "__main__":
    main()
