#!/usr/bin/env python3
"""The side-by-side table of one compare-llama.sh run: each server's output tok/s and TTFT p50
at each level with sluice's ratio to llama.cpp's best file there, the 512-token prefill of
llama-bench and of sluice's forward bench, and, where bench.sh measured them in the same run
(gemm.md), what fraction of the machine's limits each figure reaches.

    python3 scripts/bench-summary.py OUT_DIR NAME

Reads OUT_DIR/NAME.{sluice,llama.cpp,llama.cpp-F32}.json (sluice-bench --json), NAME.llama-bench.md,
NAME.forward.md and OUT_DIR/gemm.md; a file that is missing leaves its column out.
"""
import json
import os
import re
import sys


def load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def text(path):
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def main():
    out, name = sys.argv[1], sys.argv[2]
    runs = {}
    for label in ("sluice", "llama.cpp", "llama.cpp-F32"):
        data = load(os.path.join(out, f"{name}.{label}.json"))
        if data is not None:
            runs[label] = {r["load"]["concurrency"]: r for r in data}
    if "sluice" not in runs:
        sys.exit(f"no {name}.sluice.json in {out}")
    peers = [p for p in ("llama.cpp", "llama.cpp-F32") if p in runs]

    bench = text(os.path.join(out, f"{name}.llama-bench.md"))
    params = re.search(r"\|\s*([\d.]+) ([MB])\s*\|\s*CPU", bench)
    params = params and float(params.group(1)) * (1e6 if params.group(2) == "M" else 1e9)
    size = re.search(r"\|\s*([\d.]+) (MiB|GiB)\s*\|", bench)
    size = size and float(size.group(1)) * (2**20 if size.group(2) == "MiB" else 2**30)
    pp = re.search(r"pp512\s*\|\s*([\d.]+)", bench)
    forward = text(os.path.join(out, f"{name}.forward.md"))
    prefill = re.search(r"\| prefill 512 \| 512 \| [\d.]+ \| ([\d.]+) \|", forward)
    gemm = text(os.path.join(out, "gemm.md"))
    bandwidth = re.search(r"read bandwidth .*: ([\d.]+) GB/s", gemm)
    # The packed kernel's GFLOP/s (the table's fifth column) on every f32 shape: its best is
    # the machine's f32 GEMM peak as this project reaches it.
    peak = [
        float(cells[5])
        for cells in (line.split("|") for line in gemm.splitlines() if line.startswith("| ["))
        if len(cells) > 5 and re.fullmatch(r"\s*[\d.]+\s*", cells[5])
    ]

    print(f"## {name}: same-run comparison\n")
    head = "| clients | sluice tok/s | " + " | ".join(f"{p} tok/s" for p in peers)
    head += " | sluice / best llama.cpp | TTFT p50 sluice | " + " | ".join(f"TTFT p50 {p}" for p in peers)
    head += " | failed (sluice, " + ", ".join(peers) + ") |"
    print(head)
    print("|" + " ---: |" * (head.count("|") - 1))
    for c in sorted(runs["sluice"]):
        s = runs["sluice"][c]
        row = [str(c), f"{s['output_throughput']:.1f}"]
        best = 0.0
        for p in peers:
            r = runs[p].get(c)
            row.append(f"{r['output_throughput']:.1f}" if r else "-")
            best = max(best, r["output_throughput"] if r else 0.0)
        row.append(f"**{s['output_throughput'] / best:.2f}x**" if best else "-")
        row.append(f"{s['ttft_ms']['p50']:.0f} ms")
        for p in peers:
            r = runs[p].get(c)
            row.append(f"{r['ttft_ms']['p50']:.0f} ms" if r else "-")
        row.append(", ".join(str(runs[p][c]["failed"]) if c in runs[p] else "-" for p in ["sluice"] + peers))
        print("| " + " | ".join(row) + " |")
    if pp and prefill:
        sl, ll = float(prefill.group(1)), float(pp.group(1))
        print(f"\nPrefill of 512 tokens: sluice (forward bench, median) {sl:.0f} tok/s, "
              f"llama-bench pp512 {ll:.0f} tok/s: **{sl / ll:.2f}x**.")
    if bandwidth and size:
        bw = float(bandwidth.group(1)) * 1e9
        bound = bw / size
        s1 = runs["sluice"].get(1)
        line = (f"\nLimits measured in this run: read bandwidth {bw / 1e9:.1f} GB/s, so one stream "
                f"that reads the {size / 2**20:.0f} MiB file once per token is bounded at {bound:.0f} tok/s")
        if s1:
            line += f"; sluice's 1-client figure is {100 * s1['output_throughput'] / bound:.0f}% of it"
            for p in peers:
                r = runs[p].get(1)
                if r and p == "llama.cpp":
                    line += f", llama.cpp's {100 * r['output_throughput'] / bound:.0f}%"
        print(line + ".")
    if peak and params:
        flops = max(peak) * 1e9
        bound = flops / (2 * params)
        top = max(runs["sluice"])
        s = runs["sluice"][top]
        print(f"f32 GEMM peak {max(peak):.0f} GFLOP/s bounds f32 compute at {bound:.0f} tokens/s "
              f"(2 x {params / 1e6:.1f}M FLOP a token, attention aside); at {top} clients sluice "
              f"processes {s['total_token_throughput']:.0f} tokens/s (prompt and output), "
              f"{100 * s['total_token_throughput'] / bound:.0f}% of it (prompt tokens skip the "
              f"lm_head, so the true fraction is somewhat lower).")


if __name__ == "__main__":
    main()
