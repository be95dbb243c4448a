"""Scale-out by KV-cache events, simulated on this machine (kv_routing.py): two sluice servers
with small KV caches behind a prefix-aware picker that routes by the events it receives, and
behind round-robin, on the same workload of shared system prompts. Routing by the events keeps
each system prompt on one server, so its prefix cache hits where round-robin's evicts; and the
picker's view of each server, built from the events alone, is that server's prefix cache.

Only the hit rate is asserted (timings belong in benchmarks: the TTFT of both policies is in
BENCHMARKS.md, measured by running kv_routing.py as a script)."""

from __future__ import annotations

import time

import pytest
import requests

from harness import SluiceServer, free_port
from kv_routing import PrefixPicker, RoundRobin, block_keys, run, workload

SERVERS = 2
REQUESTS = 48
PROMPTS = 4


def start(n: int) -> tuple[list[SluiceServer], list[tuple[str, str, str]]]:
    procs, servers = [], []
    for i in range(n):
        port, topic = free_port(), f"kv@server{i}@smollm2"
        # 17 MiB: ~48 blocks, room for about three of the ~13-block system prompts.
        srv = SluiceServer("--kv-cache-memory", "17MiB", "--kv-events", f"tcp://*:{port}",
                           "--kv-events-topic", topic, name=f"route{i}")
        procs.append(srv)
        servers.append((srv.url, f"tcp://127.0.0.1:{port}", topic))
    for srv in procs:
        srv.start()
    return procs, servers


@pytest.mark.timeout(900)
def test_routing_by_kv_events_beats_round_robin_on_shared_prompts():
    prompts = workload(REQUESTS, PROMPTS)
    procs, servers = start(SERVERS)
    try:
        rr = run(RoundRobin(servers), servers, prompts, clients=2, max_tokens=4)
    finally:
        for p in procs:
            p.close()
    procs, servers = start(SERVERS)
    picker = PrefixPicker(servers)
    try:
        time.sleep(0.5)  # the picker's subscriptions reach both servers
        aware = run(picker, servers, prompts, clients=2, max_tokens=4)
        # The picker's view of each server, from events alone, is the server's prefix cache.
        time.sleep(0.5)
        with picker.lock:
            for view in picker.views:
                snap = requests.get(f"{view.url}/debug/kv_cache", timeout=30).json()
                assert view.last_seq == snap["last_seq"]
                assert len(view.keys) == snap["num_blocks"]
                assert set(view.engine_to_key) == {b["hash"] for b in snap["blocks"]}
                assert view.resyncs == 0
    finally:
        picker.close()
        for p in procs:
            p.close()
    print(f"round-robin {rr.summary()}\nprefix-aware {aware.summary()}")
    assert min(aware.per_server) > 0, "the picker used every server"
    assert aware.hit_rate > rr.hit_rate + 0.2, (rr.summary(), aware.summary())


def test_block_keys_chain_the_whole_prefix():
    a = block_keys(list(range(40)), 16)
    b = block_keys(list(range(32)) + [99] * 8, 16)
    c = block_keys([7] + list(range(1, 40)), 16)
    assert len(a) == 2 and a == b, "the partial last block has no key"
    assert a[1] != c[1], "a block's key covers every token before it"
