"""`curl -N` streaming: the raw bytes on the wire are well-formed server-sent events."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


def curl_stream(url: str, body: dict) -> tuple[str, str]:
    """(response headers, response body) of a `curl -N` POST."""
    if shutil.which("curl") is None:
        pytest.fail("curl is not installed")
    with tempfile.TemporaryDirectory() as d:
        headers = Path(d) / "headers"
        out = subprocess.run(
            [
                "curl", "-sS", "-N", "--fail-with-body", "--max-time", "120",
                "-D", str(headers),
                "-H", "Content-Type: application/json",
                "-d", json.dumps(body),
                url,
            ],
            capture_output=True,
            timeout=150,
        )
        assert out.returncode == 0, f"curl failed ({out.returncode}): {out.stderr!r} {out.stdout!r}"
        return headers.read_text(), out.stdout.decode("utf-8")


def parse_sse(body: str) -> list[str]:
    """Checks the framing and returns each event's data: every event is a block of lines ended
    by a blank line; each line is `data: ...` or a `:` comment."""
    body = body.replace("\r\n", "\n")  # SSE allows CRLF line ends as well
    assert body.endswith("\n\n"), f"the stream does not end with a blank line: {body[-80:]!r}"
    events = []
    for block in body[:-2].split("\n\n"):
        lines = block.split("\n")
        assert all(lines), f"empty line inside an event: {block!r}"
        data = []
        for line in lines:
            if line.startswith(":"):
                continue  # comment (keep-alive)
            assert line.startswith("data: "), f"not an SSE data line: {line!r}"
            data.append(line[len("data: "):])
        if data:
            events.append("\n".join(data))
    return events


def check_stream(headers: str, body: str, obj: str) -> list[dict]:
    status = headers.splitlines()[0]
    assert " 200" in status, status
    ctype = [h for h in headers.splitlines() if h.lower().startswith("content-type:")]
    assert ctype and "text/event-stream" in ctype[-1].lower(), headers
    events = parse_sse(body)
    assert events[-1] == "[DONE]", f"the last event is {events[-1]!r}"
    assert events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks, "no chunk before [DONE]"
    for c in chunks:
        assert c["object"] == obj, c
    return chunks


def test_curl_chat_stream(server, model_name):
    headers, body = curl_stream(
        f"{server.base_url}/chat/completions",
        {
            "model": model_name,
            "messages": [{"role": "user", "content": "What is the capital of Japan?"}],
            "max_tokens": 32,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    chunks = check_stream(headers, body, "chat.completion.chunk")
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
    )
    assert text.startswith("The capital of Japan is Tokyo."), text
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def test_curl_completion_stream(server, model_name):
    headers, body = curl_stream(
        f"{server.base_url}/completions",
        {
            "model": model_name,
            "prompt": "The capital of France is",
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
        },
    )
    chunks = check_stream(headers, body, "text_completion")
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text.startswith(" Paris."), text
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
