"""Clients that hang up mid-stream abort their sequences: the KV blocks come back at once."""

from __future__ import annotations

import threading
import time

import openai

CLIENTS = 20
TOKENS_BEFORE_HANGUP = 3
# The bound is "within a second"; a little slack for a loaded 2-core CI machine.
DEADLINE_S = 2.0

USED = "sluice_kv_cache_blocks_used"
RUNNING = "sluice_requests_running"
WAITING = "sluice_requests_waiting"


def wait_idle(server, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.metric(RUNNING) == 0 and server.metric(WAITING) == 0:
            return
        time.sleep(0.1)
    raise AssertionError(
        f"the server is not idle before the test: {RUNNING}={server.metric(RUNNING)} "
        f"{WAITING}={server.metric(WAITING)}"
    )


def test_hangups_free_kv_blocks(server, model_name):
    text = server.metrics_text()
    for name in (USED, RUNNING, WAITING):
        assert f"\n{name}" in f"\n{text}", f"/metrics has no {name}"
    wait_idle(server)
    idle_used = server.metric(USED)

    got_tokens = threading.Barrier(CLIENTS + 1)
    hang_up = threading.Event()
    errors: list = []
    hung_up_at = [0.0] * CLIENTS

    def client(i: int):
        c = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)
        try:
            stream = c.completions.create(
                model=model_name,
                # Distinct prompts of a few blocks each, so nothing is shared by prefix caching.
                prompt=f"Client {i} writes a long essay about the number {i * 7919}: " * 4,
                max_tokens=200,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            seen = 0
            for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    seen += 1
                if seen >= TOKENS_BEFORE_HANGUP:
                    break
            assert seen >= TOKENS_BEFORE_HANGUP, f"client {i}: the stream ended after {seen}"
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            got_tokens.abort()
            return
        try:
            got_tokens.wait(timeout=120)
            hang_up.wait(timeout=120)
        finally:
            stream.close()  # closes the HTTP response: the client is gone
            hung_up_at[i] = time.monotonic()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        got_tokens.wait(timeout=180)
    except threading.BrokenBarrierError:
        pass
    try:
        assert not errors, f"a client failed before hanging up: {errors[0]!r}"
        busy_used = server.metric(USED)
        busy_running = server.metric(RUNNING)
        assert busy_used > idle_used, (
            f"{USED} is {busy_used} with {CLIENTS} streams running (idle: {idle_used})"
        )
        assert busy_running >= 1
    finally:
        hang_up.set()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    last_hangup = max(hung_up_at)

    seen = []
    while True:
        used, running = server.metric(USED), server.metric(RUNNING)
        elapsed = time.monotonic() - last_hangup
        seen.append((round(elapsed, 2), used, running))
        if used == idle_used and running == 0:
            print(f"KV blocks back at idle {elapsed:.2f} s after the last hang-up: {seen}")
            break
        if elapsed > DEADLINE_S:
            # Tell whether the blocks come back late (slow abort) or never (leak / no abort).
            late = time.monotonic() + 60
            while time.monotonic() < late and server.metric(USED) != idle_used:
                time.sleep(0.5)
            after = time.monotonic() - last_hangup
            raise AssertionError(
                f"{DEADLINE_S} s after {CLIENTS} clients hung up, {USED}={used} "
                f"{RUNNING}={running} (idle {USED}={idle_used}); "
                f"after {after:.1f} s {USED}={server.metric(USED)}; "
                f"(seconds, used, running) polled: {seen[:5]} ... {seen[-3:]}"
            )
        time.sleep(0.05)

    # The server still serves.
    c = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)
    r = c.completions.create(
        model=model_name, prompt="The capital of France is", max_tokens=3, temperature=0
    )
    assert r.choices[0].text.startswith(" Paris")
