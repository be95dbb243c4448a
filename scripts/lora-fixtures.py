#!/usr/bin/env python3
"""Record tests/fixtures/lora/smollm2-r16-greedy.jsonl: llama.cpp's server (the oracle) on the
default model, SmolLM2-135M-Instruct, dequantized to F32 from its Q4_1 file (the weights sluice
computes with in f32), with the random adapter of scripts/tiny-lora.py applied (`--lora
models/lora/smollm2-r16.gguf`). Standard library only. scripts/lora-fixtures.sh makes the
adapter and the F32 file and runs this.

One llama-server (-t 2, one slot, KV cache f32, flash attention off), then for each prompt:
/tokenize (no BOS: SmolLM2 adds none) for prompt_ids and /completion on those ids, greedy, 32
tokens, the raw logits' top 5 (scripts/lib/llama_oracle.py). A row per prompt, in the format
of tests/fixtures/README.md; a summary on stderr.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from llama_oracle import complete, greedy_steps, post, wait_ready  # noqa: E402

N_PREDICT = 32
PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is a low-rank adapter?<|im_end|>\n<|im_start|>assistant\n",
    "The river left its banks in the spring of that year, and the people of the valley moved "
    "their animals to the high pastures. For three weeks the water stood in the fields. When it "
    "went down, it left a layer of fine grey silt over everything: the roads, the walls of the "
    "houses, the floors of the barns. The old men said that the silt would make the ground rich, "
    "and that the",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder with llama-server (scripts/llama-server.sh)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=18293)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, LD_LIBRARY_PATH=args.bin)
    log = os.path.abspath(os.path.join(os.path.dirname(args.adapter), "server.log"))
    cmd = [os.path.join(args.bin, "llama-server"), "-m", args.model, "--lora", args.adapter,
           "-t", "2", "-tb", "2", "-np", "1", "-c", "2048", "--port", str(args.port),
           "--host", "127.0.0.1", "--no-warmup", "-ctk", "f32", "-ctv", "f32", "-fa", "off"]
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
    rows = []
    try:
        wait_ready(args.port, proc, log)
        for prompt in PROMPTS:
            ids = post(args.port, "/tokenize", {"content": prompt, "add_special": False, "parse_special": True})["tokens"]
            res = complete(args.port, ids, N_PREDICT)
            steps, _, _ = greedy_steps(args.port, ids, res, pieces=True)
            rows.append({"prompt": prompt, "prompt_ids": ids, "text": res["content"], "ids": res["tokens"], "steps": steps})
    finally:
        proc.terminate()
        proc.wait()
    path = os.path.join(args.out, "smollm2-r16-greedy.jsonl")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    for r in rows:
        print(f"{r['prompt'][:40]!r} -> {r['text'][:60]!r}", file=sys.stderr)
    print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
