"""The official OpenAI Node SDK (tests/e2e/node, installed by scripts/setup-e2e.sh)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).parent / "node"


def test_node_sdk_completion_and_streaming_chat(server, model_name):
    node = shutil.which("node")
    if node is None:
        pytest.skip("skipped: node is not installed, run scripts/setup-e2e.sh")
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        pytest.fail("the openai npm package is missing: run ./scripts/setup-e2e.sh")
    out = subprocess.run(
        [node, "smoke.mjs", server.base_url, model_name],
        cwd=NODE_DIR,
        capture_output=True,
        timeout=180,
    )
    assert out.returncode == 0, f"node failed:\n{out.stdout.decode()}{out.stderr.decode()}"
    got = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert got["completion"].startswith(" Paris."), got
    assert got["completionFinish"] in ("stop", "length")
    assert got["completionUsage"]["completion_tokens"] >= 1
    assert got["role"] == "assistant"
    assert got["content"].startswith("The capital of Japan is Tokyo."), got
    assert got["finishReason"] in ("stop", "length")
    assert got["usage"]["completion_tokens"] > 0
