#!/usr/bin/env python3
"""The tiny gpt-oss of scripts/tiny-moe.py as Hugging Face checkpoints (config.json and
model.safetensors, no tokenizer): the same numbers in transformers' names and layouts, so that
sluice's Hugging Face loader can be checked against its GGUF loader on one model.

    python3 scripts/tiny-gpt-oss-hf.py --out models/tiny-moe

writes gpt-oss-hf-mxfp4/, whose experts are MXFP4 as the released checkpoints hold them
(`mlp.experts.gate_up_proj_blocks` [experts, 2 * inter, hidden / 32, 16] u8, two E2M1 codes a
byte, element 2i in the low nibble; `*_scales` [experts, rows, cols / 32] E8M0;
`quantization_config.quant_method` "mxfp4"), and gpt-oss-hf-f32/, the dequantized layout
(`mlp.experts.gate_up_proj` [experts, hidden, 2 * inter], `down_proj` [experts, inter, hidden]).
In both, a gate_up's rows (or columns) alternate gate and up, and `gate_up_proj_bias` too.

Each MXFP4 block is the gguf package's quantization of the same values (tiny-moe.py rounds the
experts to MXFP4's grid, so nothing changes) with its nibbles moved to transformers' order; the
move is checked against llama.cpp's converter (`transform_nibble_layout` of
conversion/gpt_oss.py, ported to numpy here), which must give the GGUF block back.
"""
import argparse
import importlib.util
import json
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
from safetensors_writer import write_safetensors  # noqa: E402
spec = importlib.util.spec_from_file_location("tiny_moe", os.path.join(HERE, "tiny-moe.py"))
tiny = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tiny)


def to_hf_nibbles(qs):
    """GGML's 16 bytes of a block (element j in the low nibble of byte j, j + 16 in its high)
    to transformers' (elements 2i and 2i + 1 in byte i, low first)."""
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # element order, [..., 32]
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def llama_cpp_transform(t):
    """llama.cpp's `transform_nibble_layout`, torch ops written in numpy, uint8 throughout."""
    t_lo = t & 0x0F
    t_hi = t & 0xF0
    t = ((t_lo << 4) | (t_hi >> 4)).astype(np.uint8)
    a, b = t[..., :8], t[..., 8:]
    a = np.stack(((a & 0xF0), (a << 4).astype(np.uint8)), axis=-1).reshape(t.shape)
    b = np.stack(((b >> 4), (b & 0x0F)), axis=-1).reshape(t.shape)
    out = a | b
    return (((out & 0xF0) >> 4) | ((out & 0x0F) << 4)).astype(np.uint8)


def mxfp4_blocks(arr):
    """`arr` [..., rows, cols] as transformers' (blocks [..., rows, cols / 32, 16], scales
    [..., rows, cols / 32])."""
    q = gguf.quants.quantize(arr, QT.MXFP4)
    q = q.reshape(arr.shape[:-1] + (arr.shape[-1] // 32, 17))
    scales, qs = q[..., 0], q[..., 1:]
    hf = to_hf_nibbles(qs)
    assert np.array_equal(llama_cpp_transform(hf), qs), "llama.cpp's converter disagrees"
    return hf, scales.copy()


def interleave(gate, up, axis):
    """Gate and up alternating along `axis` (gate first), as transformers stores gate_up."""
    out = np.stack([gate, up], axis=axis + 1)
    shape = list(gate.shape)
    shape[axis] *= 2
    return out.reshape(shape)


def config(mxfp4):
    layers = tiny.OSS_LAYERS
    c = {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": tiny.N_EMBD,
        "intermediate_size": 256,
        "num_hidden_layers": layers,
        "num_attention_heads": tiny.N_HEAD,
        "num_key_value_heads": tiny.N_HEAD_KV,
        "head_dim": tiny.HEAD_DIM,
        "num_local_experts": tiny.OSS_EXPERTS,
        "num_experts_per_tok": tiny.OSS_USED,
        "vocab_size": tiny.N_VOCAB,
        "max_position_embeddings": tiny.N_CTX,
        "rms_norm_eps": 1e-6,
        "rope_theta": 150000.0,
        # As tiny-moe.py's GGUF says (llama.cpp always rounds the ramp: truncate).
        "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True},
        "sliding_window": tiny.OSS_WINDOW,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "attention_bias": True,
        "swiglu_limit": 7.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if mxfp4:
        c["quantization_config"] = {"quant_method": "mxfp4",
                                    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                               "model.embed_tokens", "lm_head"]}
    return c


NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight", "attn_output.bias": "self_attn.o_proj.bias",
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.weight": "mlp.router.weight", "ffn_gate_inp.bias": "mlp.router.bias",
    "ffn_down_exps.bias": "mlp.experts.down_proj_bias",
}


def hf_tensors(mxfp4):
    src = dict(tiny.gpt_oss_tensors()[2])
    out = []
    for name, hf in NAMES.items():
        out.append((hf, src[name]))
    for i in range(tiny.OSS_LAYERS):
        p, q = f"blk.{i}.", f"model.layers.{i}."
        for g, hf in LAYER_NAMES.items():
            out.append((q + hf, src[p + g]))
        gate, up, down = (src[p + f"ffn_{w}_exps.weight"] for w in ("gate", "up", "down"))
        out.append((q + "mlp.experts.gate_up_proj_bias",
                    interleave(src[p + "ffn_gate_exps.bias"], src[p + "ffn_up_exps.bias"], 1)))
        gate_up = interleave(gate, up, 1)  # [experts, 2 * inter, hidden]
        if mxfp4:
            for w, arr in (("gate_up_proj", gate_up), ("down_proj", down)):
                blocks, scales = mxfp4_blocks(arr)
                out.append((q + f"mlp.experts.{w}_blocks", blocks))
                out.append((q + f"mlp.experts.{w}_scales", scales))
        else:
            out.append((q + "mlp.experts.gate_up_proj", np.ascontiguousarray(gate_up.transpose(0, 2, 1))))
            out.append((q + "mlp.experts.down_proj", np.ascontiguousarray(down.transpose(0, 2, 1))))
    return [(n, np.ascontiguousarray(a, dtype=a.dtype)) for n, a in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder to write gpt-oss-hf-mxfp4/ and gpt-oss-hf-f32/ in")
    args = ap.parse_args()
    for mxfp4 in (True, False):
        d = os.path.join(args.out, "gpt-oss-hf-mxfp4" if mxfp4 else "gpt-oss-hf-f32")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config(mxfp4), f, indent=2)
            f.write("\n")
        write_safetensors(os.path.join(d, "model.safetensors"), hf_tensors(mxfp4))
        print(d)


if __name__ == "__main__":
    main()
