"""A Qwen3.5 hybrid served for real: the tiny random-weight qwen35moe file that
`scripts/make-qwen35-models.sh` writes (six Gated DeltaNet layers with a recurrent state each,
two gated full-attention layers, experts beside a shared expert; SmolLM2's real tokenizer and
chat template). Chat and completion answer, streams carry the same text as whole answers,
eight prompts together give what each gives alone, the cancellation storm of `test_storm.py`
leaves the KV blocks and every recurrent state idle, `/metrics` counts the states, speculation
gives the plain server's tokens (rejected drafts rolled back out of the state), and
what the hybrids cannot do yet (a hybrid draft model) is refused at start with a message saying
why. Without the file the tests
are skipped, saying which script makes it (scripts/test.sh runs it, so CI does)."""

from __future__ import annotations

import json
import subprocess
import time

import openai
import pytest
import requests

from harness import BINARY, ROOT, SluiceServer, run_together, served
from test_storm import storm

HYBRID = ROOT / "models" / "tiny-qwen35" / "qwen35moe-q8_0.gguf"
SMOLLM = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
USED = "sluice_recurrent_states_used"
CAPACITY = "sluice_recurrent_states_capacity"

pytestmark = pytest.mark.skipif(
    not HYBRID.is_file(),
    reason=f"skipped: {HYBRID.relative_to(ROOT)} missing, run scripts/make-qwen35-models.sh",
)


@pytest.fixture(scope="module")
def hybrid_server():
    yield from served("--kv-cache-memory", "64MiB", "--max-num-seqs", "16", name="qwen35",
                      model=HYBRID)


@pytest.fixture(scope="module")
def hybrid_client(hybrid_server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=hybrid_server.base_url, api_key="unused", max_retries=0, timeout=120
    )


def test_models_lists_the_hybrid(hybrid_server):
    card = requests.get(f"{hybrid_server.base_url}/models", timeout=10).json()["data"][0]
    assert card["id"] == HYBRID.stem, card
    assert card["architecture"] == "qwen35moe", card


def test_chat_and_completion_answer_and_stream_the_same_text(hybrid_client):
    chat = hybrid_client.chat.completions.create(
        model=HYBRID.stem,
        messages=[{"role": "user", "content": "Name three rivers."}],
        max_tokens=16,
        temperature=0,
    )
    assert chat.choices[0].message.content, chat
    assert chat.usage.completion_tokens > 0
    prompt = "The state of the recurrence after a long prompt is " * 20
    whole = hybrid_client.completions.create(
        model=HYBRID.stem, prompt=prompt, max_tokens=16, temperature=0
    )
    streamed = "".join(
        c.choices[0].text
        for c in hybrid_client.completions.create(
            model=HYBRID.stem, prompt=prompt, max_tokens=16, temperature=0, stream=True
        )
        if c.choices
    )
    assert whole.choices[0].text and streamed == whole.choices[0].text


