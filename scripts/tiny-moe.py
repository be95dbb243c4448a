#!/usr/bin/env python3
"""Tiny random-weight mixture-of-experts GGUF files: the weights that llama.cpp, the oracle,
and sluice both run, so that the fixtures in tests/fixtures/moe/ test MoE code without any real
checkpoint (none can be fetched here).

    python3 scripts/tiny-moe.py --tokenizer models/SmolLM2-135M-Instruct.Q4_1.gguf --out models/tiny-moe

writes, for each architecture (qwen3moe, qwen2moe, mixtral), ARCH-f32.gguf (every tensor F32)
and ARCH-q8_0.gguf (every 2-D and 3-D weight matrix quantized to Q8_0 by the gguf package's own
quantizer; norms, biases and the routers stay F32, as llama.cpp keeps them); and for gpt-oss,
gpt-oss-f32.gguf and gpt-oss-mxfp4.gguf (the experts in MXFP4, as the real files hold them, the
rest F32; the F32 file's experts rounded to MXFP4's grid, the rest to Q8_0's). gpt-oss's file
has 4 layers, local (a sliding window of 16 keys) and global in turn, YaRN (x8 over 512
positions), biases on Q, K, V, O, the router and every expert, and a sink logit a head. The F32 file's
weight matrices are drawn and then rounded to Q8_0's grid (quantized and dequantized by the same
quantizer), so the two files hold the same numbers: the Q8_0 file dequantizes exactly to the
F32 file (checked when writing). The K-quant files are made from the F32 ones by llama-quantize
(scripts/make-moe-models.sh).

Deterministic: every tensor has its own numpy PCG64 stream seeded from the sha256 of
"ARCH/TENSOR_NAME" (first 8 bytes, little-endian); its values are
(Generator.random(shape) * 2 - 1) * a + c (float64, then cast to float32), a uniform draw on
[c - a, c + a]. The same gguf and numpy versions (scripts/tiny-moe-requirements.txt) give the
same bytes; tests/fixtures/moe/SHA256SUMS pins them.

The tokenizer (BPE, 49152 tokens, merges, ChatML template) is copied from SmolLM2-135M-Instruct
(Apache-2.0), so the vocabulary is real and prompts are ordinary text.

With --harmony (gpt-oss only), gpt-oss-harmony-FMT.gguf has the same weights, and the
vocabulary and chat template of a real gpt-oss as far as its output format goes: SmolLM2's
control tokens 3..9 become Harmony's (<|start|>, <|end|>, <|message|>, <|channel|>,
<|constrain|>, <|return|>, <|call|>), EOS is <|return|>, and the chat template is gpt-oss's
own (tests/fixtures/templates/openai-gpt-oss-120b.jinja), and its context is 16384 tokens, room
for an agent client's prompt. The tests of Harmony's rendering, parsing and grammars run on it
end to end.

Scales (the half-width a of each uniform; std = a / sqrt(3)) are chosen so that greedy
outputs are decisive (top-1 usually > 0.1 nat above top-2), the router's top-k has clear
margins, and the attention and expert outputs are comparable to the residual stream (see
SCALES below and tests/fixtures/moe/README.md).
"""
import argparse
import hashlib
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

N_EMBD = 256
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 64
N_VOCAB = 49152
N_CTX = 4096

# Half-widths of the uniform draws (std = a / sqrt(3)). With x the RMS-normalized hidden state
# (rms 1, |x| = 16), a row of half-width a gives a dot product of std 16 * a / sqrt(3) = 9.24 a.
SCALES = {
    "norm": 0.25,        # norm weights: 1 +- 0.25
    # The tied model's output_norm: 3 +- 0.75, so that with a small embedding (std 0.14) its
    # logits still have std ~6.9. A large tied embedding makes each token's own logit high
    # (|e_t|^2 over rms(x)) and greedy decoding repeats one token forever.
    "norm_out_tied": 3.0,
    "embd": 1.0,         # token embedding (untied): std 0.58 in the residual
    "embd_tied": 0.25,   # qwen3moe's embedding, also its output (see "norm_out_tied")
    "output": 0.75,      # untied output: logits std ~6.9
    "wq": 0.16,          # q, k std ~1.5 before RoPE
    "wk": 0.16,
    "wv": 0.19,          # v std ~1.75
    "wo": 0.19,          # attention output comparable to the residual
    "bias": 0.5,         # q/k/v biases (qwen2moe)
    "router": 0.35,      # ffn_gate_inp: router logits std ~3.2
    "up": 0.16,          # expert up/gate: std ~1.5 pre-activation
    "gate": 0.16,
    "down": 0.2,         # expert down: expert output std ~1.5-2
    "shexp_gate": 0.25,  # qwen2moe ffn_gate_inp_shexp: sigmoid logit std ~2.3
}


