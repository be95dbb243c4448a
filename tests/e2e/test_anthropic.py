"""Anthropic's Messages API (`POST /v1/messages`) through the official `anthropic` Python SDK, as
a Claude-style client pointed at a local model would use it: plain and streamed messages, stop
sequences, a tool call and its result, streamed tool input, structured output, errors in
Anthropic's shape, and the `x-api-key` header.

The SDK of this version no longer has `temperature`/`top_k` arguments (Anthropic's newest models
dropped them); the API still takes them, so they go in `extra_body` here."""

from __future__ import annotations

import json

import anthropic
import pytest
import requests

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="not-checked", max_retries=0)


def test_create_answers_with_a_text_block(claude, model_name):
    m = claude.messages.create(
        model=model_name, max_tokens=32, messages=ASK, system="Be brief.", **GREEDY
    )
    assert m.type == "message" and m.role == "assistant" and m.model == model_name
    assert m.id.startswith("msg_")
    assert m.content[0].type == "text" and "Paris" in m.content[0].text, m.content
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 32


def test_max_tokens_and_stop_sequences_set_the_stop_reason(claude, model_name):
    m = claude.messages.create(model=model_name, max_tokens=3, messages=ASK, **GREEDY)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    # A stop sequence the greedy answer is known to hold: a word of its unstopped text (which
    # depends on the weights' arithmetic, so it is read here, not written down).
    whole = claude.messages.create(model=model_name, max_tokens=32, messages=ASK, **GREEDY)
    stop = next(w for w in whole.content[0].text.split()[1:] if len(w) >= 3)
    m = claude.messages.create(
        model=model_name, max_tokens=32, messages=ASK, stop_sequences=[stop], **GREEDY
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop, m
    assert stop not in m.content[0].text


def test_stream_equals_create(claude, model_name):
    args = dict(model=model_name, max_tokens=24, messages=ASK, **GREEDY)
    whole = claude.messages.create(**args)
    with claude.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text
    assert final.content[0].text == text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_raw_stream_has_anthropics_event_sequence(server, model_name):
    r = requests.post(
        f"{server.url}/v1/messages",
        json={"model": model_name, "max_tokens": 8, "messages": ASK, "stream": True},
        stream=True,
        timeout=60,
    )
    assert r.status_code == 200
    names = [line[len("event: "):] for line in r.iter_lines(decode_unicode=True)
             if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"], names
    assert "content_block_delta" in names
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names


def test_tool_use_and_tool_result_round_trip(claude, model_name):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = claude.messages.create(
        model=model_name,
        max_tokens=64,
        messages=ask,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        **GREEDY,
    )
    assert m.stop_reason == "tool_use", m
    calls = [b for b in m.content if b.type == "tool_use"]
    assert len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather" and isinstance(call.input, dict) and call.input["city"]
    answer = claude.messages.create(
        model=model_name,
        max_tokens=32,
        tools=[WEATHER_TOOL],
        **GREEDY,
        messages=ask
        + [
            {"role": "assistant", "content": m.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C."}
                ],
            },
        ],
    )
    assert answer.content and answer.usage.input_tokens > m.usage.input_tokens


def test_streamed_tool_input_is_assembled_by_the_sdk(claude, model_name):
    with claude.messages.stream(
        model=model_name,
        max_tokens=64,
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "any"},
        **GREEDY,
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    call = [b for b in final.content if b.type == "tool_use"][0]
    assert call.name == "get_weather" and isinstance(call.input["city"], str)


def test_output_config_format_gives_json(claude, model_name):
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string", "maxLength": 20}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    m = claude.messages.create(
        model=model_name,
        max_tokens=48,
        messages=ASK,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        **GREEDY,
    )
    assert m.stop_reason == "end_turn", m
    assert isinstance(json.loads(m.content[0].text)["capital"], str)


def test_errors_take_anthropics_shape(claude, server, model_name):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(
            model=model_name, max_tokens=8, messages=ASK, extra_body={"temperature": 1.5}
        )
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "temperature" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="claude-nope", max_tokens=8, messages=ASK)
    assert e.value.body["error"]["type"] == "not_found_error"
    r = requests.post(f"{server.url}/v1/messages", data=b"{not json", timeout=10)
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    r = requests.post(f"{server.url}/v1/messages", json={"model": model_name, "messages": ASK},
                      timeout=10)
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]


def test_x_api_key_is_accepted(start_server, model_name):
    srv = start_server("--api-key", "sk-test")
    good = anthropic.Anthropic(base_url=srv.url, api_key="sk-test", max_retries=0)
    assert good.messages.create(model=model_name, max_tokens=4, messages=ASK).content
    bad = anthropic.Anthropic(base_url=srv.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=model_name, max_tokens=4, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"
