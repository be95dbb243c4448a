"""Real agent clients at their defaults against `sluice serve`: Claude Code (`claude -p`, over
/v1/messages), Codex (`codex exec`, over /v1/responses with a custom provider), opencode
(`opencode run`, a custom `@ai-sdk/openai-compatible` provider over /v1/chat/completions) and
Qwen Code (`qwen`, its OPENAI_* variables, over /v1/chat/completions), and the OpenAI Agents SDK
with a function tool over both OpenAI APIs.

The four CLIs come from npm (tests/e2e/node/package-lock.json; scripts/setup-e2e.sh installs
them, so CI has them; Qwen Code needs Node >= 22, which comes from the registry's `node`
package beside them). Each runs with its telemetry off, and inside a network namespace of its
own (`unshare -rn`) whose only interface is loopback, with the server started inside it: the
CLI can reach the server and nothing else, so a run that completes made no other connection
it needed, and any other it tried failed without leaving the machine.

Each runs on the smallest model whose context holds its default prompt: opencode's (~7.7k
tokens) fits SmolLM2's 8192; Claude Code's, Codex's and Qwen Code's (system prompt and a dozen
tools, 8.7k, 11.6k and 13k tokens) need Qwen2.5-Coder-0.5B (`scripts/fetch-qwen.sh`).
opencode and Qwen Code ask for an output budget past what the context leaves (Qwen Code
32768 whatever the model), which sluice lowers to what is left (a 400 before, on which Qwen
Code exited and opencode compacted and retried without end). On
SmolLM2, Claude Code gets Anthropic's `prompt is too long` (checked below). Text from a small
model may be poor; the assertions are on the protocol: the run completes with an answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from harness import BINARY, MODEL, ROOT

NODE_BIN = ROOT / "tests" / "e2e" / "node" / "node_modules" / ".bin"
CLAUDE = NODE_BIN / "claude"
CODEX = NODE_BIN / "codex"
OPENCODE = NODE_BIN / "opencode"
QWEN_CODE = NODE_BIN / "qwen"
QWEN = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
# gpt-oss's shape with random weights, Harmony's tokens and gpt-oss's chat template
# (scripts/make-moe-models.sh).
OSS = ROOT / "models" / "tiny-moe" / "gpt-oss-harmony-mxfp4.gguf"

# Prefill of a ~12k-token prompt on Qwen2.5-Coder-0.5B takes about 80 s on 2 cores.
CLI_TIMEOUT_S = 900


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    try:
        return (
            subprocess.run(
                ["unshare", "-rn", "ip", "link", "set", "lo", "up"],
                capture_output=True,
                timeout=10,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_namespace = pytest.mark.skipif(
    not _namespaces_work(),
    reason="skipped: `unshare -rn` (a user and network namespace) is not allowed here, and "
    "the CLIs run only where they can reach nothing but the server",
)


def needs(path: Path, how: str):
    return pytest.mark.skipif(not path.exists(), reason=f"skipped: {path.name} missing, {how}")


# Starts the server inside the namespace, waits for it, runs the client with stdin closed,
# then stops the server; the client's exit status is the script's.
ISOLATED = textwrap.dedent(
    """\
    ip link set lo up || exit 97
    "$SLUICE_BIN" serve --model "$SLUICE_MODEL" --host 127.0.0.1 --port 8000 \\
        >"$SLUICE_LOG" 2>&1 &
    server=$!
    for _ in $(seq 1 360); do
        curl -sf http://127.0.0.1:8000/health >/dev/null && break
        sleep 0.5
    done
    "$@" </dev/null
    status=$?
    kill "$server"
    wait "$server"
    exit $status
    """
)


def run_isolated(
    tmp_path: Path, model: Path, env: dict[str, str], *command: str
) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    log = tmp_path / "server.log"
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "SLUICE_BIN": str(BINARY),
        "SLUICE_MODEL": str(model),
        "SLUICE_LOG": str(log),
        **env,
    }
    proc = subprocess.run(
        ["unshare", "-rn", "bash", "-c", ISOLATED, "isolated", *command],
        cwd=work,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    proc.server_log = log.read_text() if log.exists() else ""  # type: ignore[attr-defined]
    return proc


def claude_env(model: Path) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:8000",
        "ANTHROPIC_API_KEY": "sk-unused",
        # sluice answers the name it serves (the file's stem), as vLLM does.
        "ANTHROPIC_MODEL": model.stem,
        "ANTHROPIC_SMALL_FAST_MODEL": model.stem,
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }


def claude_result(proc: subprocess.CompletedProcess) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON result; stdout {proc.stdout[-2000:]} stderr {proc.stderr[-2000:]}"
    return json.loads(lines[-1])


@needs_namespace
@needs(CLAUDE, "run scripts/setup-e2e.sh (npm)")
@needs(QWEN, "run scripts/fetch-qwen.sh")
@pytest.mark.timeout(CLI_TIMEOUT_S + 60)
def test_claude_code_completes_at_its_defaults(tmp_path):
    proc = run_isolated(
        tmp_path,
        QWEN,
        claude_env(QWEN),
        str(CLAUDE),
        "-p",
        "Reply with one word: hello",
        "--output-format",
        "json",
    )
    result = claude_result(proc)
    assert proc.returncode == 0, (result, proc.server_log[-3000:])
    assert result["is_error"] is False, (result, proc.server_log[-3000:])
    assert result["terminal_reason"] == "completed", result
    assert isinstance(result["result"], str) and result["result"].strip(), result
    # Its default request: 12 tools and a system prompt of ~11k tokens, answered over
    # /v1/messages.
    assert result["usage"]["input_tokens"] > 5000, result["usage"]
    assert 'endpoint="messages"' in proc.server_log


@needs_namespace
@needs(CLAUDE, "run scripts/setup-e2e.sh (npm)")
@pytest.mark.timeout(300)
def test_claude_code_hears_anthropics_words_when_the_prompt_does_not_fit(tmp_path):
    """SmolLM2's 8192 tokens cannot hold Claude Code's default prompt: it must hear so in
    Anthropic's words (it shows them, and does not retry forever)."""
    proc = run_isolated(
        tmp_path,
        MODEL,
        claude_env(MODEL),
        str(CLAUDE),
        "-p",
        "Reply with one word: hello",
        "--output-format",
        "json",
    )
    result = claude_result(proc)
    assert result["is_error"] is True, result
    assert result.get("api_error_status") == 400, result
    # Claude Code read the numbers out of Anthropic's wording and says them in its own.
    assert "prompt is too long" in result["result"].lower(), result
    assert "8192" in result["result"], result