def test_eight_prompts_together_equal_each_alone(hybrid_server):
    """Batching is invisible on a hybrid: each sequence's state moves only with its own
    tokens, whatever else the step holds."""
    prompts = [f"Item {i} of the list, after {'many ' * (3 * i)}words, is" for i in range(8)]

    def complete(p: str) -> str:
        body = {"prompt": p, "max_tokens": 12, "temperature": 0}
        r = requests.post(f"{hybrid_server.base_url}/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    alone = [complete(p) for p in prompts]
    together = run_together(complete, prompts)
    assert together == alone, json.dumps({"alone": alone, "together": together})


def test_a_shared_prefix_is_served_from_its_checkpoint_with_the_cold_runs_tokens(hybrid_server):
    """An agent's next turn: the previous prompt again with a new question. Its prefix is
    served from the checkpoint the first turn saved (the metrics count the hit), and its
    tokens are those of the same request on a server that never saw the first turn."""
    first = "Harbour minutes, item four: the north wall needs repair before winter. " * 12
    turn = {"prompt": first + "Question: who pays for the crane?", "max_tokens": 16,
            "temperature": 0}
    url = f"{hybrid_server.base_url}/completions"
    r = requests.post(url, json={"prompt": first, "max_tokens": 4, "temperature": 0},
                      timeout=120)
    assert r.status_code == 200, r.text
    hits = hybrid_server.metric("sluice_prefix_cache_hits_total") or 0.0
    warm = requests.post(url, json=turn, timeout=120).json()
    hit = (hybrid_server.metric("sluice_prefix_cache_hits_total") or 0.0) - hits
    # The first turn's prompt, but for its last partial block, came from the cache.
    first_tokens = r.json()["usage"]["prompt_tokens"]
    assert first_tokens - 16 < hit <= first_tokens, (hit, first_tokens)
    cold_server = SluiceServer("--kv-cache-memory", "64MiB", model=HYBRID, name="qwen35-cold")
    try:
        cold_server.start()
        cold = requests.post(f"{cold_server.base_url}/completions", json=turn,
                             timeout=120).json()
    finally:
        cold_server.close()
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"], (warm, cold)


def test_the_cancellation_storm_leaves_every_state_free(hybrid_server):
    capacity = hybrid_server.metric(CAPACITY)
    assert capacity and capacity > 0, hybrid_server.metrics_text()
    storm(hybrid_server)
    deadline = time.monotonic() + 10
    while (used := hybrid_server.metric(USED)) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert used == 0, f"{USED}={used} after the storm"


def test_speculation_on_a_hybrid_serves_the_plain_servers_tokens(hybrid_server):
    """Speculation on the hybrid, guessed by SmolLM2 (the tiny file carries its tokenizer;
    n-gram lookup finds nothing to guess in random text that never repeats): greedy answers,
    alone and four at once, are the plain server's, though the guesses are rejected and each
    rejection rolls the recurrent state back to its value before the drafts; no state is left
    held. (Guesses kept and then rolled back over: `crates/sluice-engine/tests/
    hybrid_speculation.rs`.)"""
    prompts = [
        "one two three four five six seven one two three four five six seven one two",
        "red green blue red green blue red green blue red green blue red",
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef",
        "The cat sat on the mat. The dog sat on the log. The cat sat on the",
    ]

    def complete(server: SluiceServer, prompt: str) -> str:
        r = requests.post(f"{server.url}/v1/completions", json={
            "model": HYBRID.stem, "prompt": prompt, "max_tokens": 48, "temperature": 0,
        }, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    want = [complete(hybrid_server, p) for p in prompts]
    speculative = SluiceServer("--kv-cache-memory", "64MiB", "--max-num-seqs", "16",
                               "--speculative", f"draft:{SMOLLM}", name="qwen35-spec",
                               model=HYBRID)
    try:
        speculative.start()
        alone = [complete(speculative, p) for p in prompts]
        together = run_together(lambda p: complete(speculative, p), prompts)
        drafted = speculative.metric("sluice_spec_decode_draft_tokens_total")
        accepted = speculative.metric("sluice_spec_decode_accepted_tokens_total") or 0
        used = speculative.metric(USED)
    finally:
        speculative.close()
    assert alone == want
    assert together == want
    assert drafted and drafted > accepted, (drafted, accepted)
    assert used == 0, f"{USED}={used}"


def test_a_hybrid_draft_model_is_refused_at_start():
    """A draft model keeps no recurrent state of its own: a hybrid as the draft model is
    refused, naming its layers, rather than served wrong."""
    r = subprocess.run(
        [str(BINARY), "serve", "--model", str(HYBRID), "--port", "0",
         "--speculative", f"draft:{HYBRID}"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode != 0
    assert "a draft model with recurrent (Gated DeltaNet) layers" in r.stderr, r.stderr


def test_generate_runs_the_hybrid(hybrid_server):
    """`sluice generate` sizes its small cache with a state for the recurrent layers: its
    greedy text is the server's."""
    prompt = "red green blue red green blue"
    r = subprocess.run(
        [str(BINARY), "generate", "--model", str(HYBRID), "--prompt", prompt, "--max-tokens", "16"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    served_text = requests.post(f"{hybrid_server.url}/v1/completions", json={
        "model": HYBRID.stem, "prompt": prompt, "max_tokens": 16, "temperature": 0,
    }, timeout=120).json()["choices"][0]["text"]
    assert r.stdout.strip() == served_text.strip(), (r.stdout, served_text)
