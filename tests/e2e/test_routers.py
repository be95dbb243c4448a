"""What the routers people run in front of vLLM read from sluice, on the real binary.

- The metrics each router picks a server by: every name it reads is on /metrics with vLLM's
  name, Prometheus type and labels, and the values move as the server works (requests waiting
  and running while a burst runs, KV-cache usage above 0, prefix-cache hits growing when a long
  prompt comes back).
- `/v1/models`' `root` and `parent`, as vLLM's.
- The render routes llm-d tokenizes through: the same prompt a generation runs, without
  generating, and the same 400 for a bad body (test_security.py holds them to the API key).

docs/routers.md is the reader's side of this file.
"""

from __future__ import annotations

import random
import re
import threading
import time

import pytest
import requests

from harness import MODEL, MODEL_NAME

# The series each router reads, and the Prometheus type it expects.
GATEWAY_API_INFERENCE_EXTENSION = {
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    # The endpoint picker's default before vLLM renamed it, still the default of older EPPs.
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
}
PRODUCTION_STACK = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:gpu_prefix_cache_hits_total": "counter",
    "vllm:gpu_prefix_cache_queries_total": "counter",
}
# vLLM V1's names of the prefix-cache counters, which newer dashboards read.
VLLM_V1_PREFIX = {
    "vllm:prefix_cache_hits_total": "counter",
    "vllm:prefix_cache_queries_total": "counter",
}
ROUTER_METRICS = {**GATEWAY_API_INFERENCE_EXTENSION, **PRODUCTION_STACK, **VLLM_V1_PREFIX}

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Exposition:
    """One scrape of /metrics: each family's `# TYPE`, and each sample with its labels."""

    def __init__(self, text: str):
        self.text = text
        self.types: dict[str, str] = {}
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                assert name not in self.types, f"two TYPE lines for {name}"
                self.types[name] = kind
                continue
            if not line or line.startswith("#"):
                continue
            m = _SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            labels = dict(_LABEL.findall(m.group(2) or ""))
            self.samples.setdefault(m.group(1), []).append((labels, float(m.group(3))))

    def only(self, name: str) -> tuple[dict[str, str], float]:
        """The one sample of `name` (one model, one engine: one series)."""
        found = self.samples.get(name, [])
        assert len(found) == 1, f"{name}: {len(found)} samples, expected 1\n{self.text}"
        return found[0]

    def value(self, name: str) -> float:
        return self.only(name)[1]


def scrape(server) -> Exposition:
    return Exposition(server.metrics_text())


@pytest.fixture(scope="module")
def busy():
    """A server of this module's own that runs two sequences at a time, so a burst queues."""
    from harness import SluiceServer

    srv = SluiceServer(
        "--kv-cache-memory", "128MiB", "--max-num-seqs", "2", "--max-waiting", "64", name="routers"
    )
    try:
        yield srv.start()
    finally:
        srv.close()


def test_every_name_a_router_reads_is_exported_with_vllms_type_and_labels(busy):
    scraped = scrape(busy)
    for name, kind in ROUTER_METRICS.items():
        assert scraped.types.get(name) == kind, f"{name}: TYPE {scraped.types.get(name)}, want {kind}"
        labels, value = scraped.only(name)
        assert labels.get("model_name") == MODEL_NAME, f"{name}: {labels}"
        assert labels.get("engine") == "0", f"{name}: {labels}"
        assert value >= 0, f"{name} = {value}"
    # No LoRA adapters are served, so none is announced (docs/routers.md says so).
    assert "vllm:lora_requests_info" not in scraped.types


def test_cache_config_info_describes_the_kv_cache(busy):
    scraped = scrape(busy)
    labels, value = scraped.only("vllm:cache_config_info")
    assert value == 1
    # The endpoint picker reads these two labels as integers.
    assert labels["block_size"] == "16", labels
    assert int(labels["num_gpu_blocks"]) == scraped.value("sluice_kv_cache_blocks_capacity") > 0
    assert labels["enable_prefix_caching"] == "True", labels


