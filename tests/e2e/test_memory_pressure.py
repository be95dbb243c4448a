"""Memory pressure: a KV pool of about 48 blocks under 16 concurrent requests of ~300 tokens each
(~19 blocks apiece), so the running set is preempted again and again. Every request completes,
its greedy text equals the text the same requests get from a server with a large pool, and
`sluice_preemptions_total` is non-zero."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
import requests

from harness import SluiceServer

# SmolLM2-135M with an f16 KV cache: 30 layers x 3 KV heads x 64 dims x (K, V) x 2 bytes x 16
# tokens = 368,640 bytes per block; 17 MiB holds 48 of them.
SMALL_POOL = "17MiB"
CLIENTS = 16
# About 200 tokens: each `itemN` word is about three.
PROMPT_WORDS = 65
MAX_TOKENS = 100


def prompt(i: int) -> str:
    # Distinct from the first words on, so no prefix is shared between requests.
    words = " ".join(f"item{(i * 31 + j) % 89}" for j in range(PROMPT_WORDS))
    return f"List {i}: {words}\nSummary of list {i}:"


def complete(url: str, i: int) -> dict:
    r = requests.post(
        f"{url}/v1/completions",
        json={
            "prompt": prompt(i),
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        },
        timeout=300,
    )
    assert r.status_code == 200, f"request {i}: {r.status_code} {r.text[:300]}"
    return r.json()


def run_all(url: str) -> list[dict]:
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(lambda i: complete(url, i), range(CLIENTS)))


@pytest.fixture
def small():
    srv = SluiceServer("--kv-cache-memory", SMALL_POOL, name="small-pool")
    try:
        yield srv.start()
    finally:
        srv.close()


# Two servers each run 16 x 300 tokens. On a CPU without AVX-512, where the forward runs on
# candle's fallbacks, that took 425 s (2026-11-22, AMD EPYC, 2 cores); with AVX-512 about a
# minute. pytest.ini's 300 s is for everything else.
@pytest.mark.timeout(900)
def test_preemption_storm_loses_nothing_and_changes_no_token(server, small):
    capacity = small.metric("sluice_kv_cache_blocks_capacity")
    assert 40 <= capacity <= 56, f"{SMALL_POOL} gave {capacity} blocks, not ~48"
    assert small.metric("sluice_preemptions_total") == 0

    t0 = time.monotonic()
    pressured = run_all(small.url)
    elapsed = time.monotonic() - t0
    reference = run_all(server.url)  # the shared server: a 1 GiB pool, thousands of blocks

    preemptions = small.metric("sluice_preemptions_total")
    assert preemptions > 0, "16 x 300 tokens through 48 blocks and nothing was preempted"
    for i, (got, want) in enumerate(zip(pressured, reference)):
        choice = got["choices"][0]
        assert choice["finish_reason"] == "length", (i, choice)
        assert got["usage"]["completion_tokens"] == MAX_TOKENS
        total = got["usage"]["prompt_tokens"] + MAX_TOKENS
        assert 250 <= total <= capacity * 16, f"request {i}: {total} tokens"
        assert choice["text"] == want["choices"][0]["text"], (
            f"request {i}: preempted text differs from the large-pool text:\n"
            f"{choice['text']!r}\nvs\n{want['choices'][0]['text']!r}"
        )
    # The pool is whole again.
    deadline = time.monotonic() + 10
    while small.metric("sluice_kv_cache_blocks_used") != 0:
        assert time.monotonic() < deadline, "KV blocks still in use after every request finished"
        time.sleep(0.1)
    assert small.metric("sluice_requests_running") == 0
    print(
        f"{CLIENTS} requests through {capacity:.0f} blocks in {elapsed:.1f} s with "
        f"{preemptions:.0f} preemptions"
    )
