"""Cancellation storm: 200 concurrent streams, half of them hung up at random points (before the
first token, mid-stream, during the prefill of a long prompt). The other half complete with
exactly the greedy text each prompt gets alone, and afterwards /metrics shows the KV blocks and
the running count back at their idle values. The storm runs three times: on the shared server,
on one with n-gram speculation on (`--speculative ngram`), whose rolled-back drafts must leak
nothing either, and on one with a draft model (the default model drafting for itself), whose
own KV cache must be empty afterwards too."""

from __future__ import annotations

import json
import random
import socket
import threading
import time

import pytest
import requests

from harness import MODEL, metric_value, parse_metrics, served

COMPLETERS = 100
HANGUPS_BEFORE_FIRST_TOKEN = 34
HANGUPS_MID_STREAM = 33
HANGUPS_IN_PREFILL = 33
DISTINCT_PROMPTS = 20
MAX_TOKENS = 12
# Long prompts whose prefill is cut short: a few thousand tokens in all, a few engine steps.
LONG_PROMPT_WORDS = 300
SEED = 20251121

USED = "sluice_kv_cache_blocks_used"
RUNNING = "sluice_requests_running"
WAITING = "sluice_requests_waiting"
DRAFT_USED = "sluice_draft_kv_cache_blocks_used"


def wait_idle(server, timeout: float = 60.0) -> tuple[float, float, float]:
    deadline = time.monotonic() + timeout
    while True:
        text = server.metrics_text()
        values = tuple(metric_value(text, n) for n in (USED, RUNNING, WAITING))
        if values[1] == 0 and values[2] == 0:
            return values
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle: {USED, RUNNING, WAITING} = {values}")
        time.sleep(0.1)


def completion_body(prompt: str, max_tokens: int, ignore_eos: bool = False) -> bytes:
    return json.dumps(
        {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": ignore_eos,
        }
    ).encode()


def stream_text(url: str, prompt: str) -> tuple[str, str]:
    """A full greedy stream: its text and its finish reason, checking it ends with [DONE]."""
    r = requests.post(
        f"{url}/v1/completions",
        data=completion_body(prompt, MAX_TOKENS),
        headers={"Content-Type": "application/json"},
        stream=True,
        timeout=180,
    )
    assert r.status_code == 200, f"{r.status_code}: {r.text[:300]}"
    text, finish, done = [], None, False
    # Split on newlines only: iter_lines(decode_unicode=True) also splits on U+2028, which
    # JSON strings carry unescaped.
    for line in r.iter_lines(delimiter=b"\n"):
        line = line.rstrip(b"\r").decode("utf-8")
        if not line or line.startswith(":"):
            continue
        assert line.startswith("data: "), line
        data = line[len("data: ") :]
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        assert "error" not in chunk, chunk
        choice = chunk["choices"][0]
        text.append(choice["text"])
        finish = choice["finish_reason"] or finish
    assert done, "the stream ended without [DONE]"
    return "".join(text), finish


