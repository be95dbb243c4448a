"""A prefix-aware request router driven by sluice's KV-cache events, against round-robin: the
simulation of scale-out that issue 40 asks for. It is a test of the events, not a product:
the product is the real routers (llm-d, Dynamo) reading the same stream (docs/routers.md).

The picker does what llm-d's precise prefix-cache scorer does:
- one SUB socket connected to every server's PUB socket; each server has its own topic
  (`kv@<server>@<model>`), and each batch is applied in sequence order to that server's set;
- blocks are keyed by the picker's own chain of token ids (a block's key is the hash of its
  parent's key and its tokens), rebuilt from each `BlockStored`'s parent and token ids, so the
  engine's hash function never matters; `BlockRemoved` maps engine hashes back to keys;
- a request's prompt is tokenized (`POST /tokenize`), cut in blocks of `block_size`, and sent to
  the server holding the longest run of its leading blocks; ties go to the server with the
  fewest requests in flight, then round-robin.

Run as a script for the benchmark (BENCHMARKS.md, "Prefix-aware routing"):

    .venv/bin/python tests/e2e/kv_routing.py --servers 3 --requests 120

which starts the servers itself, runs round-robin then the picker on the same workload (fresh
servers each time), and prints the prefix-cache hit rate and TTFT percentiles of each.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import random
import statistics
import threading
import time
from dataclasses import dataclass, field

import msgpack
import requests
import zmq

from harness import SluiceServer, free_port, metric_value
from vllm_events import decode_event


def block_keys(tokens: list[int], block_size: int) -> list[int]:
    """The picker's keys of the full blocks of `tokens`, in order."""
    keys, parent = [], None
    for i in range(len(tokens) // block_size):
        parent = hash((parent, tuple(tokens[i * block_size : (i + 1) * block_size])))
        keys.append(parent)
    return keys


@dataclass
class ServerView:
    """What the picker knows of one server."""

    url: str
    topic: bytes
    keys: set[int] = field(default_factory=set)
    engine_to_key: dict[int, int] = field(default_factory=dict)
    last_seq: int = -1
    in_flight: int = 0
    resyncs: int = 0

    def apply(self, seq: int, payload: bytes) -> None:
        _, events, _ = msgpack.unpackb(payload)
        for event in events:
            tag, f, _ = decode_event(event)
            if tag == "BlockStored":
                hashes, parent, tokens = f["block_hashes"], f["parent_block_hash"], f["token_ids"]
                block_size = f["block_size"]
                parent_key = self.engine_to_key.get(parent) if parent is not None else None
                for i, h in enumerate(hashes):
                    chunk = tuple(tokens[i * block_size : (i + 1) * block_size])
                    parent_key = hash((parent_key, chunk))
                    self.engine_to_key[h] = parent_key
                    self.keys.add(parent_key)
            elif tag == "BlockRemoved":
                for h in f["block_hashes"]:
                    key = self.engine_to_key.pop(h, None)
                    if key is not None:
                        self.keys.discard(key)
            elif tag == "AllBlocksCleared":
                self.keys.clear()
                self.engine_to_key.clear()
        self.last_seq = seq

    def resync(self) -> None:
        """Rebuilds from `GET /debug/kv_cache` after a lost batch."""
        snap = requests.get(f"{self.url}/debug/kv_cache", timeout=30).json()
        self.keys.clear()
        self.engine_to_key.clear()
        by_hash = {b["hash"]: b for b in snap["blocks"]}

        def key_of(h: int) -> int | None:
            if h in self.engine_to_key:
                return self.engine_to_key[h]
            b = by_hash.get(h)
            if b is None:
                return None
            parent = None if b["parent_hash"] is None else key_of(b["parent_hash"])
            k = hash((parent, tuple(b["token_ids"])))
            self.engine_to_key[h] = k
            return k

        for h in by_hash:
            self.keys.add(key_of(h))
        self.last_seq = -1 if snap["last_seq"] is None else snap["last_seq"]
        self.resyncs += 1


class PrefixPicker:
    """Routes by the KV-cache events of `servers` (list of (http_url, zmq_endpoint, topic))."""

    def __init__(self, servers: list[tuple[str, str, str]], block_size: int = 16):
        self.block_size = block_size
        self.views = [ServerView(url, topic.encode()) for url, _, topic in servers]
        self.by_topic = {v.topic: v for v in self.views}
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        for _, endpoint, _ in servers:
            self.sock.connect(endpoint)
        self.lock = threading.Lock()
        self.rr = itertools.count()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def _listen(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            topic, seq, payload = self.sock.recv_multipart()
            seq = int.from_bytes(seq, "big")
            with self.lock:
                view = self.by_topic[topic]
                if seq <= view.last_seq:
                    continue
                if seq != view.last_seq + 1:
                    view.resync()
                    if seq <= view.last_seq:
                        continue
                view.apply(seq, payload)

    def pick(self, tokens: list[int]) -> ServerView:
        keys = block_keys(tokens, self.block_size)
        turn = next(self.rr)
        with self.lock:
            def matched(v: ServerView) -> int:
                n = 0
                for k in keys:
                    if k not in v.keys:
                        break
                    n += 1
                return n

            n = len(self.views)
            order = [self.views[(turn + i) % n] for i in range(n)]
            best = max(order, key=lambda v: (matched(v), -v.in_flight))
            best.in_flight += 1
            return best

    def done(self, view: ServerView) -> None:
        with self.lock:
            view.in_flight -= 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.sock.close()


class RoundRobin:
    def __init__(self, servers: list[tuple[str, str, str]]):
        self.views = [ServerView(url, topic.encode()) for url, _, topic in servers]
        self.rr = itertools.count()

    def pick(self, tokens: list[int]) -> ServerView:
        return self.views[next(self.rr) % len(self.views)]

    def done(self, view: ServerView) -> None:
        pass

    def close(self) -> None:
        pass


def workload(num_requests: int, num_prompts: int, seed: int = 7) -> list[str]:
    """Requests sharing `num_prompts` system prompts of ~200 tokens, each with its own short
    question, in a shuffled order: an agent fleet's traffic, where every session resends its
    system prompt."""
    rng = random.Random(seed)
    systems = [
        f"You are assistant {p}. " + " ".join(f"rule{p}x{j}" for j in range(60))
        for p in range(num_prompts)
    ]
    prompts = [f"{systems[i % num_prompts]}\nQuestion {i}: item{rng.randrange(1000)}?\nAnswer:"
               for i in range(num_requests)]
    rng.shuffle(prompts)
    return prompts


def tokenize(url: str, prompt: str) -> list[int]:
    r = requests.post(f"{url}/tokenize", json={"prompt": prompt}, timeout=30)
    r.raise_for_status()
    return r.json()["tokens"]


def stream_ttft(url: str, prompt: str, max_tokens: int) -> float:
    """Seconds from sending a streamed completion to its first token."""
    t0 = time.monotonic()
    with requests.post(
        f"{url}/v1/completions",
        json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
              "ignore_eos": True},
        stream=True,
        timeout=300,
    ) as r:
        assert r.status_code == 200, r.text
        ttft = None
        for line in r.iter_lines():
            if ttft is None and line.startswith(b"data: {"):
                ttft = time.monotonic() - t0
        assert ttft is not None, "no token streamed"
        return ttft


def prefix_counts(url: str) -> tuple[float, float]:
    """(hits, queries) of the prefix cache, in tokens."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    return (metric_value(text, "sluice_prefix_cache_hits_total") or 0.0,
            metric_value(text, "sluice_prefix_cache_queries_total") or 0.0)


@dataclass
class RunResult:
    policy: str
    hit_rate: float
    ttft: list[float]
    per_server: list[int]

    def summary(self) -> dict:
        q = statistics.quantiles(self.ttft, n=20) if len(self.ttft) >= 2 else self.ttft * 19
        return {
            "policy": self.policy,
            "requests": len(self.ttft),
            "prefix_cache_hit_rate": round(self.hit_rate, 4),
            "ttft_p50_ms": round(statistics.median(self.ttft) * 1000, 1),
            "ttft_p95_ms": round(q[18] * 1000, 1),
            "requests_per_server": self.per_server,
        }


def run(policy, servers: list[tuple[str, str, str]], prompts: list[str], clients: int,
        max_tokens: int) -> RunResult:
    """Sends `prompts` through `policy` with `clients` at a time; the hit rate is over every
    server's prefix-cache counters."""
    before = [prefix_counts(url) for url, _, _ in servers]
    tokens = [tokenize(servers[0][0], p) for p in prompts]
    per_server = {v.url: 0 for v in policy.views}
    counted = threading.Lock()

    def one(i: int) -> float:
        view = policy.pick(tokens[i])
        try:
            with counted:
                per_server[view.url] += 1
            return stream_ttft(view.url, prompts[i], max_tokens)
        finally:
            policy.done(view)

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        ttft = list(pool.map(one, range(len(prompts))))
    after = [prefix_counts(url) for url, _, _ in servers]
    hits = sum(a[0] - b[0] for a, b in zip(after, before))
    queries = sum(a[1] - b[1] for a, b in zip(after, before))
    name = "prefix-aware" if isinstance(policy, PrefixPicker) else "round-robin"
    return RunResult(name, hits / queries if queries else 0.0, ttft, list(per_server.values()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--prompts", type=int, default=6, help="distinct system prompts")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--kv-cache-memory", default="17MiB",
                    help="per server: 17MiB is ~48 blocks of SmolLM2, about three system prompts")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--external", action="append", default=[], metavar="URL=EVENTS=TOPIC",
                    help="route to these running servers instead of starting them (repeat per "
                         "server); their prefix caches are reset before each policy")
    ap.add_argument("--require-better", action="store_true",
                    help="exit 1 unless prefix-aware routing's hit rate beats round-robin's")
    args = ap.parse_args()
    prompts = workload(args.requests, args.prompts)
    results = []
    if args.external:
        servers = [tuple(s.split("=", 2)) for s in args.external]
        by_policy = {}
        for policy_name in ("round-robin", "prefix-aware"):
            for url, _, _ in servers:
                requests.post(f"{url}/reset_prefix_cache", timeout=30).raise_for_status()
            policy = PrefixPicker(servers) if policy_name == "prefix-aware" else RoundRobin(servers)
            time.sleep(0.5)
            try:
                r = run(policy, servers, prompts, args.clients, args.max_tokens)
            finally:
                policy.close()
            by_policy[policy_name] = r
            results.append(r.summary())
            print(json.dumps(results[-1]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
        if args.require_better and not (
            by_policy["prefix-aware"].hit_rate > by_policy["round-robin"].hit_rate
        ):
            raise SystemExit("prefix-aware routing did not beat round-robin's hit rate")
        return
    for _ in range(args.rounds):
        for policy_name in ("round-robin", "prefix-aware"):
            servers, procs = [], []
            try:
                for i in range(args.servers):
                    port, topic = free_port(), f"kv@server{i}@smollm2"
                    srv = SluiceServer("--kv-cache-memory", args.kv_cache_memory,
                                       "--kv-events", f"tcp://*:{port}",
                                       "--kv-events-topic", topic, name=f"sim{i}").start()
                    procs.append(srv)
                    servers.append((srv.url, f"tcp://127.0.0.1:{port}", topic))
                policy = PrefixPicker(servers) if policy_name == "prefix-aware" else RoundRobin(servers)
                time.sleep(0.5)  # the SUB's subscriptions reach every server
                try:
                    r = run(policy, servers, prompts, args.clients, args.max_tokens)
                finally:
                    policy.close()
                results.append(r.summary())
                print(json.dumps(results[-1]), flush=True)
            finally:
                for srv in procs:
                    srv.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
