#!/usr/bin/env python3
"""Record the MoE fixtures (tests/fixtures/moe/ARCH-FORMAT-greedy.jsonl) with llama.cpp's
server as the oracle, on the tiny models of scripts/make-moe-models.sh. Standard library only.

    scripts/moe-fixtures.sh     # = the three steps:
    MODELS=$(scripts/make-moe-models.sh)
    BIN=$(LLAMA_TARGETS="llama-server llama-quantize" scripts/llama-server.sh)
    python3 scripts/moe-fixtures.py --bin "$BIN" --models "$MODELS" --out tests/fixtures/moe

For each model file: one llama-server (-t 2, one slot; KV cache f32 and flash attention off, so
that F32 files run in exact f32 arithmetic), and for each prompt: /tokenize (no BOS,
add_special false) for prompt_ids, then /completion on those ids, greedy (temperature 0), 32
tokens, n_probs 5 with post_sampling_probs false (so logprobs are log-softmax of the raw logits,
before any sampler), cache_prompt false. A row per prompt, in the format of
tests/fixtures/README.md. Steps whose probabilities the server leaves out (a token that ends in
an incomplete UTF-8 sequence) are taken from a one-token request on the same prefix (`alone`).
Prints a summary per file (distinct tokens, top-1 margins) on stderr.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from llama_oracle import complete, greedy_steps, post, wait_ready  # noqa: E402

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
N_PREDICT = 32

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5, 6,",
    "<|im_start|>user\nWhat is a mixture of experts?<|im_end|>\n<|im_start|>assistant\n",
    # Longer prompts (100-300 tokens): attention over many positions, and many routing choices.
    "The river left its banks in the spring of that year, and the people of the valley moved "
    "their animals to the high pastures. For three weeks the water stood in the fields. When it "
    "went down, it left a layer of fine grey silt over everything: the roads, the walls of the "
    "houses, the floors of the barns. The old men said that the silt would make the ground rich, "
    "and that the harvest would be the best in twenty years. The young men did not believe them, "
    "but they planted anyway, because there was nothing else to do. By August the wheat stood "
    "taller than anyone could remember, and the",
    "import json\nimport sys\n\n\ndef load_rows(path):\n    \"\"\"Read a JSON-lines file and "
    "return its rows as a list of dicts.\"\"\"\n    rows = []\n    with open(path) as f:\n"
    "        for n, line in enumerate(f, 1):\n            line = line.strip()\n"
    "            if not line:\n                continue\n            try:\n"
    "                rows.append(json.loads(line))\n            except json.JSONDecodeError as e:\n"
    "                print(f\"{path}:{n}: {e}\", file=sys.stderr)\n                raise\n"
    "    return rows\n\n\ndef main():\n    rows = load_rows(sys.argv[1])\n"
    "    by_key = {}\n    for row in rows:\n        by_key.setdefault(row[\"key\"], []).append(row)\n"
    "    for key in sorted(by_key):\n",
    "Inventory report, warehouse 7, week 32. Item A-1043 (steel brackets, 40 mm): 1,250 units in "
    "stock, 310 shipped, 95 returned, reorder point 500. Item A-1044 (steel brackets, 60 mm): 870 "
    "units in stock, 402 shipped, 12 returned, reorder point 600. Item B-2210 (hex bolts, M8 x 30): "
    "14,400 units in stock, 3,120 shipped, 0 returned, reorder point 5,000. Item B-2211 (hex bolts, "
    "M10 x 40): 9,830 units in stock, 2,245 shipped, 40 returned, reorder point 4,000. Item C-0007 "
    "(washers, 8 mm): 52,000 units in stock, 11,600 shipped, 150 returned, reorder point 20,000. "
    "Notes: the 60 mm brackets fell below the reorder point on Thursday; an order for 1,000 "
    "units was placed with the usual supplier, delivery expected in week 34. Summary:",
]


def record(port, prompt):
    ids = post(port, "/tokenize", {"content": prompt, "add_special": False, "parse_special": True})["tokens"]
    res = complete(port, ids, N_PREDICT)
    steps, dropped, _ = greedy_steps(port, ids, res, pieces=True)
    toks = res["tokens"]
    return {"prompt": prompt, "prompt_ids": ids, "text": res["content"], "ids": toks, "steps": steps}, len(dropped)


def summary(rows):
    toks = [t for r in rows for t in r["ids"]]
    margins = sorted(s["top"][0][1] - s["top"][1][1] for r in rows for s in r["steps"])
    small = sum(m < 0.1 for m in margins)
    return (f"{len(rows)} rows, {len(toks)} tokens, {len(set(toks))} distinct; "
            f"longest run of one token {longest_run(rows)}; top1-top2 logprob margin median "
            f"{margins[len(margins) // 2]:.2f}, < 0.1 in {small}/{len(margins)}; prompt lengths "
            f"{[len(r['prompt_ids']) for r in rows]}")


def longest_run(rows):
    best = 0
    for r in rows:
        run, prev = 0, None
        for t in r["ids"]:
            run = run + 1 if t == prev else 1
            prev = t
            best = max(best, run)
    return best


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
    env = dict(os.environ, LD_LIBRARY_PATH=args.bin)
    for arch in args.arch or ARCHS:
        for fmt in args.format or ARCH_FORMATS[arch]:
            if fmt not in ARCH_FORMATS[arch]:
                continue
            model = os.path.join(args.models, f"{arch}-{fmt}.gguf")
            log = os.path.join(args.models, f"{arch}-{fmt}.server.log")
            cmd = [os.path.join(args.bin, "llama-server"), "-m", model, "-t", "2", "-tb", "2",
                   "-np", "1", "-c", "4096", "--port", str(args.port), "--host", "127.0.0.1",
                   "--no-warmup", "-ctk", "f32", "-ctv", "f32", "-fa", "off"] + args.server_args.split()
            with open(log, "w") as lf:
                proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
            try:
                wait_ready(args.port, proc, log)
                rows, filled = zip(*[record(args.port, p) for p in PROMPTS])
            finally:
                proc.terminate()
                proc.wait()
            path = os.path.join(args.out, f"{arch}-{fmt}-greedy.jsonl")
            with open(path, "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
            print(f"{path}: {summary(rows)}; steps taken alone: {sum(filled)}", file=sys.stderr)


if __name__ == "__main__":
    main()
