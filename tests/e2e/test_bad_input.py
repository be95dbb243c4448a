"""A corpus of malformed and hostile input against the real binary, over raw sockets: broken and
truncated JSON, wrong types, huge, negative and NaN-like numbers, empty and 1 MB prompts,
invalid UTF-8, 10k stop strings, unknown fields, out-of-vocabulary token ids, n = 0 and 10000,
nested garbage in messages, malformed constraint and tool fields (structured outputs, tools), a
header flood, and slow-loris clients that never finish their headers or body. Hostile
constraints (regexes built to backtrack, recursive, deeply nested and huge schemas, grammars with
no finite derivation) get a 4xx or are bounded: they complete, or a stream ends with an error
event, within a time limit. Each gets a 4xx in OpenAI's error shape or a closed connection (unknown fields
are ignored, as OpenAI does: 200); never a 5xx. Afterwards the server still answers a normal
request and /metrics shows nothing running, nothing waiting, no KV block held and no 5xx."""

from __future__ import annotations

import json
import socket
import time

import pytest

from harness import SluiceServer, parse_metrics

REQUEST_TIMEOUT_S = 2
VOCAB = 49152  # SmolLM2's vocabulary size


@pytest.fixture(scope="module")
def srv():
    server = SluiceServer(
        "--request-timeout-secs",
        str(REQUEST_TIMEOUT_S),
        "--kv-cache-memory",
        "128MiB",
        name="bad-input",
    )
    try:
        yield server.start()
    finally:
        server.close()


class Answer:
    def __init__(self, status: int | None, headers: dict[str, str], body: bytes, elapsed: float):
        self.status, self.headers, self.body, self.elapsed = status, headers, body, elapsed

    def __repr__(self) -> str:
        return f"Answer({self.status}, {self.body[:200]!r}, {self.elapsed:.2f} s)"


def exchange(port: int, chunks: list[bytes], pause: float = 0.0, timeout: float = 30) -> Answer:
    """Sends `chunks` (sleeping `pause` between them) and reads until the server closes the
    connection. `status` is None when it closed without answering."""
    t0 = time.monotonic()
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            for i, chunk in enumerate(chunks):
                if i and pause:
                    time.sleep(pause)
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server gave up on us mid-send: read what it said, if anything
        try:
            while True:
                part = s.recv(65536)
                if not part:
                    break
                data += part
        except ConnectionResetError:
            pass
    elapsed = time.monotonic() - t0
    if not data:
        return Answer(None, {}, b"", elapsed)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    return Answer(status, headers, body, elapsed)


def dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return out


def post(path: str, body: bytes, extra_headers: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra_headers}\r\n"
    ).encode() + body


def j(value) -> bytes:
    return json.dumps(value).encode()


C, CHAT, TOK, DETOK = "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"
VALID = j({"prompt": "Hello there", "max_tokens": 4, "stop": ["x"], "temperature": 0})
MSG = [{"role": "user", "content": "hi"}]
DEEP = b"[" * 100_000 + b"]" * 100_000

