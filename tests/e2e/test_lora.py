"""LoRA adapters served by a real `sluice serve` on the default model (SmolLM2-135M): the random
rank-16 adapter of tests/fixtures/lora/ in llama.cpp's GGUF layout (`fr`) and in PEFT's
(`fr-peft`, the same numbers), and a second one of other numbers (`b`), with two adapter slots.

- `/v1/models` lists each under the base; the GGUF and PEFT copies give the same greedy text,
  and each adapter other text than the base;
- 16 streaming clients spread over the base and the three adapters each get exactly the text
  their request gets alone (batching, slots and the prefix cache change nothing);
- an adapter unloaded while its requests stream: they finish with it, new ones get a 404, and
  the same file loaded under another name gives the same text;
- a cancellation storm over the adapters leaves nothing running or held;
- bad adapters are refused naming the problem (a rank that contradicts the tensors, a missing
  file, a rank above --max-lora-rank at start), and the server goes on serving;
- KV-cache events name the adapter of each stored block (`lora_name`), in vLLM's map format
  and in the array format, read from a real libzmq socket: the same prompt under the base and
  under an adapter makes two sets of blocks, and the subscriber's copy equals the cache.

The adapters come from scripts/make-lora-adapters.sh (scripts/test.sh runs it)."""

from __future__ import annotations

import json
import random
import shutil
import socket
import threading
import time

import pytest
import requests

from harness import MISSING_INPUT, MODEL, ROOT, SluiceServer, metric_value, run_together, served

LORA = ROOT / "models" / "lora"
ADAPTERS = {
    "fr": LORA / "smollm2-r16.gguf",
    "fr-peft": LORA / "smollm2-r16-peft",
    "b": LORA / "smollm2-r16-b.gguf",
}
BASE = MODEL.stem
NAMES = [BASE, "fr", "fr-peft", "b"]

pytestmark = pytest.mark.skipif(
    not all(p.exists() for p in ADAPTERS.values()),
    reason=f"{MISSING_INPUT} the LoRA adapters: run scripts/make-lora-adapters.sh",
)


@pytest.fixture(scope="module")
def lora_server():
    modules = ",".join(f"{name}={path}" for name, path in ADAPTERS.items())
    yield from served(
        "--lora-modules", modules, "--max-loras", "2", "--allow-runtime-lora-updating",
        "--kv-cache-memory", "256MiB",
        name="lora",
    )


