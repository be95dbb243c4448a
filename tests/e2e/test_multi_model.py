"""Several models behind one server (`--model` repeated): each answers by its own name, streamed,
at once; an unknown name is a 404 in the API's own shape listing what is served; `/v1/models`
lists every model with its state; under `--max-loaded-models 1` requests for both models at
once all complete (the least recently used idle model is unloaded for the other, never under a
request); `POST /models/load` and `/models/unload` (behind the API key) load and unload by
name; metrics carry a `model` label. The two models are the default model's file under two
names, so their greedy answers must be equal, and equal to a one-model server's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from harness import MISSING_INPUT, MODEL, ROOT, SluiceServer, parse_metrics, run_together

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models")
    for name in ("alpha", "beta"):
        (d / f"{name}.gguf").symlink_to(MODEL.resolve())
    return d


def complete(srv: SluiceServer, model: str, prompt: str, stream: bool = False,
             headers: dict | None = None) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "stream": stream}
    r = requests.post(f"{srv.base_url}/completions", json=body, stream=stream, timeout=300,
                      headers=headers or {})
    assert r.status_code == 200, r.text
    if not stream:
        out = r.json()
        assert out["model"] == model
        assert out["choices"][0]["finish_reason"] == "length"
        return out["choices"][0]["text"]
    text, finish = "", None
    for line in r.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[len(b"data: "):])
        assert chunk["model"] == model
        text += chunk["choices"][0]["text"]
        finish = chunk["choices"][0]["finish_reason"] or finish
    assert finish == "length"
    return text


def configured(config: Path, name: str, model_dir: Path) -> SluiceServer:
    """A server whose models the config file names: the harness's own --model would replace
    the file's list, so it is left out."""
    srv = SluiceServer("--config", str(config), name=name, model=model_dir / "alpha.gguf")
    own = ("--model", str(model_dir / "alpha.gguf"))
    srv.command = lambda: [a for a in SluiceServer.command(srv) if a not in own]
    return srv


def states(srv: SluiceServer) -> dict[str, str]:
    data = requests.get(f"{srv.base_url}/models", timeout=30).json()["data"]
    return {m["id"]: m["state"] for m in data}


@pytest.fixture(scope="module")
def alone() -> dict[str, str]:
    """Greedy answers of a server of the default model alone."""
    srv = SluiceServer("--kv-cache-memory", "64MiB", name="alone")
    try:
        srv.start()
        return {p: complete(srv, srv.model.stem, p) for p in PROMPTS}
    finally:
        srv.close()


