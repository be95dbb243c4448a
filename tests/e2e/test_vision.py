"""Images served for real: the tiny random-weight Gemma 3 text model and its `gemma3` projector
(llama.cpp's `--mmproj` file) that `scripts/make-vision-models.sh` writes. The greedy chats of
`tests/fixtures/vision/chat-greedy.jsonl` (llama.cpp's server on the same pair, the same
images) come out token for token; the OpenAI SDK with an `image_url` data URI and the
Anthropic SDK with a base64 image block get the same answer, streamed and not; a resent image
is served from the prefix cache (the metrics count it) and another image never is; eight image
chats together equal each alone; hung-up image streams leave the cache idle; bad images are a
400 naming the field. Without the files the tests are skipped, saying which script makes them
(scripts/test.sh runs it, so CI does)."""

from __future__ import annotations

import base64
import json
import threading

import anthropic
import openai
import pytest
import requests

from harness import ROOT, run_together, served
from test_storm import RUNNING, USED, wait_idle

PAIR = ROOT / "models" / "tiny-gemma3-vision"
TEXT = PAIR / "text-f32.gguf"
MMPROJ = PAIR / "mmproj-f32.gguf"
FIXTURES = ROOT / "tests" / "fixtures" / "vision"
HITS = "sluice_prefix_cache_hits_total"
# A step whose top two logprobs in llama.cpp's run are closer than this may go either way: the
# towers differ by llama.cpp's f16 GELU table (tests/fixtures/vision/README.md).
NEAR_TIE = 0.05

pytestmark = pytest.mark.skipif(
    not (TEXT.is_file() and MMPROJ.is_file()),
    reason=f"skipped: {PAIR.relative_to(ROOT)} missing, run scripts/make-vision-models.sh",
)


@pytest.fixture(scope="module")
def vision_server():
    yield from served("--mmproj", str(MMPROJ), "--kv-cache-memory", "64MiB",
                      "--limit-mm-per-prompt", "3", name="vision", model=TEXT)


def data_uri(name: str) -> str:
    return "data:image/png;base64," + base64.b64encode((FIXTURES / name).read_bytes()).decode()


def image_part(name: str) -> dict:
    return {"type": "image_url", "image_url": {"url": data_uri(name)}}


def ask(name: str, question: str = "What is in this picture?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": question}, image_part(name)]}]


def chat(server, messages: list[dict], max_tokens: int = 16, **extra) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = requests.post(f"{server.base_url}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def fixture_rows() -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / "chat-greedy.jsonl").read_text().splitlines()]


def test_models_says_the_model_takes_images(vision_server):
    card = requests.get(f"{vision_server.base_url}/models", timeout=10).json()["data"][0]
    assert card["input_modalities"] == ["text", "image"], card


@pytest.mark.parametrize("row", fixture_rows(), ids=lambda r: r["name"])
def test_greedy_chats_are_llama_cpps(vision_server, row):
    """llama.cpp's server on the same pair and images is the oracle: the same prompt length,
    then its greedy tokens, up to the first step where its own top two were a near tie."""
    messages = []
    for m in row["messages"]:
        parts = [p if p["type"] == "text" else image_part(p["image"]) for p in m["content"]]
        messages.append({"role": m["role"], "content": parts})
    got = chat(vision_server, messages, logprobs=True, top_logprobs=1)
    assert got["usage"]["prompt_tokens"] == row["prompt_tokens"], got["usage"]
    ours = [t["token"] for t in got["choices"][0]["logprobs"]["content"]]
    theirs = [
        requests.post(f"{vision_server.url}/detokenize", json={"tokens": [i]},
                      timeout=10).json()["prompt"]
        for i in row["ids"]
    ]
    for step, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            top = row["steps"][step]["top"]
            margin = top[0][1] - top[1][1]
            assert margin < NEAR_TIE, (
                f"step {step}: {a!r} where llama.cpp took {b!r} with a margin of {margin}")
            break
    else:
        assert len(ours) == len(theirs)


def test_another_image_changes_the_answer(vision_server):
    answers = {chat(vision_server, ask(n))["choices"][0]["message"]["content"]
               for n in ("gradient.png", "checker.png", "stripes.png")}
    assert len(answers) == 3, answers


def test_the_openai_and_anthropic_sdks_send_images(vision_server):
    oai = openai.OpenAI(base_url=vision_server.base_url, api_key="unused", max_retries=0)
    messages = ask("stripes.png", "Describe it.")
    whole = oai.chat.completions.create(model=TEXT.stem, messages=messages, max_tokens=12,
                                        temperature=0)
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in oai.chat.completions.create(model=TEXT.stem, messages=messages,
                                             max_tokens=12, temperature=0, stream=True)
        if c.choices
    )
    text = whole.choices[0].message.content
    assert text and streamed == text
    claude = anthropic.Anthropic(base_url=vision_server.url, api_key="unused", max_retries=0)
    block = {"type": "image", "source": {
        "type": "base64", "media_type": "image/png",
        "data": base64.b64encode((FIXTURES / "stripes.png").read_bytes()).decode()}}
    content = [{"type": "text", "text": "Describe it."}, block]
    # This SDK has no `temperature` argument (test_anthropic.py): greedy through the body.
    greedy = {"extra_body": {"temperature": 0}}
    reply = claude.messages.create(model=TEXT.stem, max_tokens=12,
                                   messages=[{"role": "user", "content": content}], **greedy)
    with claude.messages.stream(model=TEXT.stem, max_tokens=12,
                                messages=[{"role": "user", "content": content}], **greedy) as s:
        streamed = "".join(s.text_stream)
    assert reply.content[0].text == text and streamed == text, (reply, streamed, text)


