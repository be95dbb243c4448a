"""Tool calling against the real binary (issue 15): `tools` with `tool_choice` `required`, a
named function, `none` and `auto`, on SmolLM2 (whose ChatML template has no tools: sluice adds a
Hermes-style tools prompt) and on Qwen2.5-Coder-0.5B (whose template calls with `<tool_call>`);
streamed calls reassembled by the official SDK; a round trip with a tool result; LangChain's
`bind_tools` and `with_structured_output`; and Qwen's chat template rendered by sluice exactly as
Python's jinja2 renders the template read out of the GGUF file."""

from __future__ import annotations

import copy
import json
import struct

import jinja2
import jinja2.sandbox
import jsonschema
import openai
import pytest
import requests
from pydantic import BaseModel, Field

from harness import ROOT, SluiceServer

QWEN = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "pattern": "^[A-Z][a-z]{2,12}/[A-Z][a-z]{2,12}$"}},
    "required": ["timezone"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": WEATHER_PARAMS,
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the local time in a timezone such as Europe/Paris.",
        "parameters": TIME_PARAMS,
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris, in celsius?"}]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def qwen():
    if not QWEN.is_file():
        pytest.skip(f"skipped: models/{QWEN.name} missing, run scripts/fetch-qwen.sh")
    srv = SluiceServer("--kv-cache-memory", "128MiB", name="qwen-tools", model=QWEN)
    try:
        yield srv.start()
    finally:
        srv.close()


class Served:
    def __init__(self, srv: SluiceServer, model: str):
        self.srv, self.model = srv, model
        self.client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0,
                                    timeout=180)

    def chat(self, body: dict) -> requests.Response:
        return requests.post(f"{self.srv.url}/v1/chat/completions",
                             json={"model": self.model, **body}, timeout=180)

    def ok(self, body: dict) -> dict:
        r = self.chat(body)
        assert r.status_code == 200, f"{r.status_code}: {r.text[:500]}"
        return r.json()


@pytest.fixture(scope="module")
def smol(server, model_name) -> Served:
    return Served(server, model_name)


@pytest.fixture(scope="module")
def qwen05(qwen) -> Served:
    return Served(qwen, QWEN.stem)


@pytest.fixture(params=["smollm2", "qwen-0.5b"])
def model(request) -> Served:
    return request.getfixturevalue("smol" if request.param == "smollm2" else "qwen05")


def check_calls(message: dict, names: set[str]) -> list[dict]:
    """The message is only calls, each well formed with arguments valid for its function."""
    calls = message.get("tool_calls") or []
    assert calls, f"no tool call: {message}"
    assert message.get("content") is None, message
    for call in calls:
        assert call["type"] == "function", call
        assert call["id"], call
        assert call["function"]["name"] in names, call
        args = json.loads(call["function"]["arguments"])
        jsonschema.validate(args, SCHEMAS[call["function"]["name"]])
    assert len({c["id"] for c in calls}) == len(calls), calls
    return calls


# --- tool_choice ----------------------------------------------------------------------------


def test_required_forces_valid_calls(model: Served):
    # Greedy: how many calls the model makes is its choice, and a sampled row might go on.
    a = model.ok({"messages": user("Hello! How are you?"), "tools": TOOLS,
                  "tool_choice": "required", "temperature": 0, "max_tokens": 120})
    for c in a["choices"]:
        assert c["finish_reason"] == "tool_calls", c
        check_calls(c["message"], {"get_weather", "get_time"})


def test_required_with_parallel_tool_calls_false_makes_one_call(smol: Served):
    # One call with bounded arguments: sampled rows always finish.
    a = smol.ok({"messages": ASK_WEATHER, "tools": TOOLS, "tool_choice": "required",
                 "parallel_tool_calls": False, "temperature": 1.0, "seed": 2, "n": 3,
                 "max_tokens": 120})
    for c in a["choices"]:
        assert c["finish_reason"] == "tool_calls", c
        assert len(check_calls(c["message"], {"get_weather", "get_time"})) == 1, c


