#!/usr/bin/env python3
"""Tiny random-weight Qwen3.5 hybrids (llama.cpp's `qwen35` and `qwen35moe`) and Qwen3-Next
(`qwen3next`): the weights that
llama.cpp, the oracle, and sluice both run, so that tests/fixtures/qwen35/ tests the Gated
DeltaNet layers, their recurrent state and the gated full-attention layers without a real
checkpoint.

    python3 scripts/tiny-qwen35.py --tokenizer models/SmolLM2-135M-Instruct.Q4_1.gguf --out models/tiny-qwen35

writes ARCH-f32.gguf and ARCH-q8_0.gguf for the three architectures. The shape
is the real models' at a small size (llama.cpp's src/models/qwen35.cpp, qwen35moe.cpp and
delta-net-base.cpp read every key and tensor written here):

- 8 layers, `full_attention_interval` 4: layers 3 and 7 are full attention, the other six Gated
  DeltaNet layers (llama.cpp's rule when the file has no `attention.recurrent_layers`);
- DeltaNet: 2 key heads and 4 value heads of 32 (`ssm.group_count`, `ssm.time_step_rank`,
  `ssm.state_size`, `ssm.inner_size` 128), a causal conv of 4 taps over the 256 channels of
  q, k and v; v heads in llama.cpp's tiled order (v head h reads k head h mod 2, as its
  converter reorders them);
- full attention: 4 query heads over 2 KV heads of 64, each query head followed by its output
  gate in `attn_q` (512 rows), QK-norm, RoPE on the first 16 dimensions of a head
  (`rope.dimension_count`, NEOX pairs; `rope.dimension_sections` [3, 3, 2, 0] for text);
- the MLP: dense SwiGLU (qwen35), or 8 experts, 2 a token, softmax then renormalised, beside a
  shared expert with a sigmoid gate (qwen35moe, qwen3next);
- qwen3next (llama.cpp's src/models/qwen3next.cpp): qwen35moe's layers with the v heads in the
  checkpoint's grouped order (v head h reads k head h div 2: its converter does not reorder
  them), beta and alpha in one `ssm_ba` of `[b (2 rows), a (2 rows)]` a key head, and no
  `rope.dimension_sections` (plain NEOX RoPE on `rope.dimension_count`).

The conventions of scripts/tiny-moe.py, whose helpers this imports: each tensor drawn from its
own PCG64 stream seeded by sha256("ARCH/TENSOR_NAME") (`draw`), the F32 file's matrices rounded
to Q8_0's grid so that the Q8_0 file dequantizes exactly to it (checked when writing), the
tokenizer copied from SmolLM2-135M-Instruct (Apache-2.0), the same pinned gguf and numpy;
tests/fixtures/qwen35/SHA256SUMS pins the bytes. What stays F32 in the Q8_0 file: vectors, the
routers and the conv kernel (rows of 4 values, less than a Q8_0 block), as llama.cpp keeps them.
"""
import argparse
import importlib.util
import os
import sys

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("tiny_moe", os.path.join(HERE, "tiny-moe.py"))
tiny = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tiny)

ARCHS = ["qwen35", "qwen35moe", "qwen3next"]
N_EMBD = 256
N_LAYER = 8
FULL_ATTENTION_INTERVAL = 4
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 64
N_ROT = 16
SECTIONS = [3, 3, 2, 0]
N_FF = 512
N_VOCAB = tiny.N_VOCAB
N_CTX = 4096
# Gated DeltaNet.
D_CONV = 4
S = 32  # head size of keys and values (ssm.state_size)
H_K = 2  # key heads (ssm.group_count)
H_V = 4  # value heads (ssm.time_step_rank)
KEY_DIM = S * H_K
VALUE_DIM = S * H_V
CONV_DIM = 2 * KEY_DIM + VALUE_DIM
# The mixture.
N_EXPERT = 8
N_EXPERT_USED = 2
N_FF_EXP = 256
N_FF_SHEXP = 256