def test_two_models_answer_by_name_at_once(model_dir, alone):
    srv = SluiceServer("--model", str(model_dir / "beta.gguf"), "--kv-cache-memory", "64MiB",
                       name="two", model=model_dir / "alpha.gguf")
    try:
        srv.start()
        assert states(srv) == {"alpha": "loaded", "beta": "unloaded"}
        jobs = [(m, p) for m in ("alpha", "beta") for p in PROMPTS]
        results = run_together(lambda job: complete(srv, job[0], job[1], stream=True), jobs)
        for (m, p), got in zip(jobs, results):
            assert got == alone[p], (m, p, got)
        assert states(srv) == {"alpha": "loaded", "beta": "loaded"}
        # An unknown name: OpenAI's 404 listing both, Anthropic's own shape on /v1/messages.
        r = requests.post(f"{srv.base_url}/completions", timeout=30,
                          json={"model": "gamma", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 404
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
        assert "`alpha`" in err["message"] and "`beta`" in err["message"], err
        r = requests.post(f"{srv.base_url}/messages", timeout=30, json={
            "model": "gamma", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 404
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
        # Every API takes `model`: chat and tokenize on beta.
        r = requests.post(f"{srv.base_url}/chat/completions", timeout=120, json={
            "model": "beta", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["model"] == "beta", r.text
        r = requests.post(f"{srv.url}/tokenize", timeout=30,
                          json={"model": "beta", "prompt": "hello"})
        assert r.status_code == 200 and r.json()["count"] > 0, r.text
        # Metrics: each engine's series under its model's name.
        samples = parse_metrics(srv.metrics_text())
        generated = {labels: v for name, labels, v in samples
                     if name == "sluice_generation_tokens_total"}
        assert any('model="alpha"' in l and v > 0 for l, v in generated.items()), generated
        assert any('model="beta"' in l and v > 0 for l, v in generated.items()), generated
    finally:
        srv.close()


def test_lru_unloading_loses_no_request(model_dir, alone):
    srv = SluiceServer("--model", str(model_dir / "beta.gguf"), "--max-loaded-models", "1",
                       "--kv-cache-memory", "64MiB", name="lru", model=model_dir / "alpha.gguf")
    try:
        srv.start()
        # Requests for both at once, in waves: each wave's model must wait for the other's
        # requests to finish before it is loaded; every one completes, none lost.
        jobs = [(m, p) for _ in range(2) for m in ("alpha", "beta") for p in PROMPTS]
        results = run_together(lambda job: complete(srv, job[0], job[1], stream=True), jobs,
                               timeout=600)
        errors = [r for r in results if isinstance(r, Exception)]
        assert not errors, errors
        for (m, p), got in zip(jobs, results):
            assert got == alone[p], (m, p, got)
        st = states(srv)
        assert sorted(st.values()) == ["loaded", "unloaded"], st
        assert "unloading the least recently used model" in srv.log_tail(400)
        samples = parse_metrics(srv.metrics_text())
        loaded = {l: v for n, l, v in samples if n == "sluice_model_loaded"}
        assert sum(loaded.values()) == 1, loaded
    finally:
        srv.close()


def test_load_and_unload_by_name_behind_the_key(model_dir):
    key = {"Authorization": "Bearer k"}
    srv = SluiceServer("--model", str(model_dir / "beta.gguf"), "--api-key", "k",
                       "--kv-cache-memory", "64MiB", name="load", model=model_dir / "alpha.gguf")
    try:
        srv.start()
        r = requests.post(f"{srv.url}/models/load", json={"model": "beta"}, timeout=60)
        assert r.status_code == 401
        r = requests.post(f"{srv.url}/models/load", json={"model": "beta"}, timeout=120,
                          headers=key)
        assert r.status_code == 200 and r.json() == {"model": "beta", "state": "loaded"}
        r = requests.get(f"{srv.base_url}/models", headers=key, timeout=30)
        assert {m["id"]: m["state"] for m in r.json()["data"]} == {
            "alpha": "loaded", "beta": "loaded"}
        r = requests.post(f"{srv.url}/models/unload", json={"model": "alpha"}, timeout=120,
                          headers=key)
        assert r.status_code == 200 and r.json() == {"model": "alpha", "state": "unloaded"}
        card = requests.get(f"{srv.base_url}/models/alpha", headers=key, timeout=30).json()
        assert card["state"] == "unloaded" and "max_model_len" not in card
        r = requests.post(f"{srv.url}/models/unload", json={"model": "gamma"}, timeout=30,
                          headers=key)
        assert r.status_code == 404 and "`alpha`" in r.json()["error"]["message"]
        # A request for the unloaded default loads it again; /health stays 200 throughout.
        assert requests.get(f"{srv.url}/health", timeout=10).status_code == 200
        assert complete(srv, "alpha", "Hello", headers=key)
        assert requests.get(f"{srv.url}/health", timeout=10).status_code == 200
    finally:
        srv.close()


def test_model_tables_give_each_model_its_own_name_and_cache(model_dir, tmp_path):
    config = tmp_path / "sluice.toml"
    config.write_text(
        f'kv_cache_memory = "64MiB"\n'
        f'[[model]]\nmodel = "{model_dir / "alpha.gguf"}"\n'
        f'[[model]]\nmodel = "{model_dir / "beta.gguf"}"\nserved_model_name = "big-cache"\n'
        f'weights = "exact"\nkv_cache_memory = "128MiB"\n'
    )
    srv = configured(config, "tables", model_dir)
    try:
        srv.start()
        assert states(srv) == {"alpha": "loaded", "big-cache": "unloaded"}
        r = requests.post(f"{srv.url}/models/load", json={"model": "big-cache"}, timeout=120)
        assert r.status_code == 200, r.text
        cards = {m["id"]: m for m in requests.get(f"{srv.base_url}/models", timeout=30).json()["data"]}
        # Twice the KV memory holds twice the tokens (both below the 8192-token context).
        small, big = cards["alpha"]["max_model_len"], cards["big-cache"]["max_model_len"]
        assert small < 8192 and big == 2 * small, cards
        assert complete(srv, "big-cache", "Hello")
    finally:
        srv.close()


def test_a_second_model_serves_its_own_adapters(model_dir, tmp_path, alone):
    adapter = ROOT / "models" / "lora" / "smollm2-r16.gguf"
    if not adapter.is_file():
        pytest.skip(f"{MISSING_INPUT} {adapter} missing, run scripts/make-lora-adapters.sh")
    config = tmp_path / "sluice.toml"
    config.write_text(
        f'kv_cache_memory = "64MiB"\n'
        f'[[model]]\nmodel = "{model_dir / "alpha.gguf"}"\n'
        f'[[model]]\nmodel = "{model_dir / "beta.gguf"}"\nlora_modules = "tuned={adapter}"\n'
    )
    srv = configured(config, "adapters", model_dir)
    try:
        srv.start()
        assert states(srv) == {"alpha": "loaded", "beta": "unloaded"}
        # Naming the adapter loads its base model and runs with it.
        tuned = complete(srv, "tuned", PROMPTS[0])
        assert complete(srv, "beta", PROMPTS[0]) == alone[PROMPTS[0]]
        assert tuned != alone[PROMPTS[0]], "the adapter changes the greedy text"
        cards = {m["id"]: m for m in requests.get(f"{srv.base_url}/models", timeout=30).json()["data"]}
        assert cards["tuned"]["parent"] == "beta" and cards["beta"]["state"] == "loaded", cards
        # The default model has no adapter of that name.
        r = requests.post(f"{srv.base_url}/completions", timeout=30,
                          json={"model": "alpha", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 200
    finally:
        srv.close()