def test_usage_is_a_fraction_and_agrees_with_sluices_own_series(busy):
    scraped = scrape(busy)
    usage = scraped.value("vllm:kv_cache_usage_perc")
    assert usage == scraped.value("vllm:gpu_cache_usage_perc")
    assert 0 <= usage <= 1
    used = scraped.value("sluice_kv_cache_blocks_used")
    capacity = scraped.value("sluice_kv_cache_blocks_capacity")
    assert usage == pytest.approx(used / capacity)


def test_values_move_while_a_burst_runs(busy):
    """Six long generations on a server that runs two at a time: while they run, routers see
    requests running and waiting and KV blocks in use; after, the queue is empty again."""

    def generate(i: int):
        r = requests.post(
            f"{busy.base_url}/completions",
            json={
                "model": MODEL_NAME,
                "prompt": f"Burst {i}: write a long story about a lighthouse keeper.",
                "max_tokens": 48,
                "ignore_eos": True,
                "temperature": 0,
            },
            timeout=240,
        )
        assert r.status_code == 200, r.text

    threads = [threading.Thread(target=generate, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    peak = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0,
            "vllm:kv_cache_usage_perc": 0.0}
    peak_stack = {"vllm:gpu_cache_usage_perc": 0.0}
    while any(t.is_alive() for t in threads):
        scraped = scrape(busy)
        for name in peak:
            peak[name] = max(peak[name], scraped.value(name))
        for name in peak_stack:
            peak_stack[name] = max(peak_stack[name], scraped.value(name))
        assert scraped.value("vllm:num_requests_running") <= 2
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert peak["vllm:num_requests_running"] > 0, peak
    assert peak["vllm:num_requests_waiting"] > 0, peak
    assert 0 < peak["vllm:kv_cache_usage_perc"] <= 1, peak
    assert peak_stack["vllm:gpu_cache_usage_perc"] > 0, peak_stack
    after = scrape(busy)
    assert after.value("vllm:num_requests_running") == 0
    assert after.value("vllm:num_requests_waiting") == 0
    assert after.value("vllm:kv_cache_usage_perc") == 0


def test_prefix_cache_hits_grow_when_a_long_prompt_comes_back(busy):
    """Counted in tokens, as vLLM counts them: every prompt token is a query, and the second
    time a prompt comes, its leading full blocks are hits (all but the last token's block)."""
    # A list no other test sends (the server's prefix cache is shared), the same every run.
    rng = random.Random(66)
    words = " ".join(f"{rng.getrandbits(24):06x}" for _ in range(120))
    prompt = f"Keep this list in mind: {words}. Now say hello."
    rendered = requests.post(
        f"{busy.base_url}/completions/render", json={"prompt": prompt}, timeout=60
    )
    assert rendered.status_code == 200, rendered.text
    length = len(rendered.json()[0]["token_ids"])
    block = int(scrape(busy).only("vllm:cache_config_info")[0]["block_size"])
    assert length > 4 * block, f"the prompt is only {length} tokens"

    names = ["vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
             "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"]

    def counters() -> dict[str, float]:
        scraped = scrape(busy)
        return {n: scraped.value(n) for n in names}

    def send():
        r = requests.post(
            f"{busy.base_url}/completions",
            json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == length

    before = counters()
    send()
    first = counters()
    send()
    second = counters()
    for n in names:
        assert first[n] >= before[n] and second[n] >= first[n], f"{n} went back"
    for kind in ("hits", "queries"):
        v1, v0 = f"vllm:prefix_cache_{kind}_total", f"vllm:gpu_prefix_cache_{kind}_total"
        assert second[v1] == second[v0], f"{v1} and {v0} differ"
    assert first["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == length
    assert first["vllm:prefix_cache_hits_total"] == before["vllm:prefix_cache_hits_total"]
    assert second["vllm:prefix_cache_queries_total"] - first["vllm:prefix_cache_queries_total"] == length
    hits = second["vllm:prefix_cache_hits_total"] - first["vllm:prefix_cache_hits_total"]
    assert hits == block * ((length - 1) // block), f"{hits} hits of a {length}-token prompt"


# --- /v1/models ------------------------------------------------------------------------------


def test_models_have_vllms_root_and_parent(server):
    r = requests.get(f"{server.base_url}/models", timeout=10)
    assert r.status_code == 200, r.text
    (card,) = r.json()["data"]
    assert card["id"] == MODEL_NAME
    # What the weights came from: the file's name, no path on the server's host.
    assert card["root"] == MODEL.name
    assert card["parent"] is None
    one = requests.get(f"{server.base_url}/models/{MODEL_NAME}", timeout=10).json()
    assert one["root"] == MODEL.name and one["parent"] is None


# --- render ----------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def post(server, path: str, body: dict) -> requests.Response:
    return requests.post(f"{server.url}{path}", json=body, timeout=120)


def test_completions_render_is_the_prompt_a_completion_runs(server):
    body = {"model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 2}
    r = post(server, "/v1/completions/render", body)
    assert r.status_code == 200, r.text
    (rendered,) = r.json()
    assert rendered["prompt"] == body["prompt"]
    assert rendered["model"] == MODEL_NAME
    assert rendered["request_id"].startswith("cmpl-")
    assert rendered["sampling_params"]["max_tokens"] == 2
    tokenized = post(server, "/tokenize", {"prompt": body["prompt"]}).json()
    assert rendered["token_ids"] == tokenized["tokens"]
    completion = post(server, "/v1/completions", body).json()
    assert completion["usage"]["prompt_tokens"] == len(rendered["token_ids"])

    many = post(server, "/v1/completions/render", {"prompt": ["Hello", "Goodbye"]}).json()
    assert [m["prompt"] for m in many] == ["Hello", "Goodbye"]
    for m in many:
        assert m["token_ids"] == post(server, "/tokenize", {"prompt": m["prompt"]}).json()["tokens"]


def test_chat_render_is_the_templated_prompt_a_chat_request_runs(server):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    r = post(server, "/v1/chat/completions/render", {"messages": messages, "max_tokens": 4})
    assert r.status_code == 200, r.text
    rendered = r.json()
    assert rendered["request_id"].startswith("chatcmpl-")
    text = rendered["prompt"]
    # SmolLM2's template (ChatML): each turn in its markers, then the assistant's turn opened.
    assert "<|im_start|>system\nYou are terse.<|im_end|>" in text
    assert "<|im_start|>user\nWhat is 2+2?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    tokenized = post(server, "/tokenize", {"messages": messages}).json()
    assert rendered["token_ids"] == tokenized["tokens"]
    chat = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 4}).json()
    assert chat["usage"]["prompt_tokens"] == len(rendered["token_ids"])
    detokenized = post(server, "/detokenize", {"tokens": rendered["token_ids"]}).json()
    assert detokenized["prompt"] == text


def test_chat_render_shows_the_tools_as_the_template_does(server):
    body = {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "max_tokens": 8,
    }
    rendered = post(server, "/v1/chat/completions/render", body).json()
    assert "get_weather" in rendered["prompt"]
    plain = post(
        server, "/v1/chat/completions/render", {"messages": body["messages"]}
    ).json()
    assert len(rendered["token_ids"]) > len(plain["token_ids"])
    chat = post(server, "/v1/chat/completions", body).json()
    assert chat["usage"]["prompt_tokens"] == len(rendered["token_ids"])


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": 5}, "temperature"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ("/v1/chat/completions", {"max_tokens": 3}, "messages"),
        ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
        ("/v1/completions", {"prompt": "x", "top_k": -5}, "top_k"),
        ("/v1/completions", {"prompt": 42}, "prompt"),
    ],
)
def test_a_bad_body_is_the_generation_routes_400(server, path, body, param):
    render = post(server, f"{path}/render", body)
    assert render.status_code == 400, render.text
    error = render.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    generation = post(server, path, body)
    assert generation.status_code == 400
    assert generation.json()["error"] == error