def codex_home(tmp_path: Path, model: Path) -> Path:
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text(
        textwrap.dedent(
            f"""\
            model = "{model.stem}"
            model_provider = "sluice"

            [analytics]
            enabled = false

            [model_providers.sluice]
            name = "sluice"
            base_url = "http://127.0.0.1:8000/v1"
            wire_api = "responses"
            """
        )
    )
    return home


def codex_turn(tmp_path: Path, model: Path) -> list[str]:
    """`codex exec` at its defaults on `model`: the turn completes, with no error; returns the
    agent's messages."""
    home = codex_home(tmp_path, model)
    proc = run_isolated(
        tmp_path,
        model,
        {"CODEX_HOME": str(home)},
        str(CODEX),
        "exec",
        "--skip-git-repo-check",
        "--json",
        "Reply with one word: hello",
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], proc.server_log[-3000:])
    kinds = [e["type"] for e in events]
    assert "turn.completed" in kinds, (kinds, proc.stderr[-3000:], proc.server_log[-3000:])
    assert "turn.failed" not in kinds and "error" not in kinds, events
    assert 'endpoint="responses"' in proc.server_log
    return [
        e["item"]["text"]
        for e in events
        if e["type"] == "item.completed" and e["item"].get("type") == "agent_message"
    ]


@needs_namespace
@needs(CODEX, "run scripts/setup-e2e.sh (npm)")
@needs(QWEN, "run scripts/fetch-qwen.sh")
@pytest.mark.timeout(CLI_TIMEOUT_S + 60)
def test_codex_completes_at_its_defaults(tmp_path):
    messages = codex_turn(tmp_path, QWEN)
    assert messages and messages[-1].strip(), messages


@needs_namespace
@needs(CODEX, "run scripts/setup-e2e.sh (npm)")
@needs(OSS, "run scripts/make-moe-models.sh")
@pytest.mark.timeout(CLI_TIMEOUT_S + 60)
def test_codex_completes_a_turn_on_gpt_oss(tmp_path):
    """Codex's own prompt rendered in Harmony, and the reply read back by channel. The weights
    are random, so the model does not write Harmony: what it wrote reaches Codex as the
    answer, unparsed, and the turn completes."""
    messages = codex_turn(tmp_path, OSS)
    assert messages and messages[-1].strip(), messages


