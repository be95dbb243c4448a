"""Speculative decoding on the real binary and the default model, default weights, by n-gram
lookup (`--speculative ngram`) and by a draft model (`--speculative draft:PATH`, the default
model drafting for itself): greedy and seeded sampled chat answers are the plain server's,
character for character, one at a time and four at once; drafts are made and kept (sluice's
counters and vLLM's names move); requests with penalties or a grammar run without drafts and
are counted; the KV caches (the draft model's too) are back to idle afterwards. The
cancellation storm also runs with speculation on (test_storm.py)."""

from __future__ import annotations

import pytest
import requests

from harness import MODEL, MODEL_NAME, SluiceServer, metric_value, run_together

# Prompts whose answers copy text the prompt already holds, where drafts come true, and one
# that does not.
PROMPTS = [
    "Repeat this list exactly, once: apple, banana, cherry, date, fig, grape, kiwi, lemon.",
    "Copy this code exactly:\ndef add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b",
    "Write the days of the week, Monday to Sunday, separated by commas, twice.",
    "Why is the sky blue?",
]


@pytest.fixture(scope="module")
def plain_server():
    plain = SluiceServer(name="plain")
    try:
        plain.start()
        yield plain
    finally:
        plain.close()


@pytest.fixture(scope="module", params=["ngram", "draft"])
def servers(request, plain_server):
    method = "ngram" if request.param == "ngram" else f"draft:{MODEL}"
    speculative = SluiceServer("--speculative", method, name=f"speculative-{request.param}")
    try:
        speculative.start()
        yield plain_server, speculative
    finally:
        speculative.close()


def chat(server: SluiceServer, prompt: str, **fields) -> str:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 64,
        "temperature": 0,
        **fields,
    }
    r = requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_greedy_answers_are_the_plain_servers(servers):
    plain, speculative = servers
    want = [chat(plain, p) for p in PROMPTS]
    alone = [chat(speculative, p) for p in PROMPTS]
    together = run_together(lambda p: chat(speculative, p), PROMPTS)
    for i, w in enumerate(want):
        assert alone[i] == w, f"prompt {i} alone"
        assert together[i] == w, f"prompt {i} with three others"
    text = speculative.metrics_text()
    drafted = metric_value(text, "sluice_spec_decode_draft_tokens_total")
    accepted = metric_value(text, "sluice_spec_decode_accepted_tokens_total")
    assert drafted and accepted and 0 < accepted <= drafted, (drafted, accepted)
    vllm_accepted = [
        line
        for line in text.splitlines()
        if line.startswith("vllm:spec_decode_num_accepted_tokens_total{")
    ]
    assert vllm_accepted and float(vllm_accepted[0].split()[-1]) == accepted
    assert metric_value(text, "sluice_kv_cache_blocks_used") == 0
    assert not metric_value(text, "sluice_draft_kv_cache_blocks_used")
    # The plain server never drafts.
    assert not metric_value(plain.metrics_text(), "sluice_spec_decode_draft_tokens_total")


def test_seeded_sampled_answers_are_the_plain_servers(servers):
    plain, speculative = servers
    fields = {"temperature": 0.8, "top_p": 0.95}
    want = [chat(plain, p, seed=i, **fields) for i, p in enumerate(PROMPTS)]
    got = run_together(
        lambda ip: chat(speculative, ip[1], seed=ip[0], **fields), list(enumerate(PROMPTS))
    )
    assert got == want


def test_penalised_and_grammar_bound_requests_run_without_drafts(servers):
    _, speculative = servers
    name = "sluice_spec_decode_ineligible_requests_total"
    before = metric_value(speculative.metrics_text(), name) or 0
    chat(speculative, PROMPTS[0], temperature=0.8, seed=7)
    chat(speculative, PROMPTS[0], frequency_penalty=0.5)
    chat(speculative, PROMPTS[0], response_format={"type": "json_object"})
    after = metric_value(speculative.metrics_text(), name)
    assert after == before + 2, (before, after)