def draw(arch, name, shape, a, c=0.0):
    seed = int.from_bytes(hashlib.sha256(f"{arch}/{name}".encode()).digest()[:8], "little")
    rng = np.random.Generator(np.random.PCG64(seed))
    return ((rng.random(shape) * 2.0 - 1.0) * a + c).astype(np.float32)


# gpt-oss's tiny shape: layers local and global in turn, and a window that prompts cross.
OSS_LAYERS = 4
OSS_WINDOW = 16
OSS_EXPERTS = 8
OSS_USED = 2
# Half-widths for gpt-oss's own tensors: biases small against their outputs; the sinks' logits
# comparable to the attention's scores (std ~1.5), so that a sink takes a real share.
OSS_SCALES = {
    "bias": 0.2,
    "sinks": 2.0,
    "router_bias": 0.5,
    # The clamped SwiGLU: gate and up pre-activations of std ~2.3 and ~3.2, so that a few
    # cross the clamp at 7.
    "gate": 0.25,
    "up": 0.35,
    "down": 0.12,
}


def tensors(arch):
    """The (name, numpy array) pairs of one architecture, in the order written. Numpy shapes are
    ggml's ne reversed: a matrix [out, in] is ggml ne [in, out]; the experts
    (n_expert, n_ff, n_embd) are ne [n_embd, n_ff, n_expert]."""
    if arch == "gpt-oss":
        return gpt_oss_tensors()
    s = SCALES
    n_expert = 8 if arch in ("qwen3moe", "qwen2moe") else 4
    n_ff = 256
    tied = arch == "qwen3moe"
    out = []

    def add(name, shape, a, c=0.0):
        arr = draw(arch, name, shape, a, c)
        if not keep_f32(name, arr):
            # Rounded to Q8_0's grid: the F32 file holds exactly the values that the Q8_0 file
            # dequantizes to, so both files are the same model and the F32 fixtures are an exact
            # oracle for an implementation that dequantizes the Q8_0 file.
            arr = gguf.quants.dequantize(gguf.quants.quantize(arr, QT.Q8_0), QT.Q8_0)
        out.append((name, arr))

    add("token_embd.weight", (N_VOCAB, N_EMBD), s["embd_tied"] if tied else s["embd"])
    for i in range(N_LAYER):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (N_EMBD,), s["norm"], 1.0)
        add(p + "attn_q.weight", (N_HEAD * HEAD_DIM, N_EMBD), s["wq"])
        add(p + "attn_k.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), s["wk"])
        add(p + "attn_v.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), s["wv"])
        if arch == "qwen2moe":
            add(p + "attn_q.bias", (N_HEAD * HEAD_DIM,), s["bias"])
            add(p + "attn_k.bias", (N_HEAD_KV * HEAD_DIM,), s["bias"])
            add(p + "attn_v.bias", (N_HEAD_KV * HEAD_DIM,), s["bias"])
        if arch == "qwen3moe":
            add(p + "attn_q_norm.weight", (HEAD_DIM,), s["norm"], 1.0)
            add(p + "attn_k_norm.weight", (HEAD_DIM,), s["norm"], 1.0)
        add(p + "attn_output.weight", (N_EMBD, N_HEAD * HEAD_DIM), s["wo"])
        add(p + "ffn_norm.weight", (N_EMBD,), s["norm"], 1.0)
        add(p + "ffn_gate_inp.weight", (n_expert, N_EMBD), s["router"])
        add(p + "ffn_gate_exps.weight", (n_expert, n_ff, N_EMBD), s["gate"])
        add(p + "ffn_up_exps.weight", (n_expert, n_ff, N_EMBD), s["up"])
        add(p + "ffn_down_exps.weight", (n_expert, N_EMBD, n_ff), s["down"])
        if arch == "qwen2moe":
            add(p + "ffn_gate_inp_shexp.weight", (N_EMBD,), s["shexp_gate"])
            add(p + "ffn_gate_shexp.weight", (n_ff, N_EMBD), s["gate"])
            add(p + "ffn_up_shexp.weight", (n_ff, N_EMBD), s["up"])
            add(p + "ffn_down_shexp.weight", (N_EMBD, n_ff), s["down"])
    add("output_norm.weight", (N_EMBD,), s["norm"] * (s["norm_out_tied"] if tied else 1.0),
        s["norm_out_tied"] if tied else 1.0)
    if not tied:
        add("output.weight", (N_VOCAB, N_EMBD), s["output"])
    return n_expert, n_ff, out


def gpt_oss_tensors():
    """gpt-oss's tensors (llama.cpp's names): every expert matrix rounded to MXFP4's grid, the
    other matrices to Q8_0's, vectors (norms, biases, sinks) and the routers as drawn."""
    arch, s, o = "gpt-oss", SCALES, OSS_SCALES
    n_expert, n_ff = OSS_EXPERTS, 256
    out = []

    def add(name, shape, a, c=0.0):
        arr = draw(arch, name, shape, a, c)
        if "_exps.weight" in name:
            arr = gguf.quants.dequantize(gguf.quants.quantize(arr, QT.MXFP4), QT.MXFP4)
        elif not keep_f32(name, arr):
            arr = gguf.quants.dequantize(gguf.quants.quantize(arr, QT.Q8_0), QT.Q8_0)
        out.append((name, arr))

    add("token_embd.weight", (N_VOCAB, N_EMBD), s["embd"])
    for i in range(OSS_LAYERS):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (N_EMBD,), s["norm"], 1.0)
        add(p + "attn_q.weight", (N_HEAD * HEAD_DIM, N_EMBD), s["wq"])
        add(p + "attn_q.bias", (N_HEAD * HEAD_DIM,), o["bias"])
        add(p + "attn_k.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), s["wk"])
        add(p + "attn_k.bias", (N_HEAD_KV * HEAD_DIM,), o["bias"])
        add(p + "attn_v.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), s["wv"])
        add(p + "attn_v.bias", (N_HEAD_KV * HEAD_DIM,), o["bias"])
        add(p + "attn_output.weight", (N_EMBD, N_HEAD * HEAD_DIM), s["wo"])
        add(p + "attn_output.bias", (N_EMBD,), o["bias"])
        add(p + "attn_sinks.weight", (N_HEAD,), o["sinks"])
        add(p + "post_attention_norm.weight", (N_EMBD,), s["norm"], 1.0)
        add(p + "ffn_gate_inp.weight", (n_expert, N_EMBD), s["router"])
        add(p + "ffn_gate_inp.bias", (n_expert,), o["router_bias"])
        add(p + "ffn_gate_exps.weight", (n_expert, n_ff, N_EMBD), o["gate"])
        add(p + "ffn_gate_exps.bias", (n_expert, n_ff), o["bias"])
        add(p + "ffn_up_exps.weight", (n_expert, n_ff, N_EMBD), o["up"])
        add(p + "ffn_up_exps.bias", (n_expert, n_ff), o["bias"])
        add(p + "ffn_down_exps.weight", (n_expert, N_EMBD, n_ff), o["down"])
        add(p + "ffn_down_exps.bias", (n_expert, N_EMBD), o["bias"])
    add("output_norm.weight", (N_EMBD,), s["norm"], 1.0)
    add("output.weight", (N_VOCAB, N_EMBD), s["output"])
    return n_expert, n_ff, out


def keep_f32(name, arr):
    # What llama.cpp keeps in F32 in a quantized file: 1-D tensors (norms, biases, the shared
    # expert's gate) and the routers.
    return arr.ndim < 2 or "ffn_gate_inp" in name


def tokenizer_fields(path):
    r = gguf.GGUFReader(path)

    def val(key):
        f = r.fields[key]
        return f.contents()

    return {
        "model": val("tokenizer.ggml.model"),
        "pre": val("tokenizer.ggml.pre"),
        "tokens": val("tokenizer.ggml.tokens"),
        "token_type": val("tokenizer.ggml.token_type"),
        "merges": val("tokenizer.ggml.merges"),
        "bos": val("tokenizer.ggml.bos_token_id"),
        "eos": val("tokenizer.ggml.eos_token_id"),
        "unk": val("tokenizer.ggml.unknown_token_id"),
        "pad": val("tokenizer.ggml.padding_token_id"),
        "add_bos": val("tokenizer.ggml.add_bos_token"),
        "add_space_prefix": val("tokenizer.ggml.add_space_prefix"),
        "chat_template": val("tokenizer.chat_template"),
    }


def add_tokenizer(w, tok):
    """Writes `tok` (from `tokenizer_fields`) into the GGUFWriter `w`'s key-values."""
    w.add_tokenizer_model(tok["model"])
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["token_type"])
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(tok["bos"])
    w.add_eos_token_id(tok["eos"])
    w.add_unk_token_id(tok["unk"])
    w.add_pad_token_id(tok["pad"])
    w.add_add_bos_token(tok["add_bos"])
    w.add_add_space_prefix(tok["add_space_prefix"])
    w.add_chat_template(tok["chat_template"])


HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                  "<|return|>", "<|call|>"]
HARMONY_FIRST_ID = 3
HARMONY_CTX = 16384


def harmony_tokenizer(tok):
    """`tok` with Harmony's control tokens and gpt-oss's chat template (see --harmony)."""
    tok = dict(tok)
    tokens = list(tok["tokens"])
    types = list(tok["token_type"])
    for i, t in enumerate(HARMONY_TOKENS):
        assert types[HARMONY_FIRST_ID + i] == 3, "replaces a control token"
        tokens[HARMONY_FIRST_ID + i] = t
    tok["tokens"] = tokens
    tok["token_type"] = types
    tok["eos"] = HARMONY_FIRST_ID + HARMONY_TOKENS.index("<|return|>")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "tests/fixtures/templates/openai-gpt-oss-120b.jinja")) as f:
        tok["chat_template"] = f.read()
    return tok