# Half-widths (std = a / sqrt(3)), tiny-moe.py's where the layer is the same. The DeltaNet
# projections as the attention's; the conv taps ~N(0, 0.5) as a 4-tap kernel's init; alpha and
# dt so that the decay exp(-exp(A_log) softplus(alpha + dt)) spreads over 0.3-0.97 (states
# that remember tens of tokens, not one or thousands); beta's logits of std ~1.5.
SCALES = dict(tiny.SCALES, embd=2.8, wo=0.03, down=0.025, ssm_out=0.03, output=1.5, router=0.7,
              qkv=0.16, z=0.2, beta=0.16, alpha=0.08, conv=0.6, dt=0.5, a_lo=0.1, a_hi=1.2,
              ssm_norm=0.25, attn_gate=0.16)


def keep_f32(name, arr):
    """What stays F32 in the Q8_0 file: vectors, the routers and the conv kernel."""
    return arr.ndim < 2 or "ffn_gate_inp" in name or "ssm_conv1d" in name


def is_recurrent(layer):
    return (layer + 1) % FULL_ATTENTION_INTERVAL != 0


def tensors(arch):
    """The (name, numpy array) pairs, in the order written (numpy shape = ggml ne reversed)."""
    s = SCALES
    out = []

    def add(name, shape, a, c=0.0):
        arr = tiny.draw(arch, name, shape, a, c)
        if not keep_f32(name, arr):
            arr = gguf.quants.dequantize(gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0),
                                         gguf.GGMLQuantizationType.Q8_0)
        out.append((name, arr))

    add("token_embd.weight", (N_VOCAB, N_EMBD), s["embd"])
    for i in range(N_LAYER):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (N_EMBD,), s["norm"], 1.0)
        if is_recurrent(i):
            add(p + "attn_qkv.weight", (CONV_DIM, N_EMBD), s["qkv"])
            add(p + "attn_gate.weight", (VALUE_DIM, N_EMBD), s["z"])
            add(p + "ssm_conv1d.weight", (CONV_DIM, D_CONV), s["conv"])
            add(p + "ssm_dt.bias", (H_V,), s["dt"])
            # -exp(A_log), as llama.cpp's converter stores it: in [-a_hi, -a_lo].
            add(p + "ssm_a", (H_V,), (s["a_hi"] - s["a_lo"]) / 2, -(s["a_hi"] + s["a_lo"]) / 2)
            add(p + "ssm_beta.weight", (H_V, N_EMBD), s["beta"])
            add(p + "ssm_alpha.weight", (H_V, N_EMBD), s["alpha"])
            if arch == "qwen3next":
                # One ssm_ba, each key head's beta rows then its alpha rows (Q8_0's rounding is
                # a row's, so interleaving the rounded rows is rounding the interleaved ones).
                (_, alpha), (_, beta) = out.pop(), out.pop()
                per_key = H_V // H_K
                rows = []
                for kh in range(H_K):
                    rows.append(beta[kh * per_key:(kh + 1) * per_key])
                    rows.append(alpha[kh * per_key:(kh + 1) * per_key])
                out.append((p + "ssm_ba.weight", np.concatenate(rows).astype(np.float32)))
            add(p + "ssm_norm.weight", (S,), s["ssm_norm"], 1.0)
            add(p + "ssm_out.weight", (N_EMBD, VALUE_DIM), s["ssm_out"])
        else:
            add(p + "attn_q.weight", (2 * N_HEAD * HEAD_DIM, N_EMBD), s["wq"])
            add(p + "attn_k.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), s["wk"])
            add(p + "attn_v.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), s["wv"])
            add(p + "attn_q_norm.weight", (HEAD_DIM,), s["norm"], 1.0)
            add(p + "attn_k_norm.weight", (HEAD_DIM,), s["norm"], 1.0)
            add(p + "attn_output.weight", (N_EMBD, N_HEAD * HEAD_DIM), s["wo"])
        add(p + "post_attention_norm.weight", (N_EMBD,), s["norm"], 1.0)
        if arch == "qwen35":
            add(p + "ffn_gate.weight", (N_FF, N_EMBD), s["gate"])
            add(p + "ffn_up.weight", (N_FF, N_EMBD), s["up"])
            add(p + "ffn_down.weight", (N_EMBD, N_FF), s["down"])
        else:
            add(p + "ffn_gate_inp.weight", (N_EXPERT, N_EMBD), s["router"])
            add(p + "ffn_gate_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), s["gate"])
            add(p + "ffn_up_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), s["up"])
            add(p + "ffn_down_exps.weight", (N_EXPERT, N_EMBD, N_FF_EXP), s["down"])
            add(p + "ffn_gate_inp_shexp.weight", (N_EMBD,), s["shexp_gate"])
            add(p + "ffn_gate_shexp.weight", (N_FF_SHEXP, N_EMBD), s["gate"])
            add(p + "ffn_up_shexp.weight", (N_FF_SHEXP, N_EMBD), s["up"])
            add(p + "ffn_down_shexp.weight", (N_EMBD, N_FF_SHEXP), s["down"])
    add("output_norm.weight", (N_EMBD,), s["norm"], 1.0)
    # A spread of output-row norms (0.5x to 1.5x), or the first tokens tie on random hybrids
    # (tests/fixtures/qwen35/README.md): each row scaled by its own factor.
    out_w = tiny.draw(arch, "output.weight", (N_VOCAB, N_EMBD), s["output"])
    spread = tiny.draw(arch, "output.weight/spread", (N_VOCAB, 1), 0.5, 1.0)
    out_w = (out_w * spread).astype(np.float32)
    out_w = gguf.quants.dequantize(gguf.quants.quantize(out_w, gguf.GGMLQuantizationType.Q8_0),
                                   gguf.GGMLQuantizationType.Q8_0)
    out.append(("output.weight", out_w))
    return out


def write(arch, fmt, tok, path):
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    w.add_name(f"tiny-{arch}-{fmt}")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(N_ROT)
    if arch != "qwen3next":
        w.add_rope_dimension_sections(SECTIONS)
    w.add_rope_freq_base(1e7)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(N_VOCAB)
    w.add_ssm_conv_kernel(D_CONV)
    w.add_ssm_state_size(S)
    w.add_ssm_group_count(H_K)
    w.add_ssm_time_step_rank(H_V)
    w.add_ssm_inner_size(VALUE_DIM)
    w.add_full_attention_interval(FULL_ATTENTION_INTERVAL)
    if arch != "qwen35":
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_EXPERT_USED)
        w.add_expert_feed_forward_length(N_FF_EXP)
        w.add_expert_shared_feed_forward_length(N_FF_SHEXP)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[fmt])
    if fmt != "f32":
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tiny.add_tokenizer(w, tok)
    tiny.write_tensors(w, tensors(arch), fmt, tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="SmolLM2-135M-Instruct GGUF to copy the tokenizer from")
    ap.add_argument("--out", required=True, help="folder for the .gguf files")
    ap.add_argument("--arch", action="append", choices=ARCHS)
    ap.add_argument("--format", action="append", choices=["f32", "q8_0"])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tok = tiny.tokenizer_fields(args.tokenizer)
    assert len(tok["tokens"]) == N_VOCAB, len(tok["tokens"])
    # write_tensors asks tiny-moe.py's keep_f32 which tensors stay F32: ours keeps the conv too.
    tiny.keep_f32 = keep_f32
    for arch in args.arch or ARCHS:
        for fmt in args.format or ["f32", "q8_0"]:
            path = os.path.join(args.out, f"{arch}-{fmt}.gguf")
            write(arch, fmt, tok, path)
            print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
