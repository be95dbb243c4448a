"""Structured outputs against the real binary (issue 15): `response_format` (`json_object`,
`json_schema`), vLLM's `structured_outputs` and `guided_*` fields on chat and completions, the
official SDK's `chat.completions.parse` with a pydantic model (SmolLM2, and the Qwen models when
present), 50 sampled outputs validated with `jsonschema`, a mixed batch of constrained and
unconstrained requests, and the 400s a bad or conflicting constraint gets."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
import requests
from pydantic import BaseModel, Field

from harness import ROOT, SluiceServer

QWEN_05 = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_15 = ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def chat(server, body: dict, timeout: float = 120) -> requests.Response:
    return requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=timeout)


def completion(server, body: dict, timeout: float = 120) -> requests.Response:
    return requests.post(f"{server.url}/v1/completions", json=body, timeout=timeout)


def ok(r: requests.Response) -> dict:
    assert r.status_code == 200, f"{r.status_code}: {r.text[:500]}"
    return r.json()


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# --- the SDK's parse() with a pydantic model ------------------------------------------------


class City(BaseModel):
    # Bounded strings: a greedy 135M model may otherwise write one string until max_tokens.
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int = Field(ge=0, le=100)
    is_capital: bool


CITY_PROMPT = user(
    "Give the city, its country, its population in millions and whether it is a capital, "
    "for Paris, as JSON."
)


def parse_city(client: openai.OpenAI, model: str) -> City:
    r = client.chat.completions.parse(
        model=model, messages=CITY_PROMPT, response_format=City, max_tokens=64, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, City), choice.message
    # The text is the one-line JSON that was parsed.
    assert City.model_validate_json(choice.message.content) == choice.message.parsed
    assert "\n" not in choice.message.content, choice.message.content
    return choice.message.parsed


def test_sdk_parse_gives_a_pydantic_object(client, model_name):
    parse_city(client, model_name)


def qwen_server(path, name):
    if not path.is_file():
        pytest.skip(f"skipped: models/{path.name} missing, run scripts/fetch-qwen.sh")
    srv = SluiceServer("--kv-cache-memory", "64MiB", name=name, model=path)
    srv.start()
    return srv


@pytest.mark.parametrize("path", [QWEN_05, QWEN_15], ids=["qwen-0.5b", "qwen-1.5b"])
def test_sdk_parse_on_qwen(path):
    # One short request each: the 1.5B model is slow on a CPU.
    srv = qwen_server(path, path.stem)
    try:
        c = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=300)
        city = parse_city(c, path.stem)
        assert city.name == "Paris", city
    except Exception:
        print(srv.log_tail(40))
        raise
    finally:
        srv.close()


# --- 50 sampled outputs against a schema -------------------------------------------------------

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,7}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["red", "green", "blue"]},
            "minItems": 1,
            "maxItems": 3,
        },
        "address": {
            "type": "object",
            "properties": {
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"enum": ["FR", "DE", "JP"]},
            },
            "required": ["zip", "country"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}


def test_50_sampled_outputs_validate_against_a_schema(server, model_name):
    body = {
        "model": model_name,
        "messages": user("Invent a user record as JSON."),
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True},
        },
        "temperature": 1.0,
        "n": 10,
        # The longest valid output is about 60 tokens.
        "max_tokens": 120,
    }
    with ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(lambda s: ok(chat(server, {**body, "seed": s})), range(5)))
    choices = [c for a in answers for c in a["choices"]]
    assert len(choices) == 50
    for c in choices:
        text = c["message"]["content"]
        assert c["finish_reason"] == "stop", f"{c['finish_reason']}: {text!r}"
        jsonschema.validate(json.loads(text), PERSON_SCHEMA)
        # One line, `", "` and `": "` separators.
        assert "\n" not in text and text == json.dumps(json.loads(text)), text
    assert len({c["message"]["content"] for c in choices}) > 1, "temperature 1 sampled one output"


# --- each constraint field, on chat and on completions -------------------------------------

SMALL_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "integer",
                                                                     "minimum": 0,
                                                                     "maximum": 9}},
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}
PHONE = r"[0-9]{3}-[0-9]{4}"


def check_json_object(text: str) -> None:
    assert isinstance(json.loads(text), dict), text


# (name, constraint fields, check of the output text)
CONSTRAINTS = [
    ("json_object", {"response_format": {"type": "json_object"}}, check_json_object),
    (
        "json_schema",
        {"response_format": {"type": "json_schema",
                             "json_schema": {"name": "a", "schema": SMALL_SCHEMA}}},
        lambda t: jsonschema.validate(json.loads(t), SMALL_SCHEMA),
    ),
    (
        "json_schema_no_schema",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
        check_json_object,
    ),
    ("so_json", {"structured_outputs": {"json": SMALL_SCHEMA}},
     lambda t: jsonschema.validate(json.loads(t), SMALL_SCHEMA)),
    ("so_json_string", {"structured_outputs": {"json": json.dumps(SMALL_SCHEMA)}},
     lambda t: jsonschema.validate(json.loads(t), SMALL_SCHEMA)),
    ("so_json_object", {"structured_outputs": {"json_object": True}}, check_json_object),
    ("so_regex", {"structured_outputs": {"regex": PHONE}},
     lambda t: re.fullmatch(PHONE, t) or pytest.fail(t)),
    ("so_choice", {"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}},
     lambda t: t in ("alpha", "beta", "gamma") or pytest.fail(t)),
    ("so_grammar_lark",
     {"structured_outputs": {"grammar": 'start: WORD ("+" WORD)?\nWORD: /[a-z]{2,4}/'}},
     lambda t: re.fullmatch(r"[a-z]{2,4}(\+[a-z]{2,4})?", t) or pytest.fail(t)),
    ("so_grammar_gbnf",
     {"structured_outputs": {"grammar": 'root ::= digit digit "!"\ndigit ::= [0-9]'}},
     lambda t: re.fullmatch(r"[0-9]{2}!", t) or pytest.fail(t)),
    ("guided_json", {"guided_json": SMALL_SCHEMA},
     lambda t: jsonschema.validate(json.loads(t), SMALL_SCHEMA)),
    ("guided_regex", {"guided_regex": PHONE}, lambda t: re.fullmatch(PHONE, t) or pytest.fail(t)),
    ("guided_choice", {"guided_choice": ["red", "green"]},
     lambda t: t in ("red", "green") or pytest.fail(t)),
    ("guided_grammar", {"guided_grammar": 'root ::= ("yes" | "no") "."'},
     lambda t: t in ("yes.", "no.") or pytest.fail(t)),
    ("response_format_text_is_free", {"response_format": {"type": "text"}}, lambda t: None),
]


@pytest.mark.parametrize("fields,check", [c[1:] for c in CONSTRAINTS],
                         ids=[c[0] for c in CONSTRAINTS])
def test_chat_constraint_fields(server, model_name, fields, check):
    a = ok(chat(server, {"model": model_name, "messages": user("Answer: is the sky blue?"),
                         "max_tokens": 40, "temperature": 0, **fields}))
    c = a["choices"][0]
    if fields != {"response_format": {"type": "text"}}:
        assert c["finish_reason"] == "stop", c
    check(c["message"]["content"])


@pytest.mark.parametrize("fields,check", [c[1:] for c in CONSTRAINTS if c[0] != "json_schema_no_schema"],
                         ids=[c[0] for c in CONSTRAINTS if c[0] != "json_schema_no_schema"])
def test_completions_constraint_fields(server, model_name, fields, check):
    a = ok(completion(server, {"model": model_name, "prompt": "Q: Is the sky blue?\nA:",
                               "max_tokens": 40, "temperature": 0, **fields}))
    c = a["choices"][0]
    if "response_format" not in fields or fields["response_format"]["type"] != "text":
        assert c["finish_reason"] == "stop", c
    check(c["text"])


def test_completions_guided_choice_over_the_sdk(client, model_name):
    choices = [" Paris", " Lyon", " Rome"]
    r = client.completions.create(model=model_name, prompt="The capital of France is",
                                  max_tokens=8, temperature=0, n=1,
                                  extra_body={"guided_choice": choices})
    assert r.choices[0].text == " Paris", r.choices[0]
    # Sampled, several choices: each is one of the strings.
    r = client.completions.create(model=model_name, prompt="My favourite city is",
                                  max_tokens=8, temperature=1.0, n=6, seed=1,
                                  extra_body={"guided_choice": choices})
    assert all(c.text in choices and c.finish_reason == "stop" for c in r.choices), r.choices


def test_completions_regex_stream(client, model_name):
    rx = r"[A-Z][a-z]{2,5} [0-9]{1,3}"
    chunks = list(client.completions.create(
        model=model_name, prompt="Name and age:", max_tokens=24, temperature=1.0, seed=5, n=2,
        stream=True, extra_body={"structured_outputs": {"regex": rx}}))
    text, finish = {0: "", 1: ""}, {}
    for ch in chunks:
        for c in ch.choices:
            text[c.index] += c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert finish == {0: "stop", 1: "stop"}, (finish, text)
    assert all(re.fullmatch(rx, t) for t in text.values()), text


def test_chat_json_schema_stream_equals_non_stream(client, model_name):
    args = dict(model=model_name, messages=user("Is water wet?"), max_tokens=40, temperature=0,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "a", "schema": SMALL_SCHEMA}})
    whole = client.chat.completions.create(**args)
    streamed = "".join(ch.choices[0].delta.content or ""
                       for ch in client.chat.completions.create(stream=True, **args)
                       if ch.choices)
    assert streamed == whole.choices[0].message.content
    jsonschema.validate(json.loads(streamed), SMALL_SCHEMA)


# --- a mixed batch ---------------------------------------------------------------------------

FREE = [
    "What is the capital of Japan?",
    "Write a haiku about rain.",
    "Name three fruits.",
    "Why is the sea salty?",
]
CONSTRAINED = [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "p", "schema": PERSON_SCHEMA}}},
     lambda t: jsonschema.validate(json.loads(t), PERSON_SCHEMA)),
    ({"guided_regex": PHONE}, lambda t: re.fullmatch(PHONE, t) or pytest.fail(t)),
    ({"guided_choice": ["left", "right"]}, lambda t: t in ("left", "right") or pytest.fail(t)),
    ({"guided_json": SMALL_SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SMALL_SCHEMA)),
    ({"structured_outputs": {"grammar": 'root ::= [a-c]{1,6} "."'}},
     lambda t: re.fullmatch(r"[a-c]{1,6}\.", t) or pytest.fail(t)),
]


def test_mixed_batch_constrained_and_free(server, model_name):
    """Constrained rows sampled at temperature 1 next to greedy free rows: each constrained
    output validates, and each free row writes exactly what it writes alone."""

    def free(i: int) -> dict:
        return {"model": model_name, "messages": user(FREE[i]), "max_tokens": 24,
                "temperature": 0}

    def constrained(i: int) -> dict:
        return {"model": model_name, "messages": user(f"Request {i}: answer."),
                "max_tokens": 120, "temperature": 1.0, "seed": i, "n": 2,
                **CONSTRAINED[i][0]}

    alone = [ok(chat(server, free(i)))["choices"][0]["message"]["content"]
             for i in range(len(FREE))]
    # Interleaved, released together.
    jobs = []
    for k in range(max(len(FREE), len(CONSTRAINED))):
        jobs += [("free", k)] if k < len(FREE) else []
        jobs += [("c", k)] if k < len(CONSTRAINED) else []
    barrier = threading.Barrier(len(jobs))

    def run(job):
        kind, i = job
        body = free(i) if kind == "free" else constrained(i)
        barrier.wait()
        return job, ok(chat(server, body))

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(run, jobs))
    assert len(results) == len(FREE) + len(CONSTRAINED)
    for (kind, i), answer in results:
        if kind == "free":
            got = answer["choices"][0]["message"]["content"]
            assert got == alone[i], f"{FREE[i]!r}: batched {got!r} != alone {alone[i]!r}"
        else:
            for c in answer["choices"]:
                assert c["finish_reason"] == "stop", (CONSTRAINED[i][0], c)
                CONSTRAINED[i][1](c["message"]["content"])


# --- refusals: 400 naming the field ----------------------------------------------------------

MSG = user("hi")
BAD_REGEX = "([a-z]+"
REFUSED = [
    # two constraints at once: the second one is named
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
    ({"guided_choice": ["a"], "guided_grammar": 'start: "a"'}, "guided_grammar"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
     "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    # invalid constraints
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "a", "schema": {"type": "frobnicate"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": 5}}},
     "response_format"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": BAD_REGEX}, "guided_regex"),
    ({"structured_outputs": {"regex": BAD_REGEX}}, "structured_outputs"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "root ::= undefined-rule"}, "guided_grammar"),
    ({"structured_outputs": {"grammar": "start: ("}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": 'root ::= "unterminated'}}, "structured_outputs"),
    # OpenAI features this server does not serve
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"modalities": ["text", "audio"]}, "modalities"),
]


@pytest.mark.parametrize("fields,param", REFUSED, ids=[p + "-" + str(i)
                                                       for i, (_, p) in enumerate(REFUSED)])
def test_bad_constraints_are_400_naming_the_field(server, model_name, fields, param):
    r = chat(server, {"model": model_name, "messages": MSG, "max_tokens": 4, **fields})
    assert r.status_code == 400, f"{r.status_code}: {r.text[:300]}"
    err = r.json()["error"]
    assert err["message"], err
    assert err["param"] == param or str(err["param"]).startswith(param + "."), err


@pytest.mark.parametrize("fields,param", [f for f in REFUSED if f[1] not in
                                          ("audio", "prediction", "web_search_options",
                                           "functions", "function_call", "modalities")][:6])
def test_bad_constraints_on_completions(server, model_name, fields, param):
    r = completion(server, {"model": model_name, "prompt": "hi", "max_tokens": 4, **fields})
    assert r.status_code == 400, f"{r.status_code}: {r.text[:300]}"
    err = r.json()["error"]
    assert err["param"] == param or str(err["param"]).startswith(param + "."), err


def test_text_modality_and_unknown_fields_are_accepted(server, model_name):
    for extra in ({"modalities": ["text"]}, {"store": False, "metadata": {"a": "b"}},
                  {"some_other_servers_option": {"x": [1]}}, {"audio": None}):
        ok(chat(server, {"model": model_name, "messages": MSG, "max_tokens": 2, **extra}))
