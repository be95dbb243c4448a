"""gpt-oss's Harmony format through every API, on the tiny gpt-oss file with Harmony's control
tokens and gpt-oss's own chat template (`scripts/make-moe-models.sh` writes it with the PyPI
`gguf` package). The weights are random, so what the model writes in Harmony it writes under a
grammar: a forced call, a structured answer, or `auto` with strict tools, which lets it reason
on the `analysis` channel before answering or calling. Checked here, whole and streamed: the
analysis channel comes back as reasoning (`reasoning_content`, a `thinking` block, a Responses
reasoning item), a
call on the commentary channel as `tool_calls` (a `tool_use` block, a `function_call` item), the
final channel as the answer, never with Harmony's markup in it; and output that is not Harmony
reaches the client as content, every token of it. Without the file the tests are skipped,
saying which script makes it (scripts/test.sh runs it, so CI does).

gpt-oss's template prints the date into the system message (`strftime_now`), so what the
random model chooses for a prompt depends on the day: the server pins it
(`--chat-template-date`), and scripts/test.sh runs this file a second time with the clock a
year ahead (faketime) to hold it to that."""

from __future__ import annotations

import datetime
import json

import openai
import pytest
import requests

from harness import ROOT, SluiceServer, served

OSS = ROOT / "models" / "tiny-moe" / "gpt-oss-harmony-mxfp4.gguf"
MODEL = OSS.stem
MARKUP = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>")

pytestmark = pytest.mark.skipif(
    not OSS.is_file(),
    reason=f"skipped: {OSS.relative_to(ROOT)} missing, run scripts/make-moe-models.sh",
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
STRICT_WEATHER = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}


# The day every prompt here renders with: the prompts below were chosen by running them on it.
PINNED_DATE = "2026-11-28"


@pytest.fixture(scope="module")
def oss_server():
    yield from served(
        "--kv-cache-memory", "64MiB", "--max-num-seqs", "8",
        "--chat-template-date", PINNED_DATE, name="harmony", model=OSS,
    )


@pytest.fixture(scope="module")
def client(oss_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=oss_server.base_url, api_key="unused", max_retries=0, timeout=120)


def no_markup(*texts: str | None) -> None:
    for text in texts:
        assert not any(m in (text or "") for m in MARKUP), text


def chat(client, prompt: str, **fields):
    messages = [{"role": "user", "content": prompt}]
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=40, **fields
    )
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=40, stream=True, **fields
    )
    content, reasoning, calls = "", "", {}
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
    return whole.choices[0], (content, reasoning, calls)


def test_a_forced_call_is_a_tool_call(client):
    choice, (content, reasoning, calls) = chat(
        client, "What is the weather in Paris?", tools=[WEATHER], tool_choice="required"
    )
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    assert not choice.message.content
    assert calls == {0: {"name": "get_weather", "arguments": call.function.arguments}}
    assert content == "" and reasoning == ""


