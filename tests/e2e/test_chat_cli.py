"""`sluice chat` in a pseudo-terminal (pexpect), as a person types into it: against the shared
server (`--url`), a question is answered with its statistics line, ctrl-c mid-answer returns to
the prompt and the server frees the sequence, the history recalls the last line (arrow up), a
line ending with a backslash continues the input, and `/exit` exits 0; and in-process on the
default model (`--model`), a question answered."""

from __future__ import annotations

import os
import time

import pexpect
import pytest

from harness import BINARY, MISSING_INPUT, MODEL

PROMPT = "\r\n> "
UP = "\x1b[A"


def spawn(args: list[str], home) -> pexpect.spawn:
    if not BINARY.exists():
        pytest.skip(f"{MISSING_INPUT} {BINARY} (cargo build --release -p sluice-server)")
    env = dict(os.environ, HOME=str(home), NO_COLOR="1", TERM="xterm")
    child = pexpect.spawn(
        str(BINARY), ["chat", *args], env=env, encoding="utf-8", timeout=120,
        dimensions=(40, 200),
    )
    child.expect("/help for commands")
    child.expect("> ")
    return child


def exit_zero(child: pexpect.spawn) -> None:
    """`/exit` ends the program with status 0."""
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def running(server) -> float:
    return server.metric("vllm:num_requests_running") or 0.0


def test_a_question_is_answered_then_exit_leaves_with_0(server, tmp_path):
    child = spawn(["--url", server.url, "--max-tokens", "16", "--temperature", "0"], tmp_path)
    child.sendline("What is the capital of France?")
    child.expect(r"\[(\d+) tokens, ")
    assert int(child.match.group(1)) > 0
    child.expect(r"first token \d+ ms, (stop|length)\]")
    child.expect("> ")
    exit_zero(child)
    assert (tmp_path / ".local/state/sluice/chat_history").read_text().strip().endswith(
        "/exit"
    )


def test_ctrl_c_stops_the_answer_not_the_program(server, tmp_path):
    child = spawn(["--url", server.url, "--max-tokens", "2000", "--temperature", "1"], tmp_path)
    # A sampled story may end by itself before the interrupt (then Ctrl-C only clears an empty
    # prompt): such a try is asked again, up to three times.
    for _ in range(3):
        child.sendline("Write a very long story about a lighthouse keeper.")
        # Wait until the answer is streaming: the server runs it.
        deadline = time.monotonic() + 60
        while running(server) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # some of the answer on the screen
        child.sendintr()
        if child.expect([r"stopped\]", r"(stop|length)\]"]) == 0:
            break
        child.expect("> ")
    else:
        raise AssertionError("every answer ended before the interrupt")
    child.expect("> ")
    deadline = time.monotonic() + 30
    while running(server) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(server) == 0, "the stopped answer's sequence still runs"
    # Still alive and answering.
    child.sendline("/help")
    child.expect("/system TEXT")
    exit_zero(child)


def test_history_is_recalled_and_a_backslash_continues_the_line(server, tmp_path):
    child = spawn(["--url", server.url, "--max-tokens", "4"], tmp_path)
    child.sendline("/system Answer in one word.")
    child.expect(r"\(system prompt set\)")
    child.sendline("first line\\")
    child.expect(r"\.\.\. ")
    child.sendline("second line")
    child.expect(r"\d+ tokens, ")
    child.expect("> ")
    # Arrow up brings back the last input (the two lines, joined), sent again as is.
    child.send(UP)
    child.expect("second line")
    child.sendline("")
    child.expect(r"\d+ tokens, ")
    child.expect("> ")
    child.sendline("/model no-such-model")
    child.expect("no model no-such-model; served: ")
    child.sendline("/clear")
    child.expect(r"\(conversation cleared\)")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_in_process_on_a_model(tmp_path):
    if not MODEL.exists():
        pytest.skip(f"{MISSING_INPUT} {MODEL} (scripts/fetch-model.sh)")
    child = spawn(
        ["--model", str(MODEL), "--kv-cache-memory", "64MiB", "--max-tokens", "8"], tmp_path
    )
    child.sendline("Say hello.")
    child.expect(r"\d+ tokens, ")
    child.expect("> ")
    exit_zero(child)
