"""The official `openai` Python SDK against the shared server: what a user of vLLM does."""

from __future__ import annotations

import math

import openai
import pytest
import requests

FRANCE = "The capital of France is"
JAPAN = [{"role": "user", "content": "What is the capital of Japan?"}]


# --- completions ---------------------------------------------------------------------------


def test_completion_greedy(client, model_name):
    r = client.completions.create(model=model_name, prompt=FRANCE, max_tokens=4, temperature=0)
    assert r.object == "text_completion"
    assert r.model == model_name
    assert r.id and r.created > 0
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.index == 0
    assert choice.text.startswith(" Paris."), choice.text
    assert choice.finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens > 0
    assert 1 <= r.usage.completion_tokens <= 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_stream_equals_non_stream(client, model_name):
    args = dict(model=model_name, prompt=FRANCE, max_tokens=12, temperature=0)
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(stream=True, **args))
    assert chunks, "the stream had no chunk"
    for c in chunks:
        assert c.object == "text_completion"
        assert c.model == model_name
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == whole.choices[0].text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == whole.choices[0].finish_reason
    assert all(r is None for r in reasons[:-1]), reasons


def tokenize(server, text: str) -> list[int]:
    r = requests.post(f"{server.url}/tokenize", json={"prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_completion_prompt_forms(server, client, model_name):
    """A list of prompts gives one choice per prompt (index = prompt's position); token ids
    work like the text they encode."""
    ids = tokenize(server, FRANCE)
    other = "The capital of Italy is"
    args = dict(model=model_name, max_tokens=3, temperature=0)
    by_text = client.completions.create(prompt=FRANCE, **args).choices[0].text
    assert by_text.startswith(" Paris")
    r = client.completions.create(prompt=[FRANCE, other], **args)
    texts = {c.index: c.text for c in r.choices}
    assert sorted(texts) == [0, 1]
    assert texts[0] == by_text
    assert texts[1] == client.completions.create(prompt=other, **args).choices[0].text
    assert client.completions.create(prompt=ids, **args).choices[0].text == by_text
    r = client.completions.create(prompt=[ids, ids], **args)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.text == by_text for c in r.choices)


def test_completion_n2(client, model_name):
    r = client.completions.create(
        model=model_name, prompt=FRANCE, max_tokens=8, temperature=0.8, n=2, seed=7
    )
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.text and c.finish_reason in ("length", "stop") for c in r.choices)
    assert r.usage.completion_tokens >= 2


def test_completion_n2_stream(client, model_name):
    chunks = list(
        client.completions.create(
            model=model_name, prompt=FRANCE, max_tokens=6, temperature=0.8, n=2, stream=True,
            seed=11,
        )
    )
    text = {0: "", 1: ""}
    finish = {}
    for c in chunks:
        for ch in c.choices:
            text[ch.index] += ch.text
            if ch.finish_reason is not None:
                finish[ch.index] = ch.finish_reason
    assert set(finish) == {0, 1}, f"finish reasons by index: {finish}"
    assert text[0] and text[1]


def test_completion_stop_string(client, model_name):
    r = client.completions.create(
        model=model_name, prompt=FRANCE, max_tokens=16, temperature=0, stop=["."]
    )
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert "." not in c.text
    assert c.text == " Paris"


def test_completion_stop_string_stream(client, model_name):
    chunks = list(
        client.completions.create(
            model=model_name,
            prompt=FRANCE,
            max_tokens=16,
            temperature=0,
            stop=["aris", "zzz"],
            stream=True,
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == " P"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_completion_logprobs(client, model_name):
    r = client.completions.create(
        model=model_name, prompt=FRANCE, max_tokens=4, temperature=0, logprobs=2
    )
    c = r.choices[0]
    lp = c.logprobs
    assert lp is not None
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    assert len(lp.text_offset) == n
    assert "".join(lp.tokens) == c.text
    assert lp.text_offset == sorted(lp.text_offset)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and math.isfinite(logprob)
        # vLLM lists the top `logprobs` entries, plus the sampled token when it is not among them.
        assert 2 <= len(top) <= 3, top
        assert token in top
        # Greedy: the chosen token is the most likely one.
        assert math.isclose(logprob, max(top.values()), abs_tol=1e-4)
        assert math.isclose(top[token], logprob, abs_tol=1e-4)


def test_completion_seed_reproducible(client, model_name):
    args = dict(model=model_name, prompt="Once upon a time", max_tokens=16, temperature=0.8)
    a = client.completions.create(seed=1234, **args).choices[0].text
    b = client.completions.create(seed=1234, **args).choices[0].text
    assert a == b
    assert a


def test_completion_stream_usage(client, model_name):
    chunks = list(
        client.completions.create(
            model=model_name,
            prompt=FRANCE,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.usage is not None, "the last chunk carries no usage"
    assert last.choices == []
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].text for c in chunks[:-1] if c.choices)
    assert last.usage.prompt_tokens > 0
    assert 1 <= last.usage.completion_tokens <= 5
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert text.startswith(" Paris")


def test_completion_vllm_extensions(server, client, model_name):
    # ignore_eos with min_tokens: exactly max_tokens tokens, finish "length".
    r = client.completions.create(
        model=model_name,
        prompt=FRANCE,
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True, "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    assert r.usage.completion_tokens == 24
    assert r.choices[0].finish_reason == "length"
    # stop_token_ids: the id of "." stops the greedy " Paris." right there.
    dot = tokenize(server, ".")[-1]
    r = client.completions.create(
        model=model_name,
        prompt=FRANCE,
        max_tokens=16,
        temperature=0,
        extra_body={"stop_token_ids": [dot]},
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text.startswith(" Paris")
    assert r.usage.completion_tokens <= 3


# --- chat ----------------------------------------------------------------------------------


def test_chat_greedy(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=JAPAN, max_tokens=32, temperature=0
    )
    assert r.object == "chat.completion"
    assert r.model == model_name
    m = r.choices[0].message
    assert m.role == "assistant"
    assert m.content.startswith("The capital of Japan is Tokyo."), m.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_system_and_parts(client, model_name):
    r = client.chat.completions.create(
        model=model_name,
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "text", "text": "What is the capital of Japan?"}]},
        ],
        max_completion_tokens=32,
        temperature=0,
    )
    assert "Tokyo" in r.choices[0].message.content
    assert r.usage.completion_tokens <= 32


