#!/usr/bin/env python3
"""Issue 71's targets beside llama.cpp's server, in one run, on one GGUF file of a hybrid
(Qwen3.5/3.6: Gated DeltaNet layers), one server at a time on the same cores:

    ./target/release/sluice synth --shape qwen3.6-35b-a3b --format q4_k_m --layers 8 --out /tmp/q36.gguf
    python3 scripts/bench-hybrid.py --model /tmp/q36.gguf [--prompt-tokens 4096] [--clients 1,16]

For each server: output tokens/s at each client count (each client one request of a 130-token
prompt and 128 tokens, EOS ignored); the time to first token of a `--prompt-tokens` prompt;
the same prompt again with a new question after it (the prefix from the cache: a checkpoint in
sluice, llama.cpp's slot cache); and an agent replay of `--turns` turns (each turn the previous
turns, their answers and a new message), with sluice's `/metrics` counting how many of each
turn's shared tokens its prefix cache served. Prints one JSON line a measurement and a summary
with sluice / llama.cpp ratios. Standard library only. The synthetic vocabulary is byte-level
without merges: a character is a token."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def post(url: str, body: dict, timeout: float = 3600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def first_token_seconds(url: str, prompt: str) -> float:
    """Seconds from sending a streamed completion of `prompt` to its first token."""
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            line = line.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    dt = time.monotonic() - t0
                    for _ in r:  # drain
                        pass
                    return dt
    raise RuntimeError("no token came back")


def complete(url: str, prompt: str, n: int) -> str:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    return post(f"{url}/v1/completions", body)["choices"][0]["text"]


def throughput(url: str, clients: int) -> float:
    prompt = "The harbour board met on Tuesday to discuss the north wall. " * 2
    prompt = prompt[:130]
    outs = [0] * clients

    def one(i: int) -> None:
        body = {"prompt": prompt + str(i), "max_tokens": 128, "temperature": 0,
                "ignore_eos": True}
        outs[i] = post(f"{url}/v1/completions", body)["usage"]["completion_tokens"]

    complete(url, prompt, 8)  # warm-up
    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(outs) / (time.monotonic() - t0)


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            total += float(m.group(2))
    return total


def text_of(n: int, seed: int) -> str:
    """`n` characters (tokens, in a synthetic vocabulary) of varied words."""
    words = ["wall", "crane", "barge", "tide", "quay", "stone", "fund", "board", "storm",
             "mooring", "lamp", "pier", "vote", "clerk", "season", "repair"]
    out, i = [], seed
    while sum(len(w) + 1 for w in out) < n:
        i = (i * 1103515245 + 12345) % (1 << 31)
        out.append(words[i % len(words)])
    return " ".join(out)[:n]


def wait_ready(url: str, proc: subprocess.Popen, log: Path) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < 900:
        if proc.poll() is not None:
            sys.exit(f"server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"server not ready; see {log}")


def run(name: str, cmd: list[str], env: dict, url: str, args, results: dict) -> None:
    log = Path(tempfile.gettempdir()) / f"bench-hybrid-{name}.log"
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
    try:
        ready = wait_ready(url, proc, log)
        r = {"ready_s": round(ready, 1)}
        for c in args.clients:
            r[f"tok_s_{c}"] = round(throughput(url, c), 2)
        long_prompt = text_of(args.prompt_tokens, 7)
        r["ttft_long_s"] = round(first_token_seconds(url, long_prompt), 2)
        r["ttft_again_s"] = round(
            first_token_seconds(url, long_prompt + " Question: who pays for the crane?"), 3)
        # The agent replay: each turn the transcript so far and a new message.
        transcript = text_of(args.prompt_tokens // 2, 11)
        shared, served, ttfts = 0, 0.0, []
        for turn in range(args.turns):
            transcript += f"\nUser: {text_of(120, 100 + turn)}\nAssistant:"
            before = metric(url, "sluice_prefix_cache_hits_total") if name == "sluice" else 0
            t0 = time.monotonic()
            answer = complete(url, transcript, 32)
            ttfts.append(round(time.monotonic() - t0, 2))
            if name == "sluice" and turn > 0:
                served += metric(url, "sluice_prefix_cache_hits_total") - before
                shared += prev_len
            prev_len = len(transcript) + len(answer)
            transcript += answer
        r["agent_turn_s"] = ttfts
        if name == "sluice":
            r["agent_shared_tokens"] = shared
            r["agent_served_from_cache"] = served
        results[name] = r
        print(json.dumps({name: r}), flush=True)
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=4096)
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--port", type=int, default=8431)
    ap.add_argument("--kv", default="2GiB", help="sluice's --kv-cache-memory")
    args = ap.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    slots = max(args.clients)
    bin_dir = subprocess.run([str(ROOT / "scripts/llama-server.sh")], check=True,
                             env=dict(os.environ, LLAMA_TARGETS="llama-server"),
                             capture_output=True, text=True).stdout.strip()
    url = f"http://127.0.0.1:{args.port}"
    ctx = slots * (args.prompt_tokens + 1024)
    results: dict = {}
    env = dict(os.environ, LD_LIBRARY_PATH=bin_dir)
    run("llama.cpp", [f"{bin_dir}/llama-server", "-m", args.model, "-t", "2", "-tb", "2",
                      "-np", str(slots), "-c", str(ctx), "--port", str(args.port),
                      "--host", "127.0.0.1", "--no-warmup"], env, url, args, results)
    run("sluice", [str(ROOT / "target/release/sluice"), "serve", "--model", args.model,
                   "--port", str(args.port), "--host", "127.0.0.1", "--kv-cache-memory",
                   args.kv, "--max-num-seqs", str(slots)], dict(os.environ), url, args, results)
    s, l = results["sluice"], results["llama.cpp"]
    summary = {k: round(s[k] / l[k], 2) for k in s if k.startswith("tok_s_")}
    summary["ttft_long_speedup"] = round(l["ttft_long_s"] / s["ttft_long_s"], 2)
    summary["sluice_again_vs_first"] = round(s["ttft_long_s"] / s["ttft_again_s"], 1)
    summary["llama_again_vs_first"] = round(l["ttft_long_s"] / l["ttft_again_s"], 1)
    if s.get("agent_shared_tokens"):
        summary["agent_cache_share"] = round(s["agent_served_from_cache"] / s["agent_shared_tokens"], 3)
    print(json.dumps({"summary (sluice / llama.cpp)": summary}), flush=True)


if __name__ == "__main__":
    main()
