"""An output budget larger than the context left after the prompt (Qwen Code sends
`max_tokens: 32768` whatever the model; opencode its configured output limit): on every API it
is lowered to what is left, and the answer ends as a budget that ran out ends (`length`,
`max_tokens`, `incomplete`), with the usage of the tokens made. A prompt that alone fills the
context is still a 400, and `--max-tokens-policy strict` refuses the budget as vLLM does. A
64-token context keeps every answer short."""

from __future__ import annotations

import json

import pytest
import requests

from harness import MODEL_NAME, SluiceServer

CONTEXT = 64
HUGE = 2**64 - 1  # the largest budget a request can carry


def start(*args: str, name: str) -> SluiceServer:
    return SluiceServer(
        "--max-model-len", str(CONTEXT), "--kv-cache-memory", "64MiB", *args, name=name
    ).start()


@pytest.fixture(scope="module")
def clamping():
    srv = start(name="clamp")
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="module")
def strict():
    srv = start("--max-tokens-policy", "strict", name="strict")
    try:
        yield srv
    finally:
        srv.close()


def post(srv: SluiceServer, path: str, body: dict) -> requests.Response:
    body = {"model": MODEL_NAME, "temperature": 0, **body}
    return requests.post(f"{srv.url}{path}", json=body, timeout=120)


def ok(r: requests.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


STORY = [{"role": "user", "content": "Tell me a long story about a dragon and a knight."}]


@pytest.mark.parametrize("budget", [CONTEXT, 32768, HUGE])
def test_completions_and_chat_stop_at_the_contexts_end(clamping, budget):
    done = ok(post(clamping, "/v1/completions",
                   {"prompt": "Once upon a time", "max_tokens": budget, "ignore_eos": True}))
    usage = done["usage"]
    assert done["choices"][0]["finish_reason"] == "length", done
    assert usage["prompt_tokens"] + usage["completion_tokens"] == CONTEXT, usage
    chat = ok(post(clamping, "/v1/chat/completions",
                   {"messages": STORY, "max_tokens": budget, "ignore_eos": True}))
    usage = chat["usage"]
    assert chat["choices"][0]["finish_reason"] == "length", chat
    assert usage["prompt_tokens"] + usage["completion_tokens"] == CONTEXT, usage
    # `max_completion_tokens` (the newer name) is clamped alike.
    newer = ok(post(clamping, "/v1/chat/completions",
                    {"messages": STORY, "max_completion_tokens": budget, "ignore_eos": True}))
    assert newer["usage"] == usage and newer["choices"][0]["message"] == chat["choices"][0]["message"]


def test_a_budget_that_fits_is_kept(clamping):
    done = ok(post(clamping, "/v1/completions",
                   {"prompt": "Once upon a time", "max_tokens": 3, "ignore_eos": True}))
    assert done["usage"]["completion_tokens"] == 3, done


def test_a_stream_is_clamped_as_the_whole_answer(clamping):
    body = {"prompt": "Once upon a time", "max_tokens": 32768, "ignore_eos": True}
    whole = ok(post(clamping, "/v1/completions", body))
    events = post(clamping, "/v1/completions", {**body, "stream": True}).text
    chunks = [json.loads(line[6:]) for line in events.splitlines()
              if line.startswith("data: {")]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert text == whole["choices"][0]["text"]
    assert finish[-1] == "length"


def test_messages_and_responses_stop_at_the_contexts_end(clamping):
    message = ok(post(clamping, "/v1/messages", {"max_tokens": 32768, "messages": STORY}))
    assert message["stop_reason"] == "max_tokens", message
    usage = message["usage"]
    assert usage["input_tokens"] + usage["output_tokens"] == CONTEXT, usage
    response = ok(post(clamping, "/v1/responses",
                       {"input": STORY[0]["content"], "max_output_tokens": 32768}))
    assert response["status"] == "incomplete", response
    assert response["incomplete_details"]["reason"] == "max_output_tokens"
    usage = response["usage"]
    assert usage["input_tokens"] + usage["output_tokens"] == CONTEXT, usage


def test_the_render_route_shows_the_clamped_budget(clamping):
    [rendered] = ok(post(clamping, "/v1/completions/render",
                         {"prompt": "Once upon a time", "max_tokens": 32768}))
    assert rendered["sampling_params"]["max_tokens"] == CONTEXT - len(rendered["token_ids"])


def test_a_prompt_that_fills_the_context_is_still_refused(clamping):
    long_prompt = "word " * (2 * CONTEXT)
    r = post(clamping, "/v1/completions", {"prompt": long_prompt, "max_tokens": 8})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt", error
    r = post(clamping, "/v1/messages",
             {"max_tokens": 8, "messages": [{"role": "user", "content": long_prompt}]})
    assert r.status_code == 400 and "prompt is too long" in r.json()["error"]["message"], r.text


def test_strict_refuses_the_budget_as_vllm_does(strict):
    r = post(strict, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 32768})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded", error
    assert f"maximum context length is {CONTEXT} tokens" in error["message"], error
    r = post(strict, "/v1/messages", {"max_tokens": 32768, "messages": STORY})
    assert r.status_code == 400, r.text
    assert "exceed context limit" in r.json()["error"]["message"], r.text
    # A budget that fits is served.
    ok(post(strict, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2}))
