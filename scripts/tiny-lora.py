#!/usr/bin/env python3
"""A random LoRA adapter for SmolLM2-135M-Instruct (the default model), in llama.cpp's GGUF
layout and in PEFT's, the same numbers: the adapter of tests/fixtures/lora/ (llama.cpp's server
with `--lora` on the base file is the oracle).

    python3 scripts/tiny-lora.py --base models/SmolLM2-135M-Instruct.Q4_1.gguf --out models/lora

writes smollm2-r16.gguf (`general.type` adapter, `adapter.type` lora, `adapter.lora.alpha` 32;
F32 `blk.N.<attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down>.weight.lora_a` [rank,
in] and `.lora_b` [out, rank] in numpy's order) and smollm2-r16-peft/ (`adapter_config.json`,
`adapter_model.safetensors` with `base_model.model.model.layers.N.<module>.lora_A.weight`).
Rank 16 on all seven projections of all 30 layers. The Q and K `lora_b` rows of the GGUF file
are permuted as llama.cpp's converters permute llama Q/K weights (its base file's and
`convert_lora_to_gguf.py`'s); the PEFT copy keeps Hugging Face's order.

Deterministic: each tensor has its own numpy PCG64 stream seeded from the sha256 of
"smollm2-r16/NAME" (first 8 bytes, little-endian; `--name` changes the prefix, the files' names
with it: `--name smollm2-r16-b` is a second adapter of other numbers), values uniform on [-a, a]: A's a is
1/sqrt(in) (unit-sized projections of the input), B's 0.1, so that alpha/rank = 2 moves the
base's logits by a few tenths of a nat and the greedy text changes but stays text.
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

import gguf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from safetensors_writer import write_safetensors  # noqa: E402

NAME = "smollm2-r16"
RANK = 16
ALPHA = 32.0
B_HALF_WIDTH = 0.1
# (PEFT module path, llama.cpp name)
MODULES = [
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
]


def draw(name, shape, a):
    seed = int.from_bytes(hashlib.sha256(f"{NAME}/{name}".encode()).digest()[:8], "little")
    rng = np.random.Generator(np.random.PCG64(seed))
    return ((rng.random(shape) * 2 - 1) * a).astype(np.float32)


def permute(rows, n_head):
    """llama.cpp's `permute` of a llama Q/K matrix's rows (convert_hf_to_gguf.py)."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def base_shape(path):
    r = gguf.GGUFReader(path)

    def val(key):
        return r.fields[key].contents()

    arch = val("general.architecture")
    hidden, inter = val(f"{arch}.embedding_length"), val(f"{arch}.feed_forward_length")
    heads, kv_heads, layers = val(f"{arch}.attention.head_count"), val(f"{arch}.attention.head_count_kv"), val(f"{arch}.block_count")
    head_dim = hidden // heads
    shapes = {  # (in, out)
        "attn_q": (hidden, heads * head_dim),
        "attn_k": (hidden, kv_heads * head_dim),
        "attn_v": (hidden, kv_heads * head_dim),
        "attn_output": (heads * head_dim, hidden),
        "ffn_gate": (hidden, inter),
        "ffn_up": (hidden, inter),
        "ffn_down": (inter, hidden),
    }
    return arch, layers, heads, kv_heads, shapes


def main():
    global NAME
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True,
                    help="the base GGUF, for its shapes (SmolLM2-135M-Instruct; any llama or qwen2 file)")
    ap.add_argument("--out", required=True, help="folder for the adapter files")
    ap.add_argument("--name", default=NAME,
                    help="file names and seed prefix: another name, other numbers [default: smollm2-r16]")
    args = ap.parse_args()
    NAME = args.name
    arch, layers, heads, kv_heads, shapes = base_shape(args.base)
    os.makedirs(args.out, exist_ok=True)

    gguf_path = os.path.join(args.out, f"{NAME}.gguf")
    w = gguf.GGUFWriter(gguf_path + ".tmp", arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, ALPHA)
    peft = []
    for i in range(layers):
        for module, short in MODULES:
            inputs, outputs = shapes[short]
            a = draw(f"blk.{i}.{short}.lora_a", (RANK, inputs), 1.0 / np.sqrt(inputs))
            b = draw(f"blk.{i}.{short}.lora_b", (outputs, RANK), B_HALF_WIDTH)
            peft.append((f"base_model.model.model.layers.{i}.{module}.lora_A.weight", a))
            peft.append((f"base_model.model.model.layers.{i}.{module}.lora_B.weight", b))
            # Only llama's Q/K rows are permuted by llama.cpp's converters (qwen2's are not).
            if arch == "llama" and short == "attn_q":
                b = permute(b, heads)
            elif arch == "llama" and short == "attn_k":
                b = permute(b, kv_heads)
            w.add_tensor(f"blk.{i}.{short}.weight.lora_a", a)
            w.add_tensor(f"blk.{i}.{short}.weight.lora_b", np.ascontiguousarray(b))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(gguf_path + ".tmp", gguf_path)
    print(gguf_path)

    peft_dir = os.path.join(args.out, f"{NAME}-peft")
    os.makedirs(peft_dir, exist_ok=True)
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
        "target_modules": [m.split(".")[1] for m, _ in MODULES], "lora_dropout": 0.0,
        "bias": "none", "use_rslora": False, "use_dora": False, "fan_in_fan_out": False,
        "modules_to_save": None, "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }
    with open(os.path.join(peft_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(peft_dir, "adapter_model.safetensors"), peft)
    print(peft_dir)


if __name__ == "__main__":
    main()