def write(arch, fmt, tok, path, n_ctx=N_CTX):
    n_expert, n_ff, ts = tensors(arch)
    gguf_arch = "llama" if arch == "mixtral" else arch
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, gguf_arch)
    w.add_name(f"tiny-moe-{arch}-{fmt}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(OSS_LAYERS if arch == "gpt-oss" else N_LAYER)
    if arch == "gpt-oss":
        w.add_sliding_window(OSS_WINDOW)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(8.0)
        w.add_rope_scaling_orig_ctx_len(512)
    if arch == "mixtral":
        # llama with experts: the experts are sized by feed_forward_length.
        w.add_feed_forward_length(n_ff)
    else:
        # The dense size is unused by llama.cpp for these archs (it sizes the experts by
        # expert_feed_forward_length); a value unlike the experts' catches code that reads the
        # wrong key, as in real Qwen MoE files (Qwen3-30B-A3B: 6144 vs 768).
        w.add_feed_forward_length(768)
        w.add_expert_feed_forward_length(n_ff)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(n_ff)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    if arch == "mixtral":
        w.add_rope_dimension_count(HEAD_DIM)
        w.add_layer_norm_rms_eps(1e-5)
    else:
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
        w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(150000.0 if arch == "gpt-oss" else 1e6)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(OSS_USED if arch == "gpt-oss" else 2)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type({
        "f32": gguf.LlamaFileType.ALL_F32,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        "mxfp4": gguf.LlamaFileType.MOSTLY_MXFP4_MOE,
    }[fmt])
    if fmt != "f32":
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    add_tokenizer(w, tok)

    write_tensors(w, ts, fmt, tmp, path)


def write_tensors(w, ts, fmt, tmp, path):
    """Adds the (name, array) pairs `ts` in `fmt` (MXFP4 experts, Q8_0 matrices, the rest F32,
    each quantized block checked to dequantize to the array), writes the file `tmp` and moves
    it to `path`."""
    for name, arr in ts:
        if fmt == "mxfp4" and "_exps.weight" in name:
            q = gguf.quants.quantize(arr, QT.MXFP4)
            assert np.array_equal(gguf.quants.dequantize(q, QT.MXFP4), arr), name
            w.add_tensor(name, q, raw_dtype=QT.MXFP4)
        elif fmt == "q8_0" and not keep_f32(name, arr):
            q = gguf.quants.quantize(arr, QT.Q8_0)
            assert np.array_equal(gguf.quants.dequantize(q, QT.Q8_0), arr), name
            w.add_tensor(name, q, raw_dtype=QT.Q8_0)
        else:
            w.add_tensor(name, arr)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="SmolLM2-135M-Instruct GGUF to copy the tokenizer from")
    ap.add_argument("--out", required=True, help="folder for the .gguf files")
    ap.add_argument("--arch", action="append", choices=["qwen3moe", "qwen2moe", "mixtral", "gpt-oss"])
    ap.add_argument("--format", action="append", choices=["f32", "q8_0", "mxfp4"])
    ap.add_argument("--harmony", action="store_true",
                    help="gpt-oss with Harmony's control tokens and chat template")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tok = tokenizer_fields(args.tokenizer)
    assert len(tok["tokens"]) == N_VOCAB, len(tok["tokens"])
    for arch in args.arch or ["qwen3moe", "qwen2moe", "mixtral", "gpt-oss"]:
        # gpt-oss's files hold their experts in MXFP4 (as the real ones do), the others Q8_0.
        defaults = ["f32", "mxfp4"] if arch == "gpt-oss" else ["f32", "q8_0"]
        for fmt in args.format or defaults:
            if args.harmony:
                assert arch == "gpt-oss", "--harmony is gpt-oss's vocabulary"
                path = os.path.join(args.out, f"{arch}-harmony-{fmt}.gguf")
                # Room for an agent client's prompt (Codex's is about 12k tokens).
                write(arch, fmt, harmony_tokenizer(tok), path, n_ctx=HARMONY_CTX)
            else:
                path = os.path.join(args.out, f"{arch}-{fmt}.gguf")
                write(arch, fmt, tok, path)
            print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