def test_named_function_is_called(model: Served):
    choice = {"type": "function", "function": {"name": "get_time"}}
    a = model.ok({"messages": ASK_WEATHER, "tools": TOOLS, "tool_choice": choice,
                  "temperature": 0, "max_tokens": 60})
    c = a["choices"][0]
    assert c["finish_reason"] == "tool_calls", c
    calls = check_calls(c["message"], {"get_time"})
    assert len(calls) == 1, calls


def test_none_never_calls_and_hides_the_tools(model: Served):
    base = {"messages": ASK_WEATHER, "temperature": 0, "max_tokens": 24}
    a = model.ok({**base, "tools": TOOLS, "tool_choice": "none"})
    c = a["choices"][0]
    assert not c["message"].get("tool_calls"), c
    assert isinstance(c["message"]["content"], str) and c["message"]["content"], c
    assert c["finish_reason"] in ("stop", "length"), c
    assert "<tool_call>" not in c["message"]["content"]
    # The model is not shown the tools: the prompt is the one without tools.
    plain = model.ok(base)
    assert a["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    assert c["message"]["content"] == plain["choices"][0]["message"]["content"]


def test_auto_leaves_plain_answers_as_content(model: Served):
    a = model.ok({"messages": user("Say hello."), "tools": TOOLS, "temperature": 0,
                  "max_tokens": 24})
    msg = a["choices"][0]["message"]
    # Whatever the model chose, call markup never reaches the content.
    assert "<tool_call>" not in (msg.get("content") or ""), msg
    assert "</tool_call>" not in (msg.get("content") or ""), msg
    if msg.get("tool_calls"):
        check_calls(msg, {"get_weather", "get_time"})
        assert a["choices"][0]["finish_reason"] == "tool_calls"


def test_strict_tools_constrain_auto(model: Served):
    """Strict tools promise valid calls also when the model chooses to call: each sampled row
    is a plain answer, or text then calls that validate (the last one possibly cut off by
    max_tokens)."""
    strict = [{"type": "function", "function": {**t["function"], "strict": True}} for t in TOOLS]
    a = model.ok({"messages": ASK_WEATHER, "tools": strict, "tool_choice": "auto",
                  "temperature": 1.0, "seed": 4, "n": 4, "max_tokens": 60})
    for c in a["choices"]:
        msg = c["message"]
        content, calls = msg.get("content") or "", msg.get("tool_calls") or []
        if c["finish_reason"] == "length":
            # Cut at max_tokens: a call broken off before its name is given back as the model's
            # own words at the end of the content, and one broken off in its arguments keeps
            # them as they are (the parser's documented rule); what came before is checked.
            if "<tool_call>" in content:
                content = content[: content.rindex("<tool_call>")]
            elif calls:
                calls = calls[:-1]
        assert "<tool_call>" not in content and "</tool_call>" not in content, c
        if msg.get("tool_calls"):
            assert c["finish_reason"] in ("tool_calls", "length"), c
        else:
            assert c["finish_reason"] in ("stop", "length"), c
        for call in calls:
            name = call["function"]["name"]
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


# `auto` parses what the model writes. Neither model calls by itself here (both Qwen coders
# answer `auto` with a ```json block, SmolLM2 with prose), so a regex makes the model write text
# and then a Hermes call, as a model that calls would.
HERMES_CALL = '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
HERMES_TEXT = "Let me check. " + HERMES_CALL % ("get_weather",
                                               '{"city": "Oslo", "unit": "celsius"}')


def hermes_regex(text: str) -> str:
    return "".join("\\" + ch if ch in r".^$*+?()[]{}|\/" else ch for ch in text).replace(
        "\n", "\\n")


def test_auto_parses_hermes_markup_out_of_the_text(model: Served):
    body = {"messages": ASK_WEATHER, "tools": TOOLS, "tool_choice": "auto",
            "guided_regex": hermes_regex(HERMES_TEXT), "temperature": 0, "max_tokens": 80}
    a = model.ok(body)
    c = a["choices"][0]
    assert c["finish_reason"] == "tool_calls", c
    assert c["message"]["content"].strip() == "Let me check.", c
    (call,) = c["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "unit": "celsius"}

    # Streamed: the text stays content, the call comes as delta.tool_calls, no markup leaks.
    content, calls, finish = "", {}, None
    for chunk in model.client.chat.completions.create(model=model.model, stream=True,
                                                     extra_body={"guided_regex":
                                                                 body["guided_regex"]},
                                                     messages=ASK_WEATHER, tools=TOOLS,
                                                     tool_choice="auto", temperature=0,
                                                     max_tokens=80):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for d in ch.delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.type == "function" and d.function.name, d
                calls[d.index] = {"id": d.id, "name": d.function.name,
                                  "arguments": d.function.arguments or ""}
            else:
                assert d.id is None and not d.function.name, d
                calls[d.index]["arguments"] += d.function.arguments or ""
        finish = ch.finish_reason or finish
    assert "<tool_call" not in content and "</tool_call" not in content, content
    assert content == c["message"]["content"], content
    assert finish == "tool_calls"
    assert list(calls) == [0], calls
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Oslo", "unit": "celsius"}


def test_auto_with_parallel_tool_calls_false_returns_the_first_call(smol: Served):
    two = (HERMES_CALL % ("get_time", '{"timezone": "Europe/Oslo"}') + "\n"
           + HERMES_CALL % ("get_weather", '{"city": "Oslo", "unit": "celsius"}'))
    base = {"messages": ASK_WEATHER, "tools": TOOLS, "guided_regex": hermes_regex(two),
            "temperature": 0, "max_tokens": 100}
    both = smol.ok(base)["choices"][0]
    assert both["finish_reason"] == "tool_calls", both
    names = [c["function"]["name"] for c in check_calls(both["message"], set(SCHEMAS))]
    assert names == ["get_time", "get_weather"], both
    one = smol.ok({**base, "parallel_tool_calls": False})["choices"][0]
    assert [c["function"]["name"] for c in check_calls(one["message"], set(SCHEMAS))] == [
        "get_time"], one


def test_auto_text_that_only_mentions_tool_call_stays_content(smol: Served):
    text = "Use the tool_call tag: <tool_"
    a = smol.ok({"messages": ASK_WEATHER, "tools": TOOLS, "guided_regex": hermes_regex(text),
                 "temperature": 0, "max_tokens": 40})
    c = a["choices"][0]
    assert c["finish_reason"] == "stop" and not c["message"].get("tool_calls"), c
    assert c["message"]["content"] == text, c


# --- streaming through the SDK ----------------------------------------------------------------


def test_streamed_calls_reassembled_by_the_sdk(model: Served):
    args = dict(model=model.model, messages=ASK_WEATHER, tools=TOOLS, tool_choice="required",
                temperature=0, max_tokens=120)
    whole = model.client.chat.completions.create(**args)
    with model.client.chat.completions.stream(**args) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in events, events
    fc, wc = final.choices[0], whole.choices[0]
    assert fc.finish_reason == wc.finish_reason == "tool_calls", (fc, wc)
    assert not fc.message.content, fc.message
    got = [(t.function.name, json.loads(t.function.arguments)) for t in fc.message.tool_calls]
    want = [(t.function.name, json.loads(t.function.arguments)) for t in wc.message.tool_calls]
    assert got == want, (got, want)
    for name, arguments in got:
        jsonschema.validate(arguments, SCHEMAS[name])


# --- a round trip -----------------------------------------------------------------------------


def test_round_trip_with_a_tool_result(model: Served):
    first = model.ok({"messages": ASK_WEATHER, "tools": TOOLS,
                      "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                      "temperature": 0, "max_tokens": 60})
    msg = first["choices"][0]["message"]
    (call,) = check_calls(msg, {"get_weather"})
    history = ASK_WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": msg["tool_calls"]},
        {"role": "tool", "tool_call_id": call["id"],
         "content": json.dumps({"temperature": 21, "sky": "sunny"})},
    ]
    second = model.ok({"messages": history, "tools": TOOLS, "temperature": 0,
                       "max_tokens": 48})
    c = second["choices"][0]
    # The history (the call and its result) reached the prompt.
    assert second["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"]
    assert c["finish_reason"] in ("stop", "length", "tool_calls"), c
    if model.model == QWEN.stem:
        # Greedy Qwen reads the result and answers with it.
        assert c["finish_reason"] == "stop", c
        assert "21" in c["message"]["content"], c


# --- refusals -------------------------------------------------------------------------------

TOOL_REFUSALS = [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ({"tools": [{"type": "retrieval", "function": WEATHER["function"]}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format"),
]


@pytest.mark.parametrize("fields,param", TOOL_REFUSALS,
                         ids=[f"{p}-{i}" for i, (_, p) in enumerate(TOOL_REFUSALS)])
def test_bad_tool_fields_are_400_naming_the_field(smol: Served, fields, param):
    r = smol.chat({"messages": ASK_WEATHER, "max_tokens": 4, **fields})
    assert r.status_code == 400, f"{r.status_code}: {r.text[:300]}"
    err = r.json()["error"]
    assert err["message"] and err["param"] == param, err


def test_tool_choice_none_without_tools_is_fine(smol: Served):
    smol.ok({"messages": ASK_WEATHER, "max_tokens": 2, "tool_choice": "none"})


# --- LangChain --------------------------------------------------------------------------------


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(max_length=20, description="The city")
    unit: str = Field(pattern="^(celsius|fahrenheit)$")


class Capital(BaseModel):
    """A country and its capital."""

    country: str = Field(max_length=24)
    capital: str = Field(max_length=24)


@pytest.fixture(scope="module")
def chat_openai(smol: Served):
    lc = pytest.importorskip("langchain_openai")
    return lc.ChatOpenAI(base_url=smol.srv.base_url, api_key="x", model=smol.model,
                         temperature=0, max_tokens=80, max_retries=0, timeout=120)


@pytest.mark.parametrize("tool_choice", ["GetWeather", "any"])
def test_langchain_bind_tools_forces_a_call(chat_openai, tool_choice):
    bound = chat_openai.bind_tools([GetWeather], tool_choice=tool_choice)
    msg = bound.invoke("What is the weather in Paris?")
    assert len(msg.tool_calls) >= 1, msg
    call = msg.tool_calls[0]
    assert call["name"] == "GetWeather" and call["id"], call
    GetWeather(**call["args"])
    assert not msg.invalid_tool_calls, msg


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output(chat_openai, method):
    structured = chat_openai.with_structured_output(Capital, method=method)
    prompt = "Give the country France and its capital as JSON."
    out = structured.invoke(prompt)
    assert isinstance(out, Capital), out


def test_langchain_with_structured_output_default_method(chat_openai):
    out = chat_openai.with_structured_output(Capital).invoke("France and its capital?")
    assert isinstance(out, Capital), out


# --- the chat template, rendered by sluice and by jinja2 --------------------------------------


def gguf_string(path, wanted: str) -> str | None:
    """A string value of a GGUF file's metadata (the format's reader in a few lines)."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:

        def read(fmt: str):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def skip(kind: int) -> None:
            if kind == 8:  # string
                f.seek(read("Q"), 1)
            elif kind == 9:  # array
                item, count = read("I"), read("Q")
                if item in sizes:
                    f.seek(sizes[item] * count, 1)
                else:
                    for _ in range(count):
                        skip(item)
            else:
                f.seek(sizes[kind], 1)

        assert f.read(4) == b"GGUF"
        read("I"), read("Q")  # version, tensor count
        for _ in range(read("Q")):
            key = f.read(read("Q")).decode()
            kind = read("I")
            if key == wanted and kind == 8:
                return f.read(read("Q")).decode()
            skip(kind)
    return None


def reference_render(template: str, **context) -> str:
    """As transformers' apply_chat_template renders: a sandbox, trim_blocks and lstrip_blocks,
    and a `tojson` that keeps key order and non-ASCII text."""

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(**context)


def sluice_render(srv: SluiceServer, **body) -> str:
    r = requests.post(f"{srv.url}/tokenize", json=body, timeout=60)
    assert r.status_code == 200, f"/tokenize: {r.status_code}: {r.text[:300]}"
    r = requests.post(f"{srv.url}/detokenize", json={"tokens": r.json()["tokens"]}, timeout=60)
    assert r.status_code == 200, f"/detokenize: {r.status_code}: {r.text[:300]}"
    return r.json()["prompt"]


# Keys deliberately out of alphabetical order, non-ASCII text, nested parameters.
RENDER_TOOLS = [
    WEATHER,
    {
        "type": "function",
        "function": {
            "name": "book_trip",
            "description": "Book a trip — with an optional return (Zürich, 東京).",
            "parameters": {
                "type": "object",
                "required": ["to", "legs"],
                "properties": {
                    "to": {"type": "string", "description": "Destination, e.g. Zürich"},
                    "legs": {"type": "array", "items": {"type": "object", "properties": {
                        "day": {"type": "integer"}, "by": {"enum": ["train", "plane"]}}}},
                },
            },
        },
    },
]
RENDER_MESSAGES = [
    {"role": "system", "content": "You plan trips."},
    {"role": "user", "content": "Weather in Zürich and 東京, then book Zürich."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"unit": "celsius",
                                                               "city": "Zürich"}}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "東京",
                                                               "unit": "celsius"}}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 12, "sky": "grau"}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "晴れ, 25°C"},
    {"role": "assistant", "content": "Zürich is 12 °C, 東京 25 °C. Booking now.",
     "tool_calls": [{"id": "call_3", "type": "function", "function": {
         "name": "book_trip", "arguments": {"to": "Zürich", "legs": [{"day": 1, "by": "train"}]}}}]},
    {"role": "tool", "tool_call_id": "call_3", "content": "booked: ref A-7"},
    {"role": "user", "content": "Thanks!"},
]


def test_qwen_template_renders_tools_as_jinja2_does(qwen):
    template = gguf_string(QWEN, "tokenizer.chat_template")
    assert template and "<tool_call>" in template
    for messages, tools in [
        (RENDER_MESSAGES, RENDER_TOOLS),
        (RENDER_MESSAGES[1:], RENDER_TOOLS),  # the template's default system prompt
        (RENDER_MESSAGES[:2], None),  # no tools: the plain branch
    ]:
        want = reference_render(template, messages=messages, tools=tools,
                                add_generation_prompt=True)
        body = {"messages": messages, "add_generation_prompt": True}
        if tools is not None:
            body["tools"] = tools
        got = sluice_render(qwen, **body)
        assert got == want, f"sluice:\n{got}\n--- jinja2:\n{want}"
    # OpenAI clients send arguments as JSON text: the template gets the object (as vLLM does),
    # not a quoted string.
    as_text = copy.deepcopy(RENDER_MESSAGES)
    for m in as_text:
        for call in m.get("tool_calls", []):
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    got = sluice_render(qwen, messages=as_text, tools=RENDER_TOOLS, add_generation_prompt=True)
    want = reference_render(template, messages=RENDER_MESSAGES, tools=RENDER_TOOLS,
                            add_generation_prompt=True)
    assert got == want, f"sluice:\n{got}\n--- jinja2:\n{want}"
