"""Servers of their own: API key (401), body limit (413), a tiny queue (429) - seen through the
official SDK's typed exceptions and raw HTTP."""

from __future__ import annotations

import threading

import openai
import pytest
import requests

from harness import SluiceServer

API_KEY = "sk-e2e-secret"
ERROR_KEYS = {"message", "type", "param", "code"}


def assert_openai_error(r: requests.Response, status: int) -> dict:
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text[:300]}"
    body = r.json()
    assert set(body) == {"error"}, body
    assert ERROR_KEYS <= set(body["error"]), body
    assert body["error"]["message"], body
    return body["error"]


@pytest.fixture(scope="module")
def keyed_server():
    srv = SluiceServer(
        "--api-key", API_KEY, "--body-limit", "64KiB", "--kv-cache-memory", "128MiB", name="api-key"
    )
    try:
        yield srv.start()
    finally:
        srv.close()


def test_wrong_api_key_is_authentication_error(keyed_server, model_name):
    bad = openai.OpenAI(base_url=keyed_server.base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.completions.create(model=model_name, prompt="Hello", max_tokens=2)
    assert info.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_missing_api_key_is_401(keyed_server, model_name):
    r = requests.post(
        f"{keyed_server.base_url}/completions",
        json={"model": model_name, "prompt": "Hello", "max_tokens": 2},
        timeout=30,
    )
    assert_openai_error(r, 401)


def test_right_api_key_works(keyed_server, model_name):
    good = openai.OpenAI(base_url=keyed_server.base_url, api_key=API_KEY, max_retries=0)
    r = good.completions.create(
        model=model_name, prompt="The capital of France is", max_tokens=3, temperature=0
    )
    assert r.choices[0].text.startswith(" Paris")


def test_body_too_large_is_413(keyed_server, model_name):
    r = requests.post(
        f"{keyed_server.base_url}/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": model_name, "prompt": "word " * 40_000, "max_tokens": 2},
        timeout=30,
    )
    assert r.status_code == 413, f"got {r.status_code}: {r.text[:300]}"


def test_queue_full_is_rate_limit_error(start_server, model_name):
    srv = start_server("--max-num-seqs", "1", "--max-waiting", "1", name="tiny-queue")
    clients = 8
    barrier = threading.Barrier(clients)
    outcomes: list = [None] * clients

    def one(i: int):
        c = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=120)
        barrier.wait()
        try:
            r = c.completions.create(
                model=model_name,
                prompt=f"Request number {i} says:",
                max_tokens=32,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            outcomes[i] = r
        except Exception as e:  # noqa: BLE001 - recorded and asserted on below
            outcomes[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads), "a request hung"

    limited = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    done = [o for o in outcomes if isinstance(o, openai.types.Completion)]
    others = [o for o in outcomes if o not in limited and o not in done]
    assert not others, f"neither a completion nor a 429: {others!r}"
    assert limited, "8 concurrent requests with max-num-seqs 1 and max-waiting 1: no 429"
    assert done, "every request was refused"
    assert all(r.usage.completion_tokens == 32 for r in done)
    for e in limited:
        assert e.status_code == 429
        assert e.response.headers.get("retry-after"), "429 without Retry-After"
        assert e.message

    # The queue drains and the server takes requests again.
    c = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=120)
    r = c.completions.create(model=model_name, prompt="Hello", max_tokens=2)
    assert r.usage.completion_tokens >= 1
