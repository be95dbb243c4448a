"""The non-OpenAI routes and the error shape, over plain HTTP."""

from __future__ import annotations

import requests

ERROR_KEYS = {"message", "type", "param", "code"}


def test_health(server):
    r = requests.get(f"{server.url}/health", timeout=10)
    assert r.status_code == 200


def test_version(server):
    r = requests.get(f"{server.url}/version", timeout=10)
    assert r.status_code == 200
    assert r.json().get("version"), r.text


def test_models_max_model_len(server, model_name):
    r = requests.get(f"{server.base_url}/models", timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    (model,) = body["data"]
    assert model["id"] == model_name
    assert isinstance(model["max_model_len"], int) and model["max_model_len"] > 0


def test_tokenize_detokenize_roundtrip(server):
    text = "The capital of France is Paris. Ünïcödé ✓"
    r = requests.post(f"{server.url}/tokenize", json={"prompt": text}, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0
    assert all(isinstance(t, int) for t in body["tokens"])
    models = requests.get(f"{server.base_url}/models", timeout=10).json()
    assert body["max_model_len"] == models["data"][0]["max_model_len"]
    r = requests.post(f"{server.url}/detokenize", json={"tokens": body["tokens"]}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["prompt"] == text


def _error(r: requests.Response) -> dict:
    assert r.status_code == 400, f"expected 400, got {r.status_code}: {r.text[:300]}"
    body = r.json()
    assert ERROR_KEYS <= set(body.get("error", {})), body
    return body["error"]


def test_malformed_json_is_400(server):
    r = requests.post(
        f"{server.base_url}/completions",
        data=b'{"model": "x", "prompt": ',
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert _error(r)["message"]


def test_wrong_type_is_400_with_param(server, model_name):
    r = requests.post(
        f"{server.base_url}/completions",
        json={"model": model_name, "prompt": "Hi", "max_tokens": "many"},
        timeout=10,
    )
    assert _error(r)["message"]
    r = requests.post(
        f"{server.base_url}/chat/completions",
        json={"model": model_name, "messages": [{"role": "user", "content": "Hi"}], "top_p": 7},
        timeout=10,
    )
    assert _error(r)["param"] == "top_p"


def test_context_length_message(server, model_name):
    max_len = requests.get(f"{server.base_url}/models", timeout=10).json()["data"][0][
        "max_model_len"
    ]
    r = requests.post(
        f"{server.base_url}/completions",
        json={"model": model_name, "prompt": "Hello " * (max_len + 1), "max_tokens": 1},
        timeout=30,
    )
    err = _error(r)
    assert f"maximum context length is {max_len} tokens" in err["message"], err["message"]
    assert err["param"]


def test_too_many_stop_strings_is_400(server, model_name):
    r = requests.post(
        f"{server.base_url}/completions",
        json={
            "model": model_name,
            "prompt": "Hi",
            "max_tokens": 2,
            "stop": [f"stop{i}" for i in range(1000)],
        },
        timeout=10,
    )
    assert _error(r)["param"] == "stop"