# (path, body): each must get a 4xx with OpenAI's error object.
REJECTED = [
    # malformed and truncated JSON
    *[(C, VALID[:cut]) for cut in (0, 1, 10, 25, len(VALID) - 1)],
    (C, b"{'prompt': 'single quotes'}"),
    (C, b'{"prompt": "a",}'),
    (C, b'{"prompt": "a"} {"prompt": "b"}'),
    (CHAT, b'{"messages": [{"role": "user", "content": "hi"}'),
    (C, b"\x00\x01\x02\x03"),
    (C, DEEP),
    (CHAT, b'{"messages": ' + DEEP + b"}"),
    # wrong types
    (C, j({"prompt": 5})),
    (C, j({"prompt": {"text": "hi"}})),
    (C, j({"prompt": "hi", "max_tokens": "10"})),
    (C, j({"prompt": "hi", "n": "2"})),
    (C, j({"prompt": "hi", "stream": "yes"})),
    (C, j({"prompt": "hi", "stop": 5})),
    (C, j({"prompt": "hi", "temperature": []})),
    (C, j({"prompt": "hi", "logit_bias": [1, 2]})),
    (CHAT, j({"messages": "hi"})),
    (CHAT, j({"messages": MSG, "logprobs": 3})),
    (DETOK, j({"tokens": "1 2 3"})),
    (TOK, j({"prompt": ["a", "b"]})),
    # huge numbers
    (C, b'{"prompt": "hi", "max_tokens": 1e30}'),
    (C, b'{"prompt": "hi", "max_tokens": 18446744073709551616}'),
    (C, b'{"prompt": "hi", "n": 1e300}'),
    (C, b'{"prompt": "hi", "seed": 1e400}'),
    (C, b'{"prompt": "hi", "top_k": 99999999999999999999}'),
    (C, b'{"prompt": "hi", "temperature": 1e308}'),
    (C, b'{"prompt": "hi", "logprobs": 4294967296}'),
    # (a budget that fits a usize, however large, is lowered to the context: see
    # test_max_tokens_policy.py)
    # negative and NaN-like values
    (C, j({"prompt": "hi", "max_tokens": -1})),
    (C, j({"prompt": "hi", "temperature": -1})),
    (C, j({"prompt": "hi", "top_p": -0.5})),
    (C, j({"prompt": "hi", "top_k": -5})),
    (C, j({"prompt": "hi", "presence_penalty": -3})),
    (C, j({"prompt": "hi", "n": -1})),
    (C, j({"prompt": "hi", "temperature": "NaN"})),
    (C, b'{"prompt": "hi", "temperature": NaN}'),
    (C, b'{"prompt": "hi", "temperature": Infinity}'),
    (C, b'{"prompt": "hi", "top_p": -Infinity}'),
    (C, j({"prompt": "hi", "logit_bias": {"1": 1000}})),
    # empty and enormous prompts
    (C, j({"prompt": ""})),
    (C, j({"prompt": []})),
    (C, j({"prompt": [[]]})),
    (C, j({"prompt": [""]})),
    (CHAT, j({"messages": []})),
    (TOK, j({})),
    (C, j({"prompt": "word " * 200_000, "max_tokens": 1})),  # 1 MB: past the context
    (CHAT, j({"messages": [{"role": "user", "content": "word " * 200_000}]})),
    (C, j({"prompt": "x" * (5 << 20)})),  # past the 4 MiB body limit: 413
    # invalid UTF-8
    (C, b'{"prompt": "\xff\xfe\xfd"}'),
    (C, b'{"prompt": "ok", "stop": ["\xc3"]}'),
    (CHAT, b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'),
    (C, b'{"prompt": "\\ud800"}'),
    # too many stop strings
    (C, j({"prompt": "hi", "stop": [f"s{i}" for i in range(10_000)]})),
    (CHAT, j({"messages": MSG, "stop": ["x" * 100_000]})),
    # out-of-vocabulary token ids
    (C, j({"prompt": [VOCAB]})),
    (C, j({"prompt": [1, 2, 2**32 - 1]})),
    (C, j({"prompt": [1, 2**32]})),
    (C, j({"prompt": [[1], [VOCAB + 7]]})),
    (C, j({"prompt": "hi", "logit_bias": {str(VOCAB): 5}})),
    (DETOK, j({"tokens": [1, 10**6]})),
    # n
    (C, j({"prompt": "hi", "n": 0})),
    (C, j({"prompt": "hi", "n": 10_000})),
    (CHAT, j({"messages": MSG, "n": 0})),
    (CHAT, j({"messages": MSG, "n": 10_000})),
    # nested garbage in messages
    (CHAT, j({"messages": [[[[{}]]]]})),
    (CHAT, j({"messages": [{"role": {"nested": [1, {"x": None}]}, "content": "hi"}]})),
    (CHAT, j({"messages": [{"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}]})),
    (CHAT, j({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
    (CHAT, j({"messages": [{"role": "user", "content": [[["deep"]]]}]})),
    (CHAT, j({"messages": [{"role": "tool", "content": "hi"}]})),
    (CHAT, j({"messages": [{"content": "no role"}]})),
    (CHAT, j({"messages": [None, 1, "two"]})),
    (TOK, j({"messages": [{"role": 7}]})),
    # structured outputs and tools (issue 15): malformed constraint fields
    (CHAT, j({"messages": MSG, "response_format": {"type": "xml"}})),
    (CHAT, j({"messages": MSG, "response_format": "json"})),
    (CHAT, j({"messages": MSG, "response_format": {"type": "json_schema"}})),
    (CHAT, j({"messages": MSG, "guided_regex": "("})),
    (CHAT, j({"messages": MSG, "guided_regex": 5})),
    (C, j({"prompt": "hi", "guided_choice": []})),
    (C, j({"prompt": "hi", "guided_choice": "yes"})),
    (C, j({"prompt": "hi", "guided_choice": ["x" * 5000]})),
    (C, j({"prompt": "hi", "guided_choice": [str(i) for i in range(2000)]})),
    (C, j({"prompt": "hi", "guided_regex": "a" * 300_000})),
    (C, j({"prompt": "hi", "guided_json": "{\"type\": "})),
    (C, j({"prompt": "hi", "guided_json": [1, 2]})),
    (C, j({"prompt": "hi", "structured_outputs": {"structural_tag": {}}})),
    (C, j({"prompt": "hi", "structured_outputs": "regex"})),
    (CHAT, j({"messages": MSG, "guided_grammar": 'root ::= "a'})),  # malformed GBNF
    (CHAT, j({"messages": MSG, "guided_grammar": "root ::= ( \"a\" "})),
    (CHAT, j({"messages": MSG, "guided_grammar": "root ::= missing"})),
    (CHAT, j({"messages": MSG, "guided_grammar": "root = \"a\" ::= ::="})),
    (CHAT, j({"messages": MSG, "structured_outputs": {"grammar": "start: ((("}})),
    (CHAT, j({"messages": MSG, "guided_json": {"type": "object"}, "guided_regex": "a"})),
    (CHAT, j({"messages": MSG, "tools": "get_weather"})),
    (CHAT, j({"messages": MSG, "tools": [{"type": "function"}]})),
    (CHAT, j({"messages": MSG, "tools": [None]})),
    (CHAT, j({"messages": MSG, "tools": [{"type": "function", "function": {"name": ""}}]})),
    (CHAT, j({"messages": MSG, "tools": [{"type": "function", "function": {"name": "f" * 65}}]})),
    (CHAT, j({"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}] * 129})),
    (CHAT, j({"messages": MSG, "tool_choice": 5})),
    (CHAT, j({"messages": MSG, "tool_choice": {"type": "function"}})),
    (CHAT, j({"messages": MSG, "tool_choice": "required"})),
    (CHAT, j({"messages": MSG, "audio": {"voice": "alloy"}})),
    (CHAT, j({"messages": MSG, "modalities": ["audio"]})),
    (CHAT, j({"messages": MSG, "chat_template_kwargs": [1, 2]})),
    (CHAT, j({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}]})),
    (CHAT, j({"messages": [{"role": "assistant", "tool_calls": "call"}]})),
    (CHAT, j({"messages": [{"role": "user", "content": "hi"},
                           {"role": "tool", "tool_call_id": 7, "content": "x"}]})),
]

# Unknown fields are ignored, as OpenAI's API does.
ACCEPTED = [
    (C, j({"prompt": "Hello", "max_tokens": 2, "frobnicate": {"deep": [1, [2, {"x": None}]]}})),
    (CHAT, j({"messages": [{"role": "user", "content": "hi", "extra": [1]}], "max_tokens": 2,
              "tools_please": True})),
]


def assert_openai_error(answer: Answer, what: str) -> None:
    assert answer.status is not None, f"{what}: connection closed without an answer"
    assert 400 <= answer.status < 500, f"{what}: {answer!r}"
    body = json.loads(answer.body)
    assert body["error"]["message"], f"{what}: {body}"
    assert {"type", "param", "code"} <= set(body["error"]), f"{what}: {body}"


def test_a_corpus_of_bad_bodies_gets_4xx_never_5xx(srv):
    failures = []  # all of them, not just the first
    for path, body in REJECTED:
        what = f"POST {path} {body[:80]!r}"
        try:
            answer = exchange(srv.port, [post(path, body)])
            assert_openai_error(answer, what)
            if len(body) > 4 << 20:
                assert answer.status == 413, what
        except AssertionError as e:
            failures.append(str(e).splitlines()[0])
        except (ValueError, OSError) as e:  # not OpenAI's error JSON; no answer in time
            failures.append(f"{what}: {type(e).__name__}: {e}")
    for path, body in ACCEPTED:
        answer = exchange(srv.port, [post(path, body)])
        if answer.status != 200:
            failures.append(f"POST {path} {body[:80]!r}: {answer!r}")
    assert not failures, "\n".join(failures)


def test_a_header_flood_is_refused_or_closed(srv):
    many = "".join(f"X-Flood-{i}: {'v' * 20}\r\n" for i in range(500))
    huge = f"X-Huge: {'h' * (1 << 20)}\r\n"
    for extra in (many, huge):
        answer = exchange(srv.port, [post(C, VALID, extra)])
        assert answer.status is None or 400 <= answer.status < 500, answer
    # The server shrugs it off.
    assert exchange(srv.port, [post(C, VALID)]).status == 200


def test_slow_loris_clients_are_cut_off(srv):
    limit = REQUEST_TIMEOUT_S + 3
    # Headers that never end: the connection is closed.
    answer = exchange(srv.port, [b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"], timeout=30)
    assert answer.status is None or answer.status == 408, answer
    assert answer.elapsed < limit, answer
    # A body that stops arriving: 408.
    request = post(C, VALID)
    answer = exchange(srv.port, [request[:-10]], timeout=30)
    assert_openai_error(answer, "stalled body")
    assert answer.status == 408 and answer.elapsed < limit, answer
    # A body trickled a byte at a time, never stalling long: 408 at the whole-body deadline.
    head, _, body = request.partition(b"\r\n\r\n")
    chunks = [head + b"\r\n\r\n"] + [body[i : i + 1] for i in range(len(body))]
    answer = exchange(srv.port, chunks, pause=0.25, timeout=60)
    assert_openai_error(answer, "trickled body")
    assert answer.status == 408 and answer.elapsed < limit + 1, answer


def nested_schema(depth: int) -> str:
    """`"guided_json": ` a schema of objects nested `depth` deep, as JSON text (deeper than
    Python's json module can write)."""
    head = '{"type": "object", "required": ["a"], "properties": {"a": ' * depth
    return '"guided_json": ' + head + '{"type": "string"}' + "}}" * depth


# A tree: finite instances exist (a node without its optional child).
TREE = {
    "$ref": "#/$defs/node",
    "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}},
}
# No finite instance: every node requires a child.
RECURSIVE = {
    "$ref": "#/$defs/node",
    "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}},
                       "required": ["child"]}},
}
HOSTILE_GRAMMARS = [
    'start: start "a"',  # no finite derivation
    "start: a\na: b\nb: a",  # a cycle of rules
    'start: "a" start',
    'root ::= root "a"',
    "root ::= x\nx ::= root",
    'root ::= [z-a]',
    'start: "a"{1000000}',
    "start: /(a*)*b/",
    'root ::= ("a"*)* "b"',
]
# Constraints built to be expensive (constraint fields, or such fields as JSON text): each gets a
# 4xx, or completes (or fails with an error event when streamed) within a bounded time, never a
# 5xx.
HOSTILE = [
    {"guided_regex": "(a*)*b"},
    {"guided_regex": "(x+x+)+y"},
    {"guided_regex": "(a|aa)*c"},
    {"guided_regex": "(a{1,100}){1,100}b"},
    {"guided_regex": "[a-z]{1000}{1000}"},
    {"guided_regex": "(.*a){20}"},
    {"structured_outputs": {"regex": "((((((((((a*)*)*)*)*)*)*)*)*)*)*b"}},
    {"guided_json": TREE},
    {"guided_json": RECURSIVE},
    nested_schema(40),
    nested_schema(2000),
    {"guided_json": {"enum": [f"value-{i:06d}" for i in range(10_000)]}},
    {"guided_json": {"type": "string", "pattern": "(a*)*b"}},
    {"guided_json": {"type": "array", "minItems": 100_000, "items": {"type": "integer"}}},
    {"guided_json": {"type": "string", "minLength": 10_000_000}},
    {"guided_json": {"type": "object", "required": ["x"], "properties": {"x": False}}},
    {"guided_json": {"allOf": [{"type": "string"}, {"type": "integer"}]}},
    {"guided_json": {"$ref": "#/$defs/missing"}},
    {"guided_json": {"$ref": "http://example.com/schema.json"}},
    {"guided_choice": ["a" * i for i in range(1, 1001)]},
    *[{"guided_grammar": g} for g in HOSTILE_GRAMMARS],
]
HOSTILE_TIME_LIMIT_S = 60


def sse_events(body: bytes) -> list:
    events = []
    for line in body.decode().splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_hostile_constraints_are_refused_or_bounded(srv):
    """Each hostile constraint, as a plain completion and as a streamed chat: every failure is
    listed at the end."""
    problems, outcomes = [], []
    for fields in HOSTILE:
        for path, base in ((C, {"prompt": "Hello", "max_tokens": 16}),
                           (CHAT, {"messages": MSG, "max_tokens": 16, "stream": True})):
            if isinstance(fields, str):
                what = f"POST {path} {fields[:100]}"
                body = j(base)[:-1] + b", " + fields.encode() + b"}"
            else:
                what = f"POST {path} {json.dumps(fields)[:100]}"
                body = j({**base, **fields})
            answer = exchange(srv.port, [post(path, body)], timeout=120)
            if answer.status is None or answer.status >= 500:
                problems.append(f"{what}: {answer!r}")
                continue
            if answer.elapsed > HOSTILE_TIME_LIMIT_S:
                problems.append(f"{what}: took {answer.elapsed:.1f} s")
            if answer.status != 200:
                assert_openai_error(answer, what)
                messages = [json.loads(answer.body)["error"]["message"]]
                outcomes.append(f"{answer.status}: {what}")
            elif base.get("stream"):
                events = sse_events(answer.body)
                if not events or events[-1] != "[DONE]":
                    problems.append(f"{what}: the stream did not end with [DONE]: {answer!r}")
                errors = [e for e in events if isinstance(e, dict) and "error" in e]
                messages = [e["error"]["message"] for e in errors]
                outcomes.append(f"stream with {len(errors)} error events: {what}")
            else:
                choice = json.loads(answer.body)["choices"][0]
                if choice["finish_reason"] not in ("stop", "length"):
                    problems.append(f"{what}: {choice}")
                outcomes.append(f"200: {what}")
                messages = []
            # A clear error: one short message, not the grammar engine's internal state.
            for m in messages:
                if len(m) > 1000 or "<state>" in m or "<grammar>" in m:
                    problems.append(f"{what}: an unclear error message: {m[:300]!r}")
    print("\n".join(outcomes))
    assert not problems, "\n".join(problems)
    # A normal request still answers at once.
    assert exchange(srv.port, [post(C, VALID)]).status == 200


def test_the_server_is_whole_after_the_corpus(srv):
    # Runs after the tests above (pytest keeps file order).
    answer = exchange(
        srv.port, [post(C, j({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}))]
    )
    assert answer.status == 200, answer
    assert json.loads(answer.body)["choices"][0]["text"].startswith(" Paris")
    deadline = time.monotonic() + 10
    while True:
        samples = parse_metrics(srv.metrics_text())
        # The engine's series carry only its `model` label.
        value = {n: v for n, labels, v in samples if labels.count("=") <= 1}
        idle = (
            value.get("sluice_requests_running") == 0
            and value.get("sluice_requests_waiting") == 0
            and value.get("sluice_kv_cache_blocks_used") == 0
        )
        if idle:
            break
        assert time.monotonic() < deadline, f"not idle after the corpus: {value}"
        time.sleep(0.1)
    server_errors = [
        (labels, v)
        for n, labels, v in samples
        if n == "sluice_http_requests_total"
        and 'status="5' in labels
        and 'route="/health"' not in labels  # 503 while loading, by design
        and v > 0
    ]
    assert not server_errors, server_errors
    client_errors = sum(
        v
        for n, labels, v in samples
        if n == "sluice_http_requests_total" and 'status="4' in labels
    )
    assert client_errors >= len(REJECTED), "the corpus did not reach the router"
