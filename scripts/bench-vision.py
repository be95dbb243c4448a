#!/usr/bin/env python3
"""Issue 72's speed target beside llama.cpp's server: chats with one image each, on one text
model and one projector file, one server at a time on the same cores:

    "$(scripts/lib/gguf-venv.sh)" scripts/synth-mmproj.py          # /tmp/mmproj-siglip400m.gguf
    python3 scripts/bench-vision.py --model models/gemma-3-270m-q4_k_m.gguf \
        --mmproj /tmp/mmproj-siglip400m.gguf [--clients 8] [--threads 2]

The projector is synthetic: the tower is Gemma 3 4B's shape (SigLIP-400M: 896 pixels, 4096
patches, 27 layers of 1152), while its projection goes into Gemma 3 270M's hidden size of 640
so that the small real text model (Gemma 3's vocabulary, with <start_of_image>) can take it;
the tower is almost all an image's cost, the 270M text model's 16 tokens little.

For each server (llama.cpp's `llama-server -m MODEL --mmproj MMPROJ -t T -np N`, then sluice's
`serve --model MODEL --mmproj MMPROJ`, each on a free port, waited for on /health):

- one streamed chat with one image (640x480 PNG data URI) and a short question, max_tokens 16,
  temperature 0: time to first token and total;
- `--clients` such chats at once, each with its own image: the wall time until all are done,
  and each one's time to first token and total.

The images are distinct synthetic gradients, written once as PNG files (by hand, zlib) into a
temporary directory. Prints one JSON line a measurement and a summary of llama.cpp / sluice
times (above 1: sluice is faster). Standard library only."""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is in this picture?"
# The 270M file has no chat template: sluice falls back to Gemma's turns, llama.cpp to ChatML
# unless given this copy of sluice's fallback (tests/fixtures/vision/README.md).
TEMPLATE = ROOT / "tests/fixtures/vision/gemma.jinja"


def png(width: int, height: int, pixel) -> bytes:
    """An RGB8 PNG of `pixel(x, y) -> (r, g, b)`."""
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter: none
        for x in range(width):
            rows.extend(pixel(x, y))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(bytes(rows), 6)) + chunk(b"IEND", b""))


def image(i: int, width: int = 640, height: int = 480) -> bytes:
    """Image `i`: a gradient whose direction and colours depend on `i`."""
    def pixel(x: int, y: int):
        u, v = x / (width - 1), y / (height - 1)
        r = int(255 * ((u + 0.13 * i) % 1.0))
        g = int(255 * ((v * (1 + i % 3) + 0.07 * i) % 1.0))
        b = int(255 * (((u + v) / 2 + 0.29 * i) % 1.0))
        return (r, g, b)
    return png(width, height, pixel)


def data_uris(n: int, tmp: Path) -> list[str]:
    out = []
    for i in range(n):
        path = tmp / f"gradient-{i}.png"
        if not path.exists():
            path.write_bytes(image(i))
        out.append("data:image/png;base64," + base64.b64encode(path.read_bytes()).decode())
    return out


def chat(url: str, model: str, uri: str | None, timeout: float) -> dict:
    """One streamed chat (with the image `uri`, or text only): seconds to the first content
    token and to the end, and how many content chunks came back."""
    content: list | str = QUESTION
    if uri is not None:
        content = [{"type": "text", "text": QUESTION},
                   {"type": "image_url", "image_url": {"url": uri}}]
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 16, "temperature": 0, "stream": True}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft, chunks, text = None, 0, ""
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            c = json.loads(line[6:])
            if "error" in c:
                raise RuntimeError(f"error in stream: {c['error']}")
            for ch in c.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    chunks += 1
                    text += piece
    total = time.monotonic() - t0
    return {"ttft_s": round(ttft if ttft is not None else total, 2), "total_s": round(total, 2),
            "chunks": chunks, "text": text[:60]}