def reasoning_of(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def rendered_prompt(server, content: str) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    reply = requests.post(f"{server.base_url}/chat/completions/render", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()["prompt"]


def test_the_pinned_date_is_the_prompts_whatever_the_clock(oss_server):
    """The server's clock (moved by faketime in CI's second run) does not reach the prompt."""
    assert f"Current date: {PINNED_DATE}\n" in rendered_prompt(oss_server, "Hi")
    assert f"chat_template_date={PINNED_DATE}" in oss_server.log_path.read_text()


def test_without_a_pin_the_prompt_has_the_hosts_date():
    srv = SluiceServer("--kv-cache-memory", "16MiB", "--max-num-seqs", "2", name="harmony-today",
                       model=OSS)
    try:
        srv.start()
        before = datetime.date.today().isoformat()
        prompt = rendered_prompt(srv, "Hi")
        after = datetime.date.today().isoformat()
    finally:
        srv.close()
    assert f"Current date: {before}\n" in prompt or f"Current date: {after}\n" in prompt, prompt


def kind_of(choice) -> str:
    """What the model chose under strict `auto`: to call, to reason, or to answer."""
    if choice.finish_reason == "tool_calls":
        return "call"
    return "reasoning" if reasoning_of(choice.message) else "answer"


# Prompts for strict `auto`; on the pinned date the random model reasons on the first, answers
# the second and calls on the third (found by running them).
AUTO_PROMPTS = {"Tell me a story": "reasoning", "What is 2+2?": "answer", "Weather?": "call"}


def test_reasoning_answers_and_calls_come_back_by_channel(client):
    """Under strict `auto` the model picks its channel. Whatever it picks, the whole answer and
    the stream say the same and carry no markup: reasoning is `reasoning_content`, the final
    channel the content, a call `tool_calls`. Across the prompts all three are seen."""
    kinds = {}
    for prompt in AUTO_PROMPTS:
        choice, (content, reasoning, calls) = chat(client, prompt, tools=[STRICT_WEATHER])
        kinds[prompt] = kind_of(choice)
        message = choice.message
        assert content == (message.content or ""), choice
        assert reasoning == (reasoning_of(message) or ""), choice
        no_markup(reasoning_of(message), message.content, content, reasoning)
        if kinds[prompt] == "call":
            [call] = message.tool_calls
            assert call.function.name == "get_weather"
            assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
            assert calls == {0: {"name": "get_weather", "arguments": call.function.arguments}}
        else:
            assert not message.tool_calls and not calls, choice
        if kinds[prompt] == "answer":
            assert message.content, choice
    assert kinds == AUTO_PROMPTS


def test_a_structured_answer_is_the_final_channel(client):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    choice, (content, _, _) = chat(
        client,
        "Pick a number",
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    assert choice.finish_reason == "stop", choice
    assert isinstance(json.loads(choice.message.content)["n"], int)
    assert content == choice.message.content


def test_output_that_is_not_harmony_is_content_every_token(client, oss_server):
    """Without a grammar the random weights write no header: all of it is the answer, exactly
    the text of the same tokens from /v1/completions with the control tokens kept."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice, (content, reasoning, calls) = chat(client, messages[0]["content"])
    rendered = requests.post(
        f"{oss_server.base_url}/chat/completions/render",
        json={"model": MODEL, "messages": messages},
        timeout=30,
    ).json()
    raw = client.completions.create(
        model=MODEL,
        prompt=rendered["token_ids"],
        temperature=0,
        max_tokens=40,
        extra_body={"skip_special_tokens": False},
    )
    assert raw.choices[0].text
    assert choice.message.content == raw.choices[0].text
    assert content == raw.choices[0].text and reasoning == "" and not calls


def test_messages_and_responses_read_harmony_too(oss_server):
    base = oss_server.base_url.removesuffix("/v1")
    tool = {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": WEATHER["function"]["parameters"],
    }
    body = {
        "model": MODEL,
        "max_tokens": 40,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [tool],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    message = requests.post(f"{base}/v1/messages", json=body, timeout=60).json()
    [block] = message["content"]
    assert block["type"] == "tool_use" and block["name"] == "get_weather", message
    assert block["input"]["city"] in ("Paris", "Oslo")
    assert message["stop_reason"] == "tool_use"
    events = requests.post(f"{base}/v1/messages", json={**body, "stream": True}, timeout=60).text
    partial = "".join(
        json.loads(line[6:])["delta"]["partial_json"]
        for line in events.splitlines()
        if line.startswith("data: ") and '"input_json_delta"' in line
    )
    assert json.loads(partial) == block["input"]

    # Strict tools under `auto`: this prompt reasons first (found by running it on the pinned
    # date).
    thinking_body = {
        **body,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "tools": [{**tool, "strict": True}],
        "tool_choice": {"type": "auto"},
    }
    message = requests.post(f"{base}/v1/messages", json=thinking_body, timeout=60).json()
    assert message["content"][0]["type"] == "thinking", message
    thought = message["content"][0]["thinking"]
    assert thought
    no_markup(thought)
    events = requests.post(
        f"{base}/v1/messages", json={**thinking_body, "stream": True}, timeout=60
    ).text
    streamed = "".join(
        json.loads(line[6:])["delta"]["thinking"]
        for line in events.splitlines()
        if line.startswith("data: ") and '"thinking_delta"' in line
    )
    assert streamed == thought

    story = {
        "model": MODEL,
        "input": "Tell me a story",
        "max_output_tokens": 40,
        "temperature": 0,
        "tools": [{"type": "function", "strict": True, **STRICT_WEATHER["function"]}],
    }
    response = requests.post(f"{base}/v1/responses", json=story, timeout=60).json()
    kinds = [item["type"] for item in response["output"]]
    assert kinds[0] == "reasoning", response
    text = "".join(part["text"] for part in response["output"][0]["content"])
    assert text
    no_markup(text)
    # Streamed: the reasoning comes as reasoning-text deltas that add up to the same text.
    events = requests.post(
        f"{base}/v1/responses", json={**story, "stream": True}, timeout=60
    ).text
    streamed = "".join(
        json.loads(line[6:])["delta"]
        for line in events.splitlines()
        if line.startswith("data: ") and '"response.reasoning_text.delta"' in line
    )
    assert streamed == text
