"""Graceful shutdown: SIGTERM while streams run lets them finish, refuses new work, exits 0."""

from __future__ import annotations

import threading
import time

import openai
import requests

STREAMS = 3
MAX_TOKENS = 200


def refused(url: str, **kwargs) -> str | None:
    """None when the server refused the request (503 or no connection), else what it did."""
    try:
        r = requests.request(timeout=30, url=url, **kwargs)
    except requests.ConnectionError:
        return None
    if r.status_code == 503:
        return None
    return f"{r.status_code}: {r.text[:200]}"


def test_sigterm_drains_streams_and_exits_0(start_server, model_name):
    srv = start_server("--drain-timeout-secs", "120", name="sigterm")
    started = threading.Barrier(STREAMS + 1)
    results: list = [None] * STREAMS

    def stream(i: int):
        c = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=180)
        text, finish, usage, tokens = "", None, None, 0
        try:
            for chunk in c.completions.create(
                model=model_name,
                prompt=f"Story number {i}: once upon a time",
                max_tokens=MAX_TOKENS,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            ):
                if chunk.usage is not None:
                    usage = chunk.usage
                for ch in chunk.choices:
                    text += ch.text
                    tokens += 1
                    finish = ch.finish_reason or finish
                if tokens == 2:
                    started.wait(timeout=120)
            results[i] = (text, finish, usage)
        except BaseException as e:  # noqa: BLE001 - reported below
            results[i] = e
            started.abort()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    try:
        started.wait(timeout=120)  # every stream has its first tokens
    except threading.BrokenBarrierError:
        raise AssertionError(f"a stream failed before SIGTERM: {results}") from None
    unfinished = sum(r is None for r in results)
    assert unfinished == STREAMS, "a stream finished before SIGTERM: the test proves nothing"

    srv.terminate()

    # Draining: /health turns 503 (or the port is closed), then new requests are refused.
    deadline = time.monotonic() + 10
    health = "never asked"
    while time.monotonic() < deadline:
        health = refused(f"{srv.url}/health", method="GET")
        if health is None:
            break
        time.sleep(0.05)
    assert health is None, f"/health still answered {health} 10 s after SIGTERM"
    new = refused(
        f"{srv.base_url}/completions",
        method="POST",
        json={"model": model_name, "prompt": "Hello", "max_tokens": 2},
    )
    assert new is None, f"a new request during the drain was not refused: {new}"
    in_flight_during_refusal = sum(r is None for r in results)

    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads), "a stream never ended after SIGTERM"
    for i, r in enumerate(results):
        assert not isinstance(r, BaseException), f"stream {i} broke after SIGTERM: {r!r}"
        text, finish, usage = r
        assert finish == "length", f"stream {i} ended with finish_reason {finish!r}"
        assert usage is not None and usage.completion_tokens == MAX_TOKENS, usage
        assert text

    code = srv.proc.wait(timeout=120)
    assert code == 0, f"sluice exited with {code} after SIGTERM"
    # Make the refusal checks above meaningful: streams were still running while refusing.
    assert in_flight_during_refusal > 0, "every stream had ended before the refusal was checked"