def concurrent(url: str, model: str, uris: list[str], timeout: float) -> dict:
    outs: list = [None] * len(uris)

    def one(i: int) -> None:
        try:
            outs[i] = chat(url, model, uris[i], timeout)
        except Exception as e:  # noqa: BLE001 - reported in the result
            outs[i] = {"error": repr(e)}

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(uris))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    ok = [o for o in outs if "error" not in o]
    r = {"wall_s": round(wall, 2), "requests": outs}
    if ok:
        ttfts = sorted(o["ttft_s"] for o in ok)
        r["ttft_mean_s"] = round(sum(ttfts) / len(ttfts), 2)
        r["ttft_min_s"], r["ttft_max_s"] = ttfts[0], ttfts[-1]
    r["errors"] = len(outs) - len(ok)
    return r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, log: Path, limit: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not ready after {limit} s; see {log}")


def run(name: str, cmd: list[str], env: dict, url: str, args, uris: list[str],
        results: dict) -> None:
    log = Path(tempfile.gettempdir()) / f"bench-vision-{name}.log"
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
    print(json.dumps({"server": name, "pid": proc.pid, "log": str(log),
                      "cmd": " ".join(cmd)}), flush=True)
    try:
        r = {"ready_s": round(wait_ready(url, proc, log, args.ready_timeout), 1)}
        chat(url, args.model_name, None, args.timeout)  # warm-up, text only
        one = chat(url, args.model_name, uris[0], args.timeout)
        r["one_ttft_s"], r["one_total_s"], r["one_text"] = one["ttft_s"], one["total_s"], one["text"]
        print(json.dumps({name: {"one": one}}), flush=True)
        many = concurrent(url, args.model_name, uris[1:1 + args.clients], args.timeout)
        print(json.dumps({name: {f"concurrent_{args.clients}": many}}), flush=True)
        r["many_wall_s"] = many["wall_s"]
        r["many_errors"] = many["errors"]
        for k in ["ttft_mean_s", "ttft_min_s", "ttft_max_s"]:
            if k in many:
                r["many_" + k] = many[k]
        results[name] = r
        print(json.dumps({name: r}), flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--mmproj", default="/tmp/mmproj-siglip400m.gguf")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp's -t and -tb")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds a request may take")
    ap.add_argument("--ready-timeout", type=float, default=900)
    ap.add_argument("--only", choices=["llama.cpp", "sluice"], help="run one server")
    args = ap.parse_args()
    args.model_name = Path(args.model).stem
    tmp = Path(tempfile.gettempdir()) / "bench-vision-images"
    tmp.mkdir(exist_ok=True)
    uris = data_uris(1 + args.clients, tmp)
    results: dict = {}
    if args.only != "sluice":
        bin_dir = subprocess.run([str(ROOT / "scripts/llama-server.sh")], check=True,
                                 env=dict(os.environ, LLAMA_TARGETS="llama-server"),
                                 capture_output=True, text=True).stdout.strip()
        port = free_port()
        # Each slot gets ctx / np: an image's 256 positions, the question, 16 tokens.
        ctx = args.clients * 512
        run("llama.cpp", [f"{bin_dir}/llama-server", "-m", args.model, "--mmproj", args.mmproj,
                          "-t", str(args.threads), "-tb", str(args.threads),
                          "-np", str(args.clients), "-c", str(ctx), "--port", str(port),
                          "--host", "127.0.0.1", "--chat-template-file", str(TEMPLATE)],
            dict(os.environ, LD_LIBRARY_PATH=bin_dir), f"http://127.0.0.1:{port}", args, uris,
            results)
    if args.only != "llama.cpp":
        port = free_port()
        run("sluice", [str(ROOT / "target/release/sluice"), "serve", "--model", args.model,
                       "--mmproj", args.mmproj, "--port", str(port), "--host", "127.0.0.1",
                       "--max-num-seqs", str(args.clients)],
            dict(os.environ), f"http://127.0.0.1:{port}", args, uris, results)
    if "sluice" in results and "llama.cpp" in results:
        s, l = results["sluice"], results["llama.cpp"]
        summary = {k: round(l[k] / s[k], 2)
                   for k in ["one_ttft_s", "one_total_s", "many_wall_s", "many_ttft_mean_s"]
                   if k in s and k in l and s[k] > 0}
        print(json.dumps({"summary (llama.cpp time / sluice time; >1: sluice faster)": summary}),
              flush=True)


if __name__ == "__main__":
    main()