def test_the_responses_api_takes_an_input_image(vision_server):
    """`/v1/responses` with an `input_image`: the chat completion's answer to the same turn."""
    text = chat(vision_server, ask("gradient.png", "Describe it."), max_tokens=12)[
        "choices"][0]["message"]["content"]
    body = {"model": TEXT.stem, "max_output_tokens": 12, "temperature": 0, "store": False,
            "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "Describe it."},
                {"type": "input_image", "image_url": data_uri("gradient.png")}]}]}
    r = requests.post(f"{vision_server.base_url}/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = [c["text"] for item in r.json()["output"] if item["type"] == "message"
           for c in item["content"] if c["type"] == "output_text"]
    assert out == [text], (out, text)


def test_a_resent_image_is_served_from_the_cache_and_another_never(vision_server):
    """An agent resends its screenshot with the history: the first turn's blocks, image
    included, come from the prefix cache. The same history with another image shares no block
    (the first already holds image tokens)."""
    # A question no other test asks, so that no block of it is cached before.
    first = ask("checker.png", "Which pattern is this, and how many squares?")
    answer = chat(vision_server, first)["choices"][0]["message"]["content"]
    history = first + [{"role": "assistant", "content": answer},
                       {"role": "user", "content": "And the colours?"}]
    hits = vision_server.metric(HITS) or 0.0
    chat(vision_server, history)
    served_again = (vision_server.metric(HITS) or 0.0) - hits
    assert served_again >= 32, served_again
    other = [dict(history[0], content=[history[0]["content"][0], image_part("gradient.png")])]
    hits = vision_server.metric(HITS) or 0.0
    chat(vision_server, other + history[1:])
    assert (vision_server.metric(HITS) or 0.0) - hits == 0


def test_eight_image_chats_together_equal_each_alone(vision_server):
    names = ["gradient.png", "checker.png", "stripes.png"]
    jobs = [ask(names[i % 3], f"Question {i}: what do you see?") for i in range(8)]

    def one(messages: list[dict]) -> str:
        return chat(vision_server, messages, max_tokens=10)["choices"][0]["message"]["content"]

    alone = [one(m) for m in jobs]
    assert run_together(one, jobs) == alone


def test_hung_up_image_streams_leave_the_cache_idle(vision_server):
    """Sixteen streaming image chats at once, every other one dropped after its first chunk:
    the others finish, and the blocks and running count go back to idle."""
    idle_used = wait_idle(vision_server)[0]
    names = ["gradient.png", "checker.png", "stripes.png"]

    def stream(i: int) -> None:
        body = {"messages": ask(names[i % 3], f"Stream {i}"), "max_tokens": 24,
                "temperature": 0, "stream": True}
        with requests.post(f"{vision_server.base_url}/chat/completions", json=body, stream=True,
                           timeout=120) as r:
            assert r.status_code == 200, r.text
            for n, _ in enumerate(r.iter_lines()):
                if i % 2 and n >= 1:
                    return

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    used, running, _ = wait_idle(vision_server)
    assert (used, running) == (idle_used, 0), (used, running, USED, RUNNING)


@pytest.mark.parametrize("content, field, says", [
    ([{"type": "text", "text": "hi"},
      {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}],
     "messages[0].content[1].image_url", "format"),
    ([image_part("checker.png")] * 4, "messages", "3"),
    ([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
     "messages[0].content[0].image_url", "allowed-media-domains"),
], ids=["undecodable", "too-many", "url-not-allowed"])
def test_bad_images_are_a_400_naming_the_field(vision_server, content, field, says):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4}
    r = requests.post(f"{vision_server.base_url}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith(field) and says in error["message"], error
    # The server goes on serving.
    assert chat(vision_server, ask("gradient.png"), max_tokens=2)["choices"]
