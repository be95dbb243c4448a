"""The optional second model, Qwen2.5-Coder-0.5B-Instruct (qwen2, Q4_K_M GGUF), served for real:
chat through its own ChatML template, and code completion. `scripts/fetch-qwen.sh` fetches it
(scripts/test.sh runs it, so CI does); without the file these tests are skipped, saying why."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from harness import ROOT, SluiceServer, run_together, served

QWEN = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

pytestmark = pytest.mark.skipif(
    not QWEN.is_file(),
    reason=f"skipped: models/{QWEN.name} missing, run scripts/fetch-qwen.sh",
)


@pytest.fixture(scope="module")
def qwen():
    yield from served("--kv-cache-memory", "256MiB", name="qwen", model=QWEN)


@pytest.fixture(scope="module")
def qwen_client(qwen) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen.base_url, api_key="unused", max_retries=0, timeout=120)


def test_served_under_the_file_stem(qwen_client):
    ids = [m.id for m in qwen_client.models.list().data]
    assert ids == [QWEN.stem], ids


def test_chat_answers_with_the_chatml_template(qwen_client):
    r = qwen_client.chat.completions.create(
        model=QWEN.stem,
        messages=[{"role": "user", "content": "What is 2+3? Answer with just the number."}],
        max_tokens=32,
        temperature=0,
    )
    choice = r.choices[0]
    # The turn ends with <|im_end|>, which is a stop id: finish_reason "stop", nothing special
    # left in the text.
    assert choice.finish_reason == "stop", choice
    content = choice.message.content
    assert content and "5" in content, content
    assert "<|im_end|>" not in content and "<|im_start|>" not in content, content
    assert r.usage.prompt_tokens > 20  # the template's default system prompt is included


def test_code_completion(qwen_client):
    r = qwen_client.completions.create(
        model=QWEN.stem, prompt="def fibonacci(n):", max_tokens=48, temperature=0
    )
    text = r.choices[0].text
    assert "return" in text, text


WRITE = {
    "type": "function",
    "function": {
        "name": "write",
        "description": "Write a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}
# Qwen2.5-Coder-0.5B answers this with the call's JSON alone, no <tool_call> tags (as it did
# under opencode); the test checks that premise on the raw completion first.
BARE_PROMPT = [{"role": "user", "content": "Write hello to a.txt."}]


def test_a_call_written_without_its_tags_is_a_tool_call(qwen, qwen_client):
    body = {"model": QWEN.stem, "messages": BARE_PROMPT, "tools": [WRITE], "temperature": 0,
            "max_tokens": 80}
    rendered = requests.post(f"{qwen.base_url}/chat/completions/render", json=body, timeout=60)
    raw = qwen_client.completions.create(
        model=QWEN.stem, prompt=rendered.json()["token_ids"], temperature=0, max_tokens=80,
        extra_body={"skip_special_tokens": False},
    ).choices[0].text
    written = json.loads(raw)
    assert written["name"] == "write" and "<tool_call>" not in raw, raw

    answer = qwen_client.chat.completions.create(**body).choices[0]
    assert answer.finish_reason == "tool_calls", answer
    [call] = answer.message.tool_calls
    assert call.function.name == "write" and not answer.message.content
    assert json.loads(call.function.arguments) == written["arguments"]
    streamed = qwen_client.chat.completions.create(**body, stream=True)
    pieces = [c.choices[0].delta for c in streamed if c.choices]
    assert not "".join(d.content or "" for d in pieces)
    arguments = "".join(t.function.arguments or "" for d in pieces for t in d.tool_calls or [])
    assert arguments == call.function.arguments

    # A response format asked for wins: the same JSON is the answer's text.
    schema = {"type": "object", "properties": {"name": {"type": "string"},
              "arguments": {"type": "object"}}, "required": ["name", "arguments"]}
    formatted = qwen_client.chat.completions.create(
        **body, response_format={"type": "json_schema",
                                 "json_schema": {"name": "call", "schema": schema}},
    ).choices[0]
    assert not formatted.message.tool_calls and json.loads(formatted.message.content), formatted
    # Without tools the JSON it writes is text.
    plain = {k: v for k, v in body.items() if k != "tools"}
    untooled = qwen_client.chat.completions.create(**plain).choices[0]
    assert not untooled.message.tool_calls, untooled


def test_concurrent_streams_match_each_alone(qwen_client):
    """Qwen's K-quants compute in int8 under `auto`: still one arithmetic at every step size,
    so 8 greedy streams at once give exactly the text each gives alone."""
    prompts = [
        "def quicksort(xs):",
        "The capital of France is",
        "SELECT name, COUNT(*) FROM",
        "// Rust: read a file into a string\nfn read(path: &str)",
        "import numpy as np\n\ndef softmax(x):",
        "Once upon a time",
        "#include <stdio.h>\nint main(void) {",
        "A haiku about the sea:",
    ]
    model = QWEN.stem

    def one(p: str) -> str:
        r = qwen_client.completions.create(model=model, prompt=p, max_tokens=24, temperature=0)
        return r.choices[0].text

    alone = [one(p) for p in prompts]
    together = run_together(one, prompts)
    mismatches = [
        f"{prompts[i]!r}: alone {alone[i]!r}, together {together[i]!r}"
        for i in range(len(prompts))
        if together[i] != alone[i]
    ]
    assert not mismatches, "\n".join(mismatches)


def test_speculation_changes_no_token_of_an_edit(qwen):
    """n-gram speculation on Qwen's default weights (K-quants in int8): the greedy answer of an
    editing request, alone and with three others, is the plain server's, character for
    character, and drafts were kept."""
    speculative = SluiceServer(
        "--kv-cache-memory", "256MiB", "--speculative", "ngram", name="qwen-spec", model=QWEN
    )
    source = (ROOT / "benchmarks" / "edit" / "inventory.py").read_text()
    prompts = [
        f"Here is a file:\n```\n{source}\n```\nReturn the whole file, unchanged except for one "
        f"new first line: a comment that says `edited by request {i}`. Write only the file."
        for i in range(4)
    ]

    def answer(server: SluiceServer, prompt: str) -> str:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=300)
        r = client.chat.completions.create(
            model=QWEN.stem,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=160,
            temperature=0,
        )
        return r.choices[0].message.content

    want = [answer(qwen, p) for p in prompts]
    try:
        speculative.start()
        alone = answer(speculative, prompts[0])
        together = run_together(lambda p: answer(speculative, p), prompts)
        kept = speculative.metric("sluice_spec_decode_accepted_tokens_total")
    finally:
        speculative.close()
    assert alone == want[0]
    assert together == want
    assert kept and kept > 0, kept
