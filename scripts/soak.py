#!/usr/bin/env python3
"""Soak test (not part of CI): a bounded run of mixed load against a real `sluice serve`.

Starts the server (or uses one already running, with --url and --pid), drives it with
closed-loop clients sending a mix of requests (completions and chats, plain and streamed, n=2,
long prompts, stop strings, seeded sampling, tokenize/detokenize, and streams the client hangs
up on purpose), and every --interval seconds samples the server's RSS, KV-cache use, requests
running and waiting, and the latency of the requests finished since the last sample.

It fails (exit 1) when
  - any request is lost: a transport error, a timeout, a 5xx, an unexpected status, a body
    that is not a complete response, or a stream without [DONE] (the deliberate hang-ups do
    not count, and neither does a 429, which is reported);
  - the RSS after the warm-up grows more than --rss-growth (default 5%): RSS is read every
    second, and the median of each sampling interval after the warm-up is compared with the
    median over the warm-up (a step's activations come and go within milliseconds, so single
    readings swing by several percent; a leak moves the median);
  - afterwards the server is not back to idle (nothing running or waiting, no KV block held)
    or is no longer running.

    .venv/bin/python scripts/soak.py                     # 30 minutes
    .venv/bin/python scripts/soak.py --duration 3m --json soak.json

Needs `requests` (in .venv after ./scripts/setup-e2e.sh) and a release build.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BINARY = ROOT / "target" / "release" / "sluice"
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")


def duration(text: str) -> float:
    """Seconds from `90`, `90s`, `15m` or `1h`."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([smh]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 15m, 1h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def metrics(url: str) -> dict[str, float]:
    """Unlabelled samples of /metrics (sums for labelled ones), by name."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    ok: int = 0
    cancelled: int = 0
    refused: int = 0
    lost: list[str] = field(default_factory=list)
    # Since the last sample: end-to-end seconds of complete requests, TTFT of streams.
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)

    def record(self, outcome: str, latency: float | None = None, ttft: float | None = None,
               why: str = "") -> None:
        with self.lock:
            if outcome == "ok":
                self.ok += 1
                if latency is not None:
                    self.latencies.append(latency)
                if ttft is not None:
                    self.ttfts.append(ttft)
            elif outcome == "cancelled":
                self.cancelled += 1
            elif outcome == "refused":
                self.refused += 1
            else:
                self.lost.append(why)

    def drain(self) -> tuple[list[float], list[float]]:
        with self.lock:
            lat, ttft = self.latencies, self.ttfts
            self.latencies, self.ttfts = [], []
            return lat, ttft


class Lost(Exception):
    pass


WORDS = (
    "river stone cloud engine garden signal lantern harbor meadow copper violet orbit "
    "canyon ember falcon glacier willow anchor prism summit"
).split()


class Client:
    """One closed-loop client: picks a request kind, sends it, checks the whole answer."""

    KINDS = [
        ("completion", 20),
        ("completion_stream", 15),
        ("chat", 15),
        ("chat_stream", 15),
        ("n2", 5),
        ("long_prompt", 5),
        ("stop_string", 5),
        ("seeded", 5),
        ("hang_up", 10),
        ("tokenize", 5),
    ]

    def __init__(self, url: str, index: int, seed: int, tally: Tally, stop: threading.Event):
        self.url, self.index, self.tally, self.stop = url, index, tally, stop
        self.rng = random.Random(seed * 1000 + index)
        self.session = requests.Session()
        self.kinds = [k for k, _ in self.KINDS]
        self.weights = [w for _, w in self.KINDS]

    def text(self, words: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(words))

    def run(self) -> None:
        while not self.stop.is_set():
            kind = self.rng.choices(self.kinds, self.weights)[0]
            t0 = time.perf_counter()
            try:
                outcome, ttft = getattr(self, kind)()
                self.tally.record(outcome, time.perf_counter() - t0, ttft)
            except Lost as e:
                self.tally.record("lost", why=f"{kind}: {e}")
            except Exception as e:  # noqa: BLE001 - a broken answer of any kind is a lost request
                self.tally.record("lost", why=f"{kind}: {type(e).__name__}: {e}")

    # --- request kinds: each returns ("ok" | "cancelled" | "refused", ttft or None) ----------

    def post(self, path: str, body: dict, stream: bool = False) -> requests.Response:
        r = self.session.post(f"{self.url}{path}", json=body, stream=stream, timeout=300)
        if r.status_code == 429:
            r.close()
            raise _Refused()
        if r.status_code != 200:
            raise Lost(f"{path}: {r.status_code} {r.text[:200]}")
        return r

    def full(self, path: str, body: dict, n: int = 1) -> tuple[str, None]:
        try:
            r = self.post(path, body)
        except _Refused:
            return "refused", None
        try:
            v = r.json()
        except ValueError as e:
            raise Lost(f"{path}: body is not JSON: {e}") from e
        choices = v.get("choices", [])
        if len(choices) != n or any(c.get("finish_reason") not in ("stop", "length") for c in choices):
            raise Lost(f"{path}: incomplete answer {json.dumps(v)[:300]}")
        if v.get("usage", {}).get("completion_tokens", 0) < 1:
            raise Lost(f"{path}: no tokens: {json.dumps(v)[:300]}")
        return "ok", None

    def streamed(self, path: str, body: dict, hang_up_after: int | None = None):
        t0 = time.perf_counter()
        try:
            r = self.post(path, {**body, "stream": True}, stream=True)
        except _Refused:
            return "refused", None
        ttft, chunks, finished, done = None, 0, 0, False
        try:
            for line in sse_lines(r):
                if not line or line.startswith(":"):
                    continue
                if not line.startswith("data: "):
                    raise Lost(f"{path}: not an SSE data line: {line[:200]}")
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise Lost(f"{path}: error event {data[:300]}")
                for c in chunk.get("choices", []):
                    if c.get("finish_reason"):
                        finished += 1
                    elif (c.get("text") or (c.get("delta") or {}).get("content")):
                        chunks += 1
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                        if hang_up_after is not None and chunks >= hang_up_after:
                            return "cancelled", None
        finally:
            r.close()
        if not done or finished != 1:
            raise Lost(f"{path}: stream ended without [DONE] or a finish ({finished} finishes)")
        return "ok", ttft

    def completion(self):
        body = {"prompt": self.text(self.rng.randint(3, 40)), "max_tokens": self.rng.randint(8, 64),
                "temperature": 0}
        return self.full("/v1/completions", body)

    def completion_stream(self):
        body = {"prompt": self.text(self.rng.randint(3, 40)), "max_tokens": self.rng.randint(8, 64),
                "temperature": 0, "stream_options": {"include_usage": True}}
        return self.streamed("/v1/completions", body)

    def messages(self) -> list[dict]:
        return [{"role": "system", "content": "You are brief."},
                {"role": "user", "content": f"Tell me about {self.text(self.rng.randint(1, 12))}."}]

    def chat(self):
        return self.full("/v1/chat/completions",
                         {"messages": self.messages(), "max_tokens": self.rng.randint(8, 64)})

    def chat_stream(self):
        return self.streamed("/v1/chat/completions",
                             {"messages": self.messages(), "max_tokens": self.rng.randint(8, 64)})

    def n2(self):
        body = {"prompt": self.text(10), "max_tokens": 16, "n": 2, "temperature": 0.9,
                "seed": self.rng.randint(0, 1 << 30)}
        return self.full("/v1/completions", body, n=2)

    def long_prompt(self):
        body = {"prompt": self.text(self.rng.randint(300, 900)), "max_tokens": 8, "temperature": 0}
        return self.full("/v1/completions", body)

    def stop_string(self):
        body = {"prompt": self.text(8), "max_tokens": 48, "stop": [" the", ".", "\n"],
                "temperature": 0}
        return self.full("/v1/completions", body)

    def seeded(self):
        body = {"prompt": self.text(6), "max_tokens": 24, "temperature": 0.8, "top_p": 0.9,
                "seed": self.rng.randint(0, 1 << 30)}
        return self.full("/v1/completions", body)

    def hang_up(self):
        body = {"prompt": self.text(12), "max_tokens": 256, "ignore_eos": True}
        return self.streamed("/v1/completions", body, hang_up_after=self.rng.randint(1, 6))

    def tokenize(self):
        prompt = self.text(self.rng.randint(1, 50))
        try:
            ids = self.post("/tokenize", {"prompt": prompt}).json()["tokens"]
            text = self.post("/detokenize", {"tokens": ids}).json()["prompt"]
        except _Refused:
            return "refused", None
        if text != prompt:
            raise Lost(f"tokenize round trip: {prompt!r} came back {text!r}")
        return "ok", None


class _Refused(Exception):
    pass


def sse_lines(r: requests.Response):
    """The stream's lines, split on newlines only. (`iter_lines(decode_unicode=True)` also splits
    on U+2028 and other Unicode line breaks, which JSON strings carry unescaped.)"""
    pending = b""
    for chunk in r.iter_content(chunk_size=None):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8")
    if pending:
        yield pending.decode("utf-8")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f}"


def start_server(args) -> tuple[subprocess.Popen, str, Path]:
    port = args.port
    logdir = Path(tempfile.mkdtemp(prefix="sluice-soak-"))
    log = logdir / "server.log"
    command = [str(args.binary), "serve", "--model", str(args.model), "--host", "127.0.0.1",
               "--port", str(port), *shlex.split(args.server_args)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    with open(log, "wb") as f:
        proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, cwd=logdir, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited with {proc.returncode}; log: {log}")
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                print(f"server: {' '.join(command)}\nlog: {log}")
                return proc, url, log
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"the server did not become healthy; log: {log}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=duration, default=duration("30m"), help="load duration (default 30m)")
    p.add_argument("--warmup", type=duration, default=None,
                   help="the RSS baseline is its median over this first part (default: a sixth of the duration, 30s to 5m)")
    p.add_argument("--interval", type=duration, default=10.0, help="sampling interval (default 10s)")
    p.add_argument("--concurrency", type=int, default=12, help="closed-loop clients (default 12)")
    p.add_argument("--rss-growth", type=float, default=0.05, help="allowed RSS growth after warm-up (default 0.05)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--binary", type=Path, default=DEFAULT_BINARY)
    p.add_argument("--model", type=Path, default=Path(os.environ.get("SLUICE_MODEL", DEFAULT_MODEL)))
    p.add_argument("--port", type=int, default=18700)
    p.add_argument("--server-args", default="--kv-cache-memory 256MiB",
                   help="extra `sluice serve` flags (default: --kv-cache-memory 256MiB)")
    p.add_argument("--url", help="use this running server instead of starting one (needs --pid)")
    p.add_argument("--pid", type=int, help="process id of the server at --url, for its RSS")
    p.add_argument("--json", type=Path, help="write the samples and the verdict here")
    args = p.parse_args()
    warmup = args.warmup if args.warmup is not None else min(300.0, max(30.0, args.duration / 6))
    if warmup >= args.duration:
        p.error("--warmup must be shorter than --duration")

    proc = None
    if args.url:
        if not args.pid:
            p.error("--url needs --pid (the server's process, for its RSS)")
        url, pid = args.url.rstrip("/"), args.pid
    else:
        proc, url, _ = start_server(args)
        pid = proc.pid

    idle = metrics(url)
    tally = Tally()
    stop = threading.Event()
    rss_readings: list[tuple[float, int]] = []
    rss_lock = threading.Lock()

    def read_rss() -> None:
        while not stop.is_set():
            reading = (time.monotonic() - t0, rss_bytes(pid))
            with rss_lock:
                rss_readings.append(reading)
            stop.wait(1.0)

    def rss_window(start: float, end: float) -> list[int]:
        with rss_lock:
            return [r for t, r in rss_readings if start <= t < end]

    clients = [Client(url, i, args.seed, tally, stop) for i in range(args.concurrency)]
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    rss_thread = threading.Thread(target=read_rss, daemon=True)
    rss_thread.start()
    samples = []
    print(f"{'t_s':>6} {'rss_mib':>8} {'rss_max':>8} {'kv_used':>7} {'kv_cap':>6} {'run':>4} {'wait':>4} "
          f"{'ok':>6} {'cancel':>6} {'429':>4} {'lost':>4} {'p50_ms':>7} {'p99_ms':>7} {'ttft_p50':>8}")
    try:
        while True:
            time.sleep(max(0.0, args.interval - (time.monotonic() - t0) % args.interval))
            elapsed = time.monotonic() - t0
            m = metrics(url)
            lat, ttft = tally.drain()
            window = rss_window(elapsed - args.interval, elapsed) or [rss_bytes(pid)]
            s = {
                "t_s": round(elapsed, 1),
                "rss_bytes": int(statistics.median(window)),
                "rss_max_bytes": max(window),
                "kv_blocks_used": m.get("sluice_kv_cache_blocks_used"),
                "kv_blocks_capacity": m.get("sluice_kv_cache_blocks_capacity"),
                "running": m.get("sluice_requests_running"),
                "waiting": m.get("sluice_requests_waiting"),
                "ok": tally.ok, "cancelled": tally.cancelled, "refused": tally.refused,
                "lost": len(tally.lost),
                "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99),
                "ttft_p50_s": percentile(ttft, 50),
                "warm": elapsed >= warmup,
            }
            samples.append(s)
            print(f"{s['t_s']:>6.0f} {s['rss_bytes'] / 2**20:>8.1f} {s['rss_max_bytes'] / 2**20:>8.1f} "
                  f"{s['kv_blocks_used']:>7.0f} "
                  f"{s['kv_blocks_capacity']:>6.0f} {s['running']:>4.0f} {s['waiting']:>4.0f} "
                  f"{s['ok']:>6} {s['cancelled']:>6} {s['refused']:>4} {s['lost']:>4} "
                  f"{ms(s['latency_p50_s']):>7} {ms(s['latency_p99_s']):>7} {ms(s['ttft_p50_s']):>8}",
                  flush=True)
            if elapsed >= args.duration:
                break
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
    stuck = sum(t.is_alive() for t in threads)
    if stuck:
        tally.lost.append(f"{stuck} clients still waiting for an answer 300 s after the end")

    # Back to idle: nothing running or waiting, no KV block held.
    deadline = time.monotonic() + 60
    settled = None
    while time.monotonic() < deadline:
        settled = metrics(url)
        if (settled.get("sluice_requests_running") == 0 and settled.get("sluice_requests_waiting") == 0
                and settled.get("sluice_kv_cache_blocks_used") == idle.get("sluice_kv_cache_blocks_used")):
            break
        time.sleep(0.5)
    failures = []
    alive = proc is None or proc.poll() is None
    if not alive:
        failures.append(f"the server exited with {proc.returncode}")
    if settled is None or settled.get("sluice_requests_running") != 0 or settled.get("sluice_requests_waiting") != 0 \
            or settled.get("sluice_kv_cache_blocks_used") != idle.get("sluice_kv_cache_blocks_used"):
        failures.append(f"not idle a minute after the load: {settled}")
    if tally.lost:
        failures.append(f"{len(tally.lost)} requests lost, e.g. {tally.lost[:3]}")
    # Single RSS readings swing by several percent (a long prompt's activations come and go
    # within a step), so medians are compared: the warm-up's against each later interval's.
    warmup_readings = rss_window(0, warmup)
    warm = [s for s in samples if s["warm"]]
    baseline = statistics.median(warmup_readings) if warmup_readings else None
    peak = max(s["rss_bytes"] for s in warm) if warm else None
    growth = (peak / baseline - 1) if baseline and warm else None
    if growth is not None and growth > args.rss_growth:
        failures.append(
            f"RSS grew {growth:.1%} after warm-up (median {baseline / 2**20:.1f} MiB during it, "
            f"{peak / 2**20:.1f} MiB in the highest interval after it)"
        )
    if len(warmup_readings) < 10 or len(warm) < 2:
        failures.append("too few RSS readings during or after the warm-up: run longer")
    all_lat = [s["latency_p50_s"] for s in samples if s["latency_p50_s"] is not None]

    summary = {
        "duration_s": args.duration, "warmup_s": warmup, "interval_s": args.interval,
        "concurrency": args.concurrency, "server_args": args.server_args,
        "requests_ok": tally.ok, "requests_cancelled_on_purpose": tally.cancelled,
        "requests_refused_429": tally.refused, "requests_lost": len(tally.lost),
        "rss_warmup_median_mib": baseline / 2**20 if baseline else None,
        "rss_highest_interval_median_after_warmup_mib": peak / 2**20 if peak else None,
        "rss_last_interval_median_mib": samples[-1]["rss_bytes"] / 2**20 if samples else None,
        "rss_max_reading_mib": max(r for _, r in rss_readings) / 2**20 if rss_readings else None,
        "rss_growth_after_warmup": growth,
        "latency_p50_median_s": statistics.median(all_lat) if all_lat else None,
        "passed": not failures, "failures": failures, "samples": samples,
    }
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=2))
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    print("PASS" if not failures else "FAIL: " + "; ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
