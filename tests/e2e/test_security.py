"""Security defaults of the real binary: with an API key every API route of the OpenAPI document
requires it while /health, /version and /openapi.json stay open, and /metrics too unless
`metrics_require_key` (set here through the TOML config file) closes it; CORS is off by
default; and the info-level log never carries request content (prompts, messages, stop
strings, generated text)."""

from __future__ import annotations

import json

import pytest
import requests

from harness import MODEL_NAME, ROOT, SluiceServer, free_port

KEY = "sk-e2e-security"
DOCUMENT = json.loads((ROOT / "crates/sluice-server/src/routes/service/openapi.json").read_text())
# A body each POST route accepts.
BODIES = {
    "/v1/completions": {"prompt": "Hello", "max_tokens": 2},
    "/v1/completions/render": {"prompt": "Hello", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "/v1/chat/completions/render": {"messages": [{"role": "user", "content": "Hi"}]},
    "/v1/embeddings": {"input": "Hello"},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 2},
    "/v1/messages": {"model": MODEL_NAME, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
    "/v1/messages/count_tokens": {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}]},
    "/tokenize": {"prompt": "Hello"},
    "/detokenize": {"tokens": [19556]},
    # vLLM's runtime LoRA routes (the keyed server allows them): loaded, then unloaded.
    "/v1/load_lora_adapter": {"lora_name": "sec", "lora_path": str(ROOT / "models/lora/smollm2-r16.gguf")},
    "/v1/unload_lora_adapter": {"lora_name": "sec"},
    # Loading the served model is a no-op; unloading it (the document lists it last) leaves it
    # to load again on the next request.
    "/models/load": {"model": MODEL_NAME},
    "/models/unload": {"model": MODEL_NAME},
}
# Keyed routes that read no body: the prefix cache's (served with --kv-events).
BODILESS = {"/debug/kv_cache", "/reset_prefix_cache"}


def operations() -> list[tuple[str, str]]:
    return [(m, p) for p, item in DOCUMENT["paths"].items() for m in item]


def call(
    url: str, method: str, path: str, key: str | None, response_id: str = "resp_none"
) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    concrete = path.replace("{model}", MODEL_NAME).replace("{response_id}", response_id)
    return requests.request(
        method, f"{url}{concrete}", json=BODIES.get(path), headers=headers, timeout=60
    )


@pytest.fixture(scope="module")
def keyed():
    # --kv-events: the prefix cache's routes are served (behind the key) only with it; so are
    # the LoRA routes with --allow-runtime-lora-updating.
    srv = SluiceServer(
        "--api-key", KEY, "--kv-cache-memory", "128MiB",
        "--kv-events", f"tcp://*:{free_port()}", "--allow-runtime-lora-updating", name="keyed",
    )
    try:
        yield srv.start()
    finally:
        srv.close()


@pytest.fixture(scope="module")
def keyed_metrics(tmp_path_factory):
    config = tmp_path_factory.mktemp("config") / "sluice.toml"
    config.write_text(f'api_key = "{KEY}"\nmetrics_require_key = true\n')
    srv = SluiceServer(
        "--config", str(config), "--kv-cache-memory", "128MiB", name="keyed-metrics"
    )
    try:
        yield srv.start()
    finally:
        srv.close()


def test_every_api_route_needs_the_key_and_probes_stay_open(keyed):
    api = [
        (m, p) for m, p in operations() if p.startswith("/v1/") or p in BODIES or p in BODILESS
    ]
    assert len(api) == 19, api
    # A stored response for GET /v1/responses/{response_id} to find.
    stored = call(keyed.url, "post", "/v1/responses", KEY).json()["id"]
    for method, path in api:
        for key in (None, "sk-wrong", KEY + "x"):
            r = call(keyed.url, method, path, key, stored)
            assert r.status_code == 401, f"{method} {path} with {key!r}: {r.status_code}"
            if path.startswith("/v1/messages"):
                # Anthropic's error shape.
                assert r.json()["error"]["type"] == "authentication_error"
            else:
                assert r.json()["error"]["code"] == "invalid_api_key"
        r = call(keyed.url, method, path, KEY, stored)
        assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text[:200]}"
    for method, path in operations():
        if (method, path) not in api:
            r = call(keyed.url, method, path, None)
            assert r.status_code == 200, f"{method} {path} should be open: {r.status_code}"


def test_metrics_require_key_closes_metrics(keyed_metrics):
    url = keyed_metrics.url
    assert requests.get(f"{url}/metrics", timeout=10).status_code == 401
    r = requests.get(f"{url}/metrics", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert r.status_code == 401
    r = requests.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert r.status_code == 200 and "sluice_requests_running" in r.text
    for path in ("/health", "/version", "/openapi.json"):
        assert requests.get(f"{url}{path}", timeout=10).status_code == 200, path
    r = requests.post(f"{url}/v1/completions", json=BODIES["/v1/completions"], timeout=60)
    assert r.status_code == 401


def test_cors_is_off_by_default(server):
    preflight = requests.options(
        f"{server.url}/v1/completions",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
        timeout=10,
    )
    assert "access-control-allow-origin" not in preflight.headers
    r = requests.post(
        f"{server.url}/v1/completions",
        json={"prompt": "Hi", "max_tokens": 1},
        headers={"Origin": "http://evil.example"},
        timeout=60,
    )
    assert r.status_code == 200
    assert not any(h.lower().startswith("access-control-") for h in r.headers)


def test_the_info_log_carries_no_request_content(keyed):
    # A word nothing else writes: the log is this module's server's own.
    marker = "zq5b1c3e9f0d7a4c2e8b6f1a3d9c7e5b2"
    auth = {"Authorization": f"Bearer {KEY}"}
    url = keyed.url
    sent = [
        ("/v1/completions", {"prompt": f"Secret {marker} says", "max_tokens": 24,
                             "stop": [f"{marker}-stop"], "ignore_eos": True}),
        ("/v1/completions", {"prompt": f"Secret {marker} streams", "max_tokens": 8, "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "system", "content": f"{marker} sys"},
                                               {"role": "user", "content": f"{marker} user"}],
                                  "max_tokens": 24, "ignore_eos": True}),
        ("/tokenize", {"prompt": f"{marker} tokenize"}),
        # Refused requests too: the error must not be logged with the body.
        ("/v1/completions", {"prompt": f"{marker} hot", "temperature": 9}),
        ("/v1/chat/completions", {"messages": [{"role": f"{marker}-role", "content": "x"}]}),
        ("/v1/completions", {"prompt": f"{marker} unknown model", "model": f"{marker}-model"}),
    ]
    outputs = []
    for path, body in sent:
        r = requests.post(f"{url}{path}", json=body, headers=auth, timeout=60)
        assert r.status_code in (200, 400, 404), (path, r.status_code, r.text[:200])
        if r.status_code == 200 and path != "/tokenize" and not body.get("stream"):
            choice = r.json()["choices"][0]
            outputs.append(choice.get("text") or choice["message"]["content"])
    # A bad key with the marker in it is not logged either.
    r = requests.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {marker}"}, timeout=10)
    assert r.status_code == 401

    log = keyed.log_path.read_text(errors="replace")
    assert "request finished" in log, "no request line at info: is the log being written?"
    assert log.count("request finished") >= 3, log[-2000:]
    assert marker not in log, "request content in the info log:\n" + "\n".join(
        line for line in log.splitlines() if marker in line
    )
    assert KEY not in log, "the API key is in the log"
    for text in outputs:
        if len(text) >= 20:
            assert text not in log, f"generated text {text!r} is in the log"
