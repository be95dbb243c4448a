#!/usr/bin/env python3
"""Record the MoE fixtures (tests/fixtures/moe/ARCH-FORMAT-greedy.jsonl) with llama.cpp's
server as the oracle, on the tiny models of scripts/make-moe-models.sh. Standard library only.

    scripts/moe-fixtures.sh     # = the three steps:
    MODELS=$(scripts/make-moe-models.sh)
    BIN=$(LLAMA_TARGETS="llama-server llama-quantize" scripts/llama-server.sh)
    python3 scripts/moe-fixtures.py --bin "$BIN" --models "$MODELS" --out tests/fixtures/moe

For each model file, `record_file` of scripts/lib/llama_oracle.py (shared with
scripts/smollm3-fixtures.py): one llama-server (-t 2, one slot; KV cache f32 and flash attention
off, so that F32 files run in exact f32 arithmetic), and for each of its PROMPTS: /tokenize (no
BOS, add_special false) for prompt_ids, then /completion on those ids, greedy (temperature 0),
32 tokens, n_probs 5 with post_sampling_probs false (so logprobs are log-softmax of the raw
logits, before any sampler), cache_prompt false. A row per prompt, in the format of
tests/fixtures/README.md. Steps whose probabilities the server leaves out (a token that ends in
an incomplete UTF-8 sequence) are taken from a one-token request on the same prefix (`alone`).
Prints a summary per file (distinct tokens, top-1 margins) on stderr.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from llama_oracle import record_file  # noqa: E402

ARCHS = ["qwen3moe", "qwen2moe", "mixtral", "gpt-oss"]
FORMATS = ["f32", "q8_0", "q4_k_m", "q4_k_m-f32", "mxfp4"]
# The formats each architecture's files come in (scripts/make-moe-models.sh).
ARCH_FORMATS = {
    "qwen3moe": ["f32", "q8_0", "q4_k_m", "q4_k_m-f32"],
    "qwen2moe": ["f32", "q8_0", "q4_k_m", "q4_k_m-f32"],
    "mixtral": ["f32", "q8_0", "q4_k_m", "q4_k_m-f32"],
    # gpt-oss: F32, and its experts in MXFP4 as the real files hold them. Its window of 16
    # keys is crossed by every prompt but the first four, many times by the long ones.
    "gpt-oss": ["f32", "mxfp4"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder with llama-server (scripts/llama-server.sh)")
    ap.add_argument("--models", required=True, help="folder with the tiny MoE GGUF files")
    ap.add_argument("--out", required=True, help="fixtures folder (tests/fixtures/moe)")
    ap.add_argument("--port", type=int, default=18291)
    ap.add_argument("--arch", action="append", choices=ARCHS)
    ap.add_argument("--format", action="append", choices=FORMATS)
    ap.add_argument("--server-args", default="", help="more llama-server arguments (for experiments)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for arch in args.arch or ARCHS:
        for fmt in args.format or ARCH_FORMATS[arch]:
            if fmt not in ARCH_FORMATS[arch]:
                continue
            record_file(args.bin, os.path.join(args.models, f"{arch}-{fmt}.gguf"),
                        os.path.join(args.out, f"{arch}-{fmt}-greedy.jsonl"), args.port,
                        args.server_args.split())


if __name__ == "__main__":
    main()
