"""Gemma 3 270M (gemma3, SentencePiece vocabulary, Q4_K_M GGUF) served for real: a question
about France answered with Paris under the default weights; with `--weights exact` (and the
local layers in a window pool of their own), completions and chats (Gemma's turns, the system message folded into the first user turn) that give
llama.cpp's greedy text from `tests/fixtures/gemma3-270m-*.jsonl` word for word; streams equal
to whole answers; and the cancellation storm of `test_storm.py`. `scripts/fetch-gemma.sh`
fetches the model (scripts/test.sh runs it, so CI does); without the file these tests are
skipped, saying why."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from harness import ROOT, run_together, served
from test_storm import storm

GEMMA = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
FIXTURES = ROOT / "tests" / "fixtures"

pytestmark = pytest.mark.skipif(
    not GEMMA.is_file(),
    reason=f"skipped: models/{GEMMA.name} missing, run scripts/fetch-gemma.sh",
)


def fixture_rows(name: str) -> list[dict]:
    with open(FIXTURES / name) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def gemma():
    yield from served("--kv-cache-memory", "256MiB", name="gemma", model=GEMMA)


@pytest.fixture(scope="module")
def gemma_exact():
    # Room for 8 sequences' windows: the local layers get a KV pool of their own, which keeps
    # only the blocks their window of 512 reaches (the other server keeps one pool for all).
    yield from served(
        "--kv-cache-memory",
        "128MiB",
        "--max-num-seqs",
        "8",
        "--weights",
        "exact",
        name="gemma-exact",
        model=GEMMA,
    )


def test_the_local_layers_get_a_window_pool_when_the_budget_allows(gemma, gemma_exact):
    assert "their own pool of" in gemma_exact.log_path.read_text()
    log = gemma.log_path.read_text()
    assert "keep every block in the full pool" in log and "--max-num-seqs" in log


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_models_says_gemma3(gemma):
    card = requests.get(f"{gemma.base_url}/models", timeout=10).json()["data"][0]
    assert card["id"] == GEMMA.stem, card
    assert card["architecture"] == "gemma3", card


def test_a_question_about_france_is_answered_with_paris(gemma):
    r = client(gemma).completions.create(
        model=GEMMA.stem,
        prompt="Q: What is the capital of France?\nA:",
        max_tokens=12,
        temperature=0,
    )
    assert "Paris" in r.choices[0].text, r.choices[0].text


def test_exact_completions_equal_llama_cpp_greedy_text(gemma_exact):
    """f32's arithmetic agreed with llama.cpp's f32 run on all 400 fixture tokens (the model
    test `gemma.rs`): served, the texts are the same, leading spaces included. The last row's
    598-token prompt crosses the window of 512, so the window pool gives blocks back."""
    c = client(gemma_exact)
    rows = fixture_rows("gemma3-270m-greedy.jsonl")
    for row in rows[:6] + rows[-1:]:
        r = c.completions.create(
            model=GEMMA.stem,
            prompt=row["prompt"],
            max_tokens=len(row["ids"]),
            temperature=0,
        )
        assert r.usage.prompt_tokens == len(row["prompt_ids"]), row["prompt"]
        assert r.choices[0].text == row["text"], (row["prompt"], r.choices[0].text)


def test_exact_chat_renders_gemma_turns_and_equals_llama_cpp(gemma_exact):
    """The file has no template: sluice renders Gemma's turns, the system message opening the
    first user turn, as llama.cpp's fixtures were rendered (same prompt length, same text)."""
    c = client(gemma_exact)
    for row in fixture_rows("gemma3-270m-chat-greedy.jsonl"):
        r = c.chat.completions.create(
            model=GEMMA.stem,
            messages=row["messages"],
            max_tokens=len(row["ids"]),
            temperature=0,
        )
        assert r.usage.prompt_tokens == len(row["prompt_ids"]), row["messages"]
        assert r.choices[0].message.content == row["text"], (
            row["messages"],
            r.choices[0].message.content,
        )


def test_turns_that_do_not_alternate_are_a_400_naming_messages(gemma):
    r = requests.post(
        f"{gemma.base_url}/chat/completions",
        json={
            "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            "max_tokens": 4,
        },
        timeout=30,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "alternate" in err["message"], err


def test_streams_equal_whole_answers_and_batching_is_invisible(gemma):
    prompts = [
        "def fibonacci(n):",
        "The three primary colors are",
        "1, 2, 3, 4, 5,",
        "Once upon a time",
        "Translate to French: Good morning.\nFrench:",
        "SELECT name FROM",
    ]

    def whole(p: str) -> str:
        body = {"prompt": p, "max_tokens": 16, "temperature": 0}
        r = requests.post(f"{gemma.base_url}/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    alone = [whole(p) for p in prompts]
    assert run_together(whole, prompts) == alone
    c = client(gemma)
    streamed = "".join(
        chunk.choices[0].text
        for chunk in c.completions.create(
            model=GEMMA.stem, prompt=prompts[0], max_tokens=16, temperature=0, stream=True
        )
        if chunk.choices
    )
    assert streamed == alone[0]


def test_cancellation_storm_on_gemma(gemma):
    # test_storm.py's storm on this server: every completed stream equals its prompt alone,
    # and the KV blocks come back.
    storm(gemma)