TURN = "Write the word hello into the file hello.txt"


@needs_namespace
@needs(OPENCODE, "run scripts/setup-e2e.sh (npm)")
@pytest.mark.timeout(CLI_TIMEOUT_S + 60)
def test_opencode_completes_a_turn_at_its_defaults(tmp_path):
    """`opencode run` with only the provider (endpoint and model) configured, its update
    check, model list fetch, default plugins and LSP downloads off; the turn ends without an
    error event and exit 0."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "provider": {"sluice": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "sluice",
            "options": {"baseURL": "http://127.0.0.1:8000/v1"},
            "models": {MODEL.stem: {}},
        }},
        "model": f"sluice/{MODEL.stem}",
    }))
    env = {
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    }
    proc = run_isolated(tmp_path, MODEL, env, str(OPENCODE), "run", "--format", "json", TURN)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], proc.server_log[-3000:])
    kinds = [e["type"] for e in events]
    assert "step_finish" in kinds and "error" not in kinds, (events, proc.stderr[-3000:])
    assert 'endpoint="chat"' in proc.server_log
    # Its prompt and its output budget pass SmolLM2's context: the answer ran to the end.
    finish = [e["part"] for e in events if e["type"] == "step_finish"][-1]
    assert finish["tokens"]["input"] > 5000, finish


@needs_namespace
@needs(QWEN_CODE, "run scripts/setup-e2e.sh (npm)")
@needs(QWEN, "run scripts/fetch-qwen.sh")
@pytest.mark.timeout(CLI_TIMEOUT_S + 60)
def test_qwen_code_completes_a_turn_at_its_defaults(tmp_path):
    """`qwen` with OPENAI_BASE_URL, OPENAI_API_KEY and OPENAI_MODEL only, its usage statistics
    and update checks off (settings.json); it sends max_tokens 32768 beside a 13k-token
    prompt, which a 32768-token context lowers: the turn completes, no API error, exit 0."""
    home = tmp_path / "home"
    (home / ".qwen").mkdir(parents=True)
    (home / ".qwen" / "settings.json").write_text(json.dumps({
        "general": {"enableAutoUpdate": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }))
    env = {
        # Qwen Code's `#!/usr/bin/env node` finds the registry's Node 22 first.
        "PATH": f"{NODE_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "OPENAI_BASE_URL": "http://127.0.0.1:8000/v1",
        "OPENAI_API_KEY": "sk-unused",
        "OPENAI_MODEL": QWEN.stem,
    }
    proc = run_isolated(tmp_path, QWEN, env, str(QWEN_CODE), "--output-format", "json", TURN)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], proc.server_log[-3000:])
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("{", "["))]
    assert lines, (proc.stdout[-3000:], proc.stderr[-3000:])
    events = json.loads(lines[-1])
    result = [e for e in (events if isinstance(events, list) else [events])
              if e.get("type") == "result"][-1]
    assert result["is_error"] is False, result
    api = result["stats"]["models"][QWEN.stem]["api"]
    assert api["totalRequests"] >= 1 and api["totalErrors"] == 0, api
    assert 'endpoint="chat"' in proc.server_log
    assert result["usage"]["input_tokens"] > 10000, result["usage"]


@pytest.fixture(scope="module")
def agents_sdk():
    sdk = pytest.importorskip(
        "agents", reason="skipped: openai-agents missing (tests/e2e/requirements.txt)"
    )
    # The SDK would upload traces to OpenAI: off.
    sdk.set_tracing_disabled(True)
    return sdk


@pytest.fixture(scope="module")
def agents_client(server):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def weather(city: str) -> str:
    """The weather in a city."""
    return f"It is sunny in {city}."


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_openai_agents_sdk_runs_an_agent_with_a_function_tool(
    agents_sdk, agents_client, model_name, api
):
    agents = agents_sdk
    if api == "responses":
        model = agents.OpenAIResponsesModel(model=model_name, openai_client=agents_client)
    else:
        model = agents.OpenAIChatCompletionsModel(model=model_name, openai_client=agents_client)
    agent = agents.Agent(
        name="Forecaster",
        instructions="Answer in one short sentence. Use the weather tool for the weather.",
        model=model,
        model_settings=agents.ModelSettings(temperature=0.0, max_tokens=64),
        tools=[agents.function_tool(weather)],
    )
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert isinstance(result.final_output, str) and result.final_output.strip(), result
