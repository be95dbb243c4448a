#!/usr/bin/env python3
"""Issue 70's multi-model target, in pairs on this host: one stream's decode speed on a model
served alone vs the same model served beside a second loaded (idle) model, alternating.

    python3 scripts/bench-multi-model.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--runs 5]

Each run: a fresh server, 2 warm-up requests, then `--reps` greedy completions of 128 tokens
(ignore_eos) timed by the client; tokens/s is the median. The second model is the same file
under another name, loaded with `/models/load` before timing."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def run(binary: Path, models: list[Path], port: int, reps: int) -> float:
    args = [str(binary), "serve", "--host", "127.0.0.1", "--port", str(port),
            "--kv-cache-memory", "256MiB"]
    for m in models:
        args += ["--model", str(m)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")})
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.1)
        name = models[0].stem
        if len(models) > 1:
            post(f"{base}/models/load", {"model": models[1].stem})
        body = {"model": name, "prompt": "Once upon a time", "max_tokens": 128,
                "temperature": 0, "ignore_eos": True}
        for _ in range(2):
            post(f"{base}/v1/completions", body)
        rates = []
        for _ in range(reps):
            t = time.perf_counter()
            out = post(f"{base}/v1/completions", body)
            rates.append(out["usage"]["completion_tokens"] / (time.perf_counter() - t))
        return statistics.median(rates)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "release" / "sluice")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-mm-"))
    first, second = work / "first.gguf", work / "second.gguf"
    first.symlink_to(args.model.resolve())
    second.symlink_to(args.model.resolve())
    alone, beside = [], []
    for i in range(args.runs):
        alone.append(run(args.binary, [first], 18900 + 2 * i, args.reps))
        beside.append(run(args.binary, [first, second], 18901 + 2 * i, args.reps))
    a, b = statistics.median(alone), statistics.median(beside)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    print(f"Host: {cpu}, {os.cpu_count()} CPUs; {args.model.name}; {args.runs} paired runs of "
          f"{args.reps} timed 128-token completions, medians.\n")
    print("| served | tokens/s (one stream) |\n|---|---|")
    print(f"| alone | {a:.1f} |\n| beside a second loaded model | {b:.1f} |")
    print(f"\nbeside / alone: **{b / a:.3f}**; runs alone {[round(x, 1) for x in alone]}, "
          f"beside {[round(x, 1) for x in beside]}")


if __name__ == "__main__":
    sys.exit(main())