def test_chat_stream(client, model_name):
    args = dict(model=model_name, messages=JAPAN, max_tokens=32, temperature=0)
    whole = client.chat.completions.create(**args).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **args))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1, "chunks of one stream share one id"
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] in ("stop", "length")
    assert all(r is None for r in reasons[:-1])


def test_chat_stream_usage(client, model_name):
    chunks = list(
        client.chat.completions.create(
            model=model_name,
            messages=JAPAN,
            max_tokens=32,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None and last.usage.completion_tokens > 0
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_n2(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=JAPAN, max_tokens=12, temperature=0.9, n=2, seed=3
    )
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.message.content for c in r.choices)


def test_chat_stop_string(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=JAPAN, max_tokens=32, temperature=0, stop=["Tokyo"]
    )
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert "Tokyo" not in c.message.content
    assert c.message.content == "The capital of Japan is "


def test_chat_logprobs(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=JAPAN, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    c = r.choices[0]
    assert c.logprobs is not None and c.logprobs.content
    entries = c.logprobs.content
    assert len(entries) == r.usage.completion_tokens
    tokens = "".join(e.token for e in entries)
    if tokens != c.message.content:
        # As in vLLM, the end-of-sequence token that stopped generation has an entry (it counts
        # in usage) though it adds nothing to the content.
        assert c.finish_reason == "stop"
        assert "".join(e.token for e in entries[:-1]) == c.message.content, tokens
    for e in entries:
        assert e.logprob <= 0 and math.isfinite(e.logprob)
        assert e.bytes is None or bytes(e.bytes) == e.token.encode()
        assert len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert math.isclose(e.logprob, tops[0], abs_tol=1e-4)
        assert e.top_logprobs[0].token == e.token


def test_chat_seed_reproducible(client, model_name):
    args = dict(
        model=model_name,
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=16,
        temperature=0.8,
    )
    a = client.chat.completions.create(seed=99, **args).choices[0].message.content
    b = client.chat.completions.create(seed=99, **args).choices[0].message.content
    assert a == b
    assert a


def test_chat_min_tokens(client, model_name):
    plain = client.chat.completions.create(
        model=model_name, messages=JAPAN, max_tokens=64, temperature=0
    )
    assert plain.choices[0].finish_reason == "stop"
    assert plain.usage.completion_tokens < 20
    r = client.chat.completions.create(
        model=model_name,
        messages=JAPAN,
        max_tokens=64,
        temperature=0,
        extra_body={"min_tokens": 20},
    )
    assert r.usage.completion_tokens >= 20


def test_models_list(client, model_name):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [model_name]
    assert models.data[0].object == "model"


# --- errors as the SDK's typed exceptions ---------------------------------------------------


def _bad(fn, **kwargs) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as info:
        fn(**kwargs)
    e = info.value
    assert e.status_code == 400
    assert isinstance(e.body, dict) and e.body.get("message"), e.body
    assert e.param, f"400 without param: {e.body}"
    return e


def test_error_prompt_past_context(client, model_name):
    # A budget past the context is lowered to what is left (test_max_tokens_policy.py); a
    # prompt that alone fills it is OpenAI's context_length_exceeded.
    e = _bad(client.completions.create, model=model_name, prompt="word " * 9000, max_tokens=4)
    assert "maximum context length" in e.body["message"], e.body
    assert e.code == "context_length_exceeded"


def test_error_temperature(client, model_name):
    e = _bad(
        client.completions.create, model=model_name, prompt=FRANCE, max_tokens=4, temperature=5
    )
    assert e.param == "temperature"
    e = _bad(
        client.chat.completions.create,
        model=model_name,
        messages=JAPAN,
        max_tokens=4,
        temperature=5,
    )
    assert e.param == "temperature"


def test_error_empty_prompt(client, model_name):
    _bad(client.completions.create, model=model_name, prompt="", max_tokens=4)


def test_error_bad_values(client, model_name):
    _bad(client.completions.create, model=model_name, prompt=FRANCE, max_tokens=0)
    _bad(client.completions.create, model=model_name, prompt=FRANCE, max_tokens=4, n=0)
    _bad(client.completions.create, model=model_name, prompt=FRANCE, max_tokens=4, top_p=1.5)
    _bad(client.chat.completions.create, model=model_name, messages=[], max_tokens=4)


def test_error_unknown_model(client):
    with pytest.raises((openai.NotFoundError, openai.BadRequestError)) as info:
        client.completions.create(model="no-such-model", prompt=FRANCE, max_tokens=4)
    assert info.value.status_code in (400, 404)
    with pytest.raises((openai.NotFoundError, openai.BadRequestError)):
        client.chat.completions.create(model="no-such-model", messages=JAPAN, max_tokens=4)


def test_server_survives_errors(client, model_name):
    """After all the bad requests above the server still answers correctly."""
    r = client.completions.create(model=model_name, prompt=FRANCE, max_tokens=3, temperature=0)
    assert r.choices[0].text.startswith(" Paris")
