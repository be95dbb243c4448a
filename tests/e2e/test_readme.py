"""The README's commands work as written: every curl command of its Serve block and its OpenAI
SDK example run against a real server (the address `localhost:8000` pointed at the test's),
and its one-request `sluice generate` line runs. The set-up block is the Dockerfile's (checked
by test_deploy.py); the Deploy block needs a container runtime and a cluster."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from harness import BINARY, MODEL, MODEL_NAME, ROOT

README = (ROOT / "README.md").read_text()


def blocks(section: str, lang: str) -> list[str]:
    """The code blocks of `lang` in the README section whose heading is `section`."""
    body = README.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", body, re.S)


def curl_commands() -> list[str]:
    """Each curl command of the Serve block, its continuation lines joined."""
    commands, current = [], []
    for line in blocks("Serve", "sh")[0].splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("curl") and current:
            commands.append("\n".join(current))
            current = []
        current.append(line)
    if current:
        commands.append("\n".join(current))
    return commands


def test_the_serve_block_has_the_examples():
    commands = curl_commands()
    routes = {re.search(r"localhost:8000(/\S+)", c).group(1) for c in commands}
    assert routes == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/messages",
        "/v1/responses",
    }, routes
    assert len(commands) == 7, commands


@pytest.mark.parametrize("index", range(7))
def test_each_curl_example_answers(server, index):
    command = curl_commands()[index].replace("localhost:8000", f"127.0.0.1:{server.port}")
    # The README writes the default model's name; the test serves that model.
    assert MODEL_NAME == "SmolLM2-135M-Instruct.Q4_1"
    out = subprocess.run(
        ["bash", "-c", command + " -w '\\n%{http_code}'"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    body, status = out.stdout.rsplit("\n", 1)
    assert status == "200", (command, body)
    answer = json.loads(body)
    assert "error" not in answer or answer.get("type") != "error", answer
    if "tool_choice" in command:
        calls = answer["choices"][0]["message"]["tool_calls"]
        assert calls and calls[0]["function"]["name"] == "weather", answer
    if "response_format" in command and answer["choices"][0]["finish_reason"] == "stop":
        assert "city" in json.loads(answer["choices"][0]["message"]["content"]), answer


def test_the_sdk_example_runs(server):
    (code,) = blocks("Serve", "python")
    code = code.replace("http://localhost:8000/v1", server.base_url)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    # It prints the model's answer (which may be short: the protocol is what is checked).
    assert out.returncode == 0, out.stderr


def test_the_generate_line_runs():
    (run,) = blocks("Run", "sh")
    line = next(l for l in run.splitlines() if "sluice generate" in l)
    args = line.split("#", 1)[0].strip().split(None, 2)
    assert args[:2] == ["./target/release/sluice", "generate"], args
    command = f"{BINARY} generate --model {MODEL} {args[2]}"
    out = subprocess.run(
        ["bash", "-c", command + " --max-tokens 8"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip(), out
