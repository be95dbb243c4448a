#!/usr/bin/env python3
"""A tiny random-weight SmolLM3 GGUF (llama.cpp's `smollm3`): the weights that llama.cpp, the
oracle, and sluice both run, so that tests/fixtures/smollm3/ tests SmolLM3's one difference from
llama without the real 3B checkpoint.

    python3 scripts/tiny-smollm3.py --tokenizer models/SmolLM2-135M-Instruct.Q4_1.gguf --out models/tiny-smollm3

writes smollm3-f32.gguf (every tensor F32) and smollm3-q8_0.gguf (every weight matrix Q8_0 by
the gguf package's quantizer; the norms F32). SmolLM3 is llama's block (RMSNorm, no biases,
SwiGLU, RoPE NORM on adjacent pairs, llama's tensor names) except that every 4th layer has no
RoPE: layer il rotates Q and K iff (il + 1) % 4 != 0 (llama.cpp hard-codes the step 4;
src/models/smollm3.cpp). 4 layers here, so the last one (layer 3) attends without positions.

The same conventions as scripts/tiny-moe.py, whose helpers this imports: each tensor drawn from
its own PCG64 stream seeded by sha256("smollm3/TENSOR_NAME") (`draw`), the F32 file's matrices
rounded to Q8_0's grid so that the Q8_0 file dequantizes exactly to it (checked when writing),
the tokenizer copied from SmolLM2-135M-Instruct (Apache-2.0), and the same pinned gguf and
numpy (scripts/tiny-moe-requirements.txt); tests/fixtures/smollm3/SHA256SUMS pins the bytes.
The Q4_K_M files are made from the F32 one by llama-quantize (scripts/make-smollm3-models.sh).

--architecture llama writes the same tensors and keys as a llama (llama-FMT.gguf: RoPE in every
layer), to check that the layers without RoPE change the outputs (tests/fixtures/smollm3/README.md).
"""
import argparse
import importlib.util
import os
import sys


import gguf
from gguf import GGMLQuantizationType as QT

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("tiny_moe", os.path.join(HERE, "tiny-moe.py"))
tiny = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tiny)

ARCH = "smollm3"
N_EMBD = 256
N_LAYER = 4
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 64
N_FF = 1536
N_VOCAB = tiny.N_VOCAB
N_CTX = 4096

# tiny-moe.py's half-widths but four, so that llama.cpp's int8 activations (Q8_0 / Q8_K blocks)
# cannot turn a row's first token: a large embedding (a = 2.8, rms 1.6) that the layers only
# nudge (each adds rms ~0.25 in attention and ~0.8 in the FFN: attn_output 0.03, ffn_down 0.025,
# the residual ~2.3 after the last), so that the residual stays close to the embedding's uniform
# draw, whose blocks round with the smallest relative error, and no layer amplifies the rounding
# of the one before; and a wider output (0.75 -> 1.5: logits std ~14) for wide first-step margins.
# Among the nearby scales and FFN widths (512 to 1536) tried, these gave the widest first-step
# margins on all eight prompts in all four files; measured in tests/fixtures/smollm3/README.md.
SCALES = dict(tiny.SCALES, embd=2.8, wo=0.03, down=0.025, output=1.5)


def tensors():
    """The (name, numpy array) pairs, in the order written (numpy shape = ggml ne reversed)."""
    s = SCALES
    out = []

    def add(name, shape, a, c=0.0):
        arr = tiny.draw(ARCH, name, shape, a, c)
        if not tiny.keep_f32(name, arr):
            # Rounded to Q8_0's grid: the F32 file holds exactly what the Q8_0 file dequantizes to.
            arr = gguf.quants.dequantize(gguf.quants.quantize(arr, QT.Q8_0), QT.Q8_0)
        out.append((name, arr))

    add("token_embd.weight", (N_VOCAB, N_EMBD), s["embd"])
    for i in range(N_LAYER):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (N_EMBD,), s["norm"], 1.0)
        add(p + "attn_q.weight", (N_HEAD * HEAD_DIM, N_EMBD), s["wq"])
        add(p + "attn_k.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), s["wk"])
        add(p + "attn_v.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), s["wv"])
        add(p + "attn_output.weight", (N_EMBD, N_HEAD * HEAD_DIM), s["wo"])
        add(p + "ffn_norm.weight", (N_EMBD,), s["norm"], 1.0)
        add(p + "ffn_gate.weight", (N_FF, N_EMBD), s["gate"])
        add(p + "ffn_up.weight", (N_FF, N_EMBD), s["up"])
        add(p + "ffn_down.weight", (N_EMBD, N_FF), s["down"])
    add("output_norm.weight", (N_EMBD,), s["norm"], 1.0)
    add("output.weight", (N_VOCAB, N_EMBD), s["output"])
    return out


def write(fmt, tok, path, gguf_arch=ARCH):
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, gguf_arch)
    w.add_name(f"tiny-{ARCH}-{fmt}")
    # The keys llama.cpp's converter writes for SmolLM3 (a LlamaModel).
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(1e6)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[fmt])
    if fmt != "f32":
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tiny.add_tokenizer(w, tok)
    tiny.write_tensors(w, tensors(), fmt, tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="SmolLM2-135M-Instruct GGUF to copy the tokenizer from")
    ap.add_argument("--out", required=True, help="folder for the .gguf files")
    ap.add_argument("--format", action="append", choices=["f32", "q8_0"])
    ap.add_argument("--architecture", default=ARCH, choices=[ARCH, "llama"],
                    help="general.architecture (llama: the same weights with RoPE in every layer)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tok = tiny.tokenizer_fields(args.tokenizer)
    assert len(tok["tokens"]) == N_VOCAB, len(tok["tokens"])
    for fmt in args.format or ["f32", "q8_0"]:
        path = os.path.join(args.out, f"{args.architecture}-{fmt}.gguf")
        write(fmt, tok, path, args.architecture)
        print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