def complete(server, model: str, prompt: str, max_tokens: int = 16) -> str:
    r = requests.post(
        f"{server.url}/v1/completions",
        json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
              "ignore_eos": True},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def stream_chat(server, model: str, prompt: str, max_tokens: int = 16, started=None) -> str:
    """The greedy text of a streamed chat completion; sets `started` (a threading.Event) at its
    first chunk."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    text = []
    with requests.post(f"{server.url}/v1/chat/completions", json=body, stream=True,
                       timeout=120) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert chunk["model"] == model
            if started is not None:
                started.set()
            for choice in chunk["choices"]:
                text.append(choice["delta"].get("content") or "")
    return "".join(text)


def load(server, name: str, path) -> requests.Response:
    return requests.post(f"{server.url}/v1/load_lora_adapter",
                         json={"lora_name": name, "lora_path": str(path)}, timeout=60)


def test_models_lists_the_adapters_and_the_layouts_agree(lora_server):
    models = requests.get(f"{lora_server.url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == [BASE, "b", "fr", "fr-peft"]
    assert all(m["parent"] == BASE for m in models[1:])
    prompt = "The capital of France is"
    texts = {name: complete(lora_server, name, prompt) for name in NAMES}
    assert texts["fr"] == texts["fr-peft"], texts
    assert texts["fr"] != texts[BASE] and texts["b"] != texts[BASE] and texts["b"] != texts["fr"]


def test_sixteen_mixed_streaming_clients_each_get_their_text_alone(lora_server):
    jobs = [(NAMES[i % 4], f"Write one sentence about the number {i}.") for i in range(16)]
    alone = [stream_chat(lora_server, m, p) for m, p in jobs]
    together = run_together(lambda job: stream_chat(lora_server, *job), jobs)
    assert together == alone


def test_unloading_while_streaming_finishes_what_runs(lora_server):
    prompt = "Tell me a story about a lighthouse."
    want = stream_chat(lora_server, "b", prompt, max_tokens=48)
    started = [threading.Event() for _ in range(4)]
    out: dict[int, object] = {}

    def run(i: int):
        try:
            out[i] = stream_chat(lora_server, "b", prompt, max_tokens=48, started=started[i])
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for event in started:
        assert event.wait(60), "a stream never started"
    r = requests.post(f"{lora_server.url}/v1/unload_lora_adapter", json={"lora_name": "b"},
                      timeout=10)
    assert r.status_code == 200, r.text
    for t in threads:
        t.join(120)
    assert [out[i] for i in range(4)] == [want] * 4
    r = requests.post(f"{lora_server.url}/v1/completions",
                      json={"model": "b", "prompt": "hi", "max_tokens": 2}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    # The same file under another name: the same weights, the same text.
    assert load(lora_server, "b2", ADAPTERS["b"]).status_code == 200
    assert stream_chat(lora_server, "b2", prompt, max_tokens=48) == want
    assert load(lora_server, "b", ADAPTERS["b"]).status_code == 200


def test_a_cancellation_storm_over_adapters_leaves_nothing_held(lora_server):
    rng = random.Random(57)
    host, port = lora_server.url.removeprefix("http://").split(":")

    def hang_up(i: int):
        body = json.dumps({"model": NAMES[i % 4], "prompt": f"Count to ten, {i}:",
                           "max_tokens": 64, "stream": True}).encode()
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: " + str(len(body)).encode()
                      + b"\r\n\r\n" + body)
            s.recv(rng.randint(1, 4096))

    jobs = [(NAMES[i % 4], f"Name a colour, {i}.") for i in range(8)]
    alone = [complete(lora_server, m, p) for m, p in jobs]
    together = run_together(
        lambda job: hang_up(job) if isinstance(job, int) else complete(lora_server, *job),
        list(range(24)) + jobs,
    )
    assert together[24:] == alone
    deadline = time.monotonic() + 60
    while True:
        text = lora_server.metrics_text()
        running = metric_value(text, "sluice_requests_running")
        waiting = metric_value(text, "sluice_requests_waiting")
        used = metric_value(text, "sluice_kv_cache_blocks_used")
        if (running, waiting, used) == (0, 0, 0):
            break
        assert time.monotonic() < deadline, (running, waiting, used)
        time.sleep(0.1)
    assert "vllm:lora_requests_info{" in text


def test_bad_adapters_are_refused_and_the_server_goes_on(lora_server, tmp_path):
    wrong_rank = tmp_path / "wrong-rank"
    shutil.copytree(ADAPTERS["fr-peft"], wrong_rank)
    config = json.loads((wrong_rank / "adapter_config.json").read_text())
    config["r"] = 8
    (wrong_rank / "adapter_config.json").write_text(json.dumps(config))
    for path, words in [(wrong_rank, "rank"), (tmp_path / "nothing.gguf", "nothing.gguf")]:
        r = load(lora_server, "bad", path)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "lora_path" and words in error["message"], error
    assert complete(lora_server, "fr", "Hello") == complete(lora_server, "fr-peft", "Hello")
    # A rank above --max-lora-rank stops the start, naming the adapter and its rank.
    srv = SluiceServer("--lora-modules", f"fr={ADAPTERS['fr']}", "--max-lora-rank", "8",
                       name="low-rank")
    with pytest.raises(Exception):
        srv.start(timeout=60)
    log = srv.log_tail(500)
    srv.close()
    assert "fr=" in log and "rank" in log, log


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", ["map", "array"])
def test_kv_events_name_each_block_s_adapter(form):
    from test_kv_events import TOPIC, Subscriber, events_server_with, snapshot, wait_subscribed

    layout = ("--kv-events-format", "array") if form == "array" else ()
    srv = events_server_with(
        "--lora-modules", f"fr={ADAPTERS['fr']}", "--kv-events-topic", TOPIC, *layout,
        name=f"lora-events-{form}",
    ).start()
    try:
        sub = Subscriber(srv.pub_port, srv.replay_port).start_from(None)
        try:
            wait_subscribed(srv, 1)
            # Several blocks of 16 tokens, the same under both.
            prompt = "The history of the lighthouse keepers of the northern coast " * 6
            for model in ("fr", BASE):
                complete(srv, model, prompt, max_tokens=4)
            snap = snapshot(srv.url)
            sub.wait_for(snap["last_seq"])
            with sub.lock:
                sub.replica.compare(snap)
                assert sub.replica.forms == {form}
                by_name: dict[str | None, set[tuple[int, ...]]] = {}
                for h, (_, tokens) in sub.replica.blocks.items():
                    by_name.setdefault(sub.replica.lora_names[h], set()).add(tokens)
        finally:
            sub.close()
    finally:
        srv.close()
    assert by_name.keys() == {"fr", None}, by_name.keys()
    # The prompt's blocks were stored once under each: keyed by adapter, never shared.
    shared = by_name["fr"] & by_name[None]
    assert len(shared) >= 3, f"{len(shared)} blocks of the same tokens under both"
