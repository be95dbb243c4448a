#!/usr/bin/env python3
"""Paired timings of the hub path (issue 70's targets), against the test suite's fake hub
(tests/e2e/fake_hub.py) on this host, one after the other in one run:

- download: `sluice pull ORG/NAME` into an empty cache vs `curl -L` of the same file from the
  same server (rate = bytes / wall time; sluice's includes its process start, listing request
  and sha256 check);
- start: `sluice serve --model ORG/NAME` from a filled cache vs `--model PATH` of the same
  file, wall time from spawn to the first 200 of /health.

    python3 scripts/bench-hub.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--runs 5]

Prints medians and ratios as Markdown (benchmarks/hub.md keeps a run)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import urllib.request

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from fake_hub import FakeHub, HubFile, HubRepo  # noqa: E402

REPO = "bench/model-GGUF"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_start(binary: Path, model: str, env: dict) -> float:
    port = free_port()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [str(binary), "serve", "--model", model, "--port", str(port), "--host", "127.0.0.1",
         "--kv-cache-memory", "64MiB"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        return time.perf_counter() - start
            except Exception:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"sluice serve --model {model} exited {proc.returncode}")
            time.sleep(0.01)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "release" / "sluice")
    args = ap.parse_args()
    size = args.model.stat().st_size
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-hub-"))
    pulls, curls, cached, direct = [], [], [], []
    with FakeHub() as hub:
        hub.add(HubRepo(REPO, [HubFile(args.model.name, path=args.model)]))
        env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(work / "hf"), SLUICE_LOG="warn")
        url = f"{hub.url}/{REPO}/resolve/main/{args.model.name}"
        for _ in range(args.runs):
            shutil.rmtree(work / "hf", ignore_errors=True)
            t = time.perf_counter()
            subprocess.run([str(args.binary), "pull", REPO], env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            pulls.append(time.perf_counter() - t)
            out = work / "curl.gguf"
            out.unlink(missing_ok=True)
            t = time.perf_counter()
            subprocess.run(["curl", "-sSfL", "-o", str(out), url], check=True)
            curls.append(time.perf_counter() - t)
        for _ in range(args.runs):
            cached.append(time_start(args.binary, REPO, env))
            direct.append(time_start(args.binary, str(args.model), env))
    shutil.rmtree(work, ignore_errors=True)
    mib = size / (1 << 20)
    p, c = statistics.median(pulls), statistics.median(curls)
    s_cache, s_path = statistics.median(cached), statistics.median(direct)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"Host: {cpu}, {os.cpu_count()} CPUs; file {args.model.name} ({mib:.1f} MiB); {args.runs} paired runs, medians.\n")
    print("| measure | sluice | reference | ratio |")
    print("|---|---|---|---|")
    print(f"| download rate (MiB/s), sluice pull vs curl -L | {mib / p:.0f} | {mib / c:.0f} | {c / p:.2f} |")
    print(f"| start to /health 200 (s), --model ORG/NAME from the cache vs --model PATH | {s_cache:.3f} | {s_path:.3f} | {s_cache / s_path:.3f} |")
    print(f"\nruns (s): pull {[round(x, 3) for x in pulls]}, curl {[round(x, 3) for x in curls]}, "
          f"cache start {[round(x, 3) for x in cached]}, path start {[round(x, 3) for x in direct]}")


if __name__ == "__main__":
    main()