class RawStream:
    """A streaming completion over a bare socket, so the test decides exactly when it hangs up."""

    def __init__(self, port: int, body: bytes):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        head = (
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + body)
        self.buffer = b""

    def read_until(self, marker: bytes, count: int = 1) -> None:
        while self.buffer.count(marker) < count:
            data = self.sock.recv(65536)
            if not data:
                raise AssertionError(f"the server closed the stream early: {self.buffer[-300:]!r}")
            self.buffer += data

    def read_headers(self) -> None:
        self.read_until(b"\r\n\r\n")
        status = self.buffer.split(b"\r\n", 1)[0]
        assert b" 200 " in status, self.buffer[:300]

    def read_tokens(self, k: int) -> None:
        # Every event after the headers is `data: {...}\n\n`; the first k carry tokens.
        self.read_until(b'"text":"', k)

    def hang_up(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def speculative_server():
    yield from served("--speculative", "ngram", name="speculative")


@pytest.fixture(scope="module")
def draft_server():
    yield from served("--speculative", f"draft:{MODEL}", name="draft")


@pytest.mark.parametrize("which", ["server", "speculative_server", "draft_server"])
def test_cancellation_storm(request, which):
    storm(request.getfixturevalue(which))


def storm(server) -> None:
    """The storm on `server` (also run on a mixture of experts by test_moe.py)."""
    rng = random.Random(SEED)
    idle_used = wait_idle(server)[0]

    prompts = [
        f"Note {i}: the {word} of the story is that"
        for i, word in enumerate(
            "moral point end start heart twist lesson idea theme hero "
            "villain setting tone plot voice style mood pace title ending".split()
        )
    ][:DISTINCT_PROMPTS]
    # The reference: each prompt run alone on the idle server.
    alone = {p: stream_text(server.url, p) for p in prompts}
    abort_series = 'sluice_request_success_total{finish_reason="abort"}'
    aborts_before = _series(server.metrics_text(), abort_series)

    jobs: list[tuple[str, object]] = []
    jobs += [("complete", prompts[i % DISTINCT_PROMPTS]) for i in range(COMPLETERS)]
    jobs += [("before_first_token", i) for i in range(HANGUPS_BEFORE_FIRST_TOKEN)]
    jobs += [("mid_stream", i) for i in range(HANGUPS_MID_STREAM)]
    jobs += [("in_prefill", i) for i in range(HANGUPS_IN_PREFILL)]
    rng.shuffle(jobs)
    plans = [(kind, arg, rng.random(), rng.randint(1, 8)) for kind, arg in jobs]

    results: list = [None] * len(plans)
    start = threading.Barrier(len(plans))

    def run(index: int) -> None:
        kind, arg, u, k = plans[index]
        try:
            start.wait(timeout=60)
            # Spread the arrivals over a second so hang-ups interleave with running streams.
            time.sleep(u)
            if kind == "complete":
                results[index] = ("complete", arg, stream_text(server.url, arg))
                return
            if kind == "before_first_token":
                s = RawStream(server.port, completion_body(f"Hang-up {arg} asks:", 64, True))
                if u < 0.5:
                    s.read_headers()  # admitted, then gone before any token
                s.hang_up()
            elif kind == "mid_stream":
                s = RawStream(server.port, completion_body(f"Reader {arg} reads:", 64, True))
                s.read_headers()
                s.read_tokens(k)
                s.hang_up()
            else:
                words = " ".join(f"w{(arg * 7919 + j) % 997}" for j in range(LONG_PROMPT_WORDS))
                s = RawStream(server.port, completion_body(f"Long {arg}: {words}", 64, True))
                # Gone within 0-150 ms: while its prompt is queued or being prefilled.
                time.sleep(0.15 * u)
                s.hang_up()
            results[index] = (kind, arg, None)
        except BaseException as e:  # noqa: BLE001 - reported below
            results[index] = ("failed", (kind, arg), e)

    t0 = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "a client hung"
    elapsed = time.monotonic() - t0

    failed = [r for r in results if r is None or r[0] == "failed"]
    assert not failed, f"{len(failed)} clients failed, e.g. {failed[0]!r}"
    completed = [r for r in results if r[0] == "complete"]
    assert len(completed) == COMPLETERS
    wrong = [(p, got, alone[p]) for _, p, got in completed if got != alone[p]]
    assert not wrong, (
        f"{len(wrong)} of {COMPLETERS} streams differ from the same prompt alone, e.g. "
        f"{wrong[0][0]!r}: {wrong[0][1]!r} vs alone {wrong[0][2]!r}"
    )

    # The server settles back to idle: every hung-up sequence aborted, its blocks freed.
    deadline = time.monotonic() + 10
    while True:
        text = server.metrics_text()
        used, running, waiting = (metric_value(text, n) for n in (USED, RUNNING, WAITING))
        draft_used = metric_value(text, DRAFT_USED) or 0
        if used == idle_used and running == 0 and waiting == 0 and draft_used == 0:
            break
        assert time.monotonic() < deadline, (
            f"10 s after the storm: {USED}={used} (idle {idle_used}) {RUNNING}={running} "
            f"{WAITING}={waiting} {DRAFT_USED}={draft_used}"
        )
        time.sleep(0.1)
    aborts = _series(text, abort_series) - aborts_before
    # Mid-stream readers saw tokens, so their sequences were in the engine when they left.
    assert aborts >= HANGUPS_MID_STREAM, f"only {aborts} sequences ended with abort"
    server_errors = [
        (labels, v)
        for name, labels, v in _samples(text, "sluice_http_requests_total")
        # /health answers 503 while the model loads, by design.
        if 'status="5' in labels and 'route="/health"' not in labels and v > 0
    ]
    assert not server_errors, server_errors
    print(f"storm of {len(plans)} streams took {elapsed:.1f} s; {aborts:.0f} aborted in the engine")


def _samples(text: str, name: str):
    return [(n, labels, v) for n, labels, v in parse_metrics(text) if n == name]


def _series(text: str, series: str) -> float:
    """The sum of `name{label}`'s samples whose labels hold `label` (beside `model`)."""
    name, _, rest = series.partition("{")
    label = rest.rstrip("}")
    return sum(v for _, l, v in _samples(text, name) if label in l)
