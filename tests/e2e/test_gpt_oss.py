"""gpt-oss served for real: the tiny random-weight file with MXFP4 experts that
`scripts/make-moe-models.sh` writes with the PyPI `gguf` package (4 layers, a window of 16 keys
on every other one, sinks, biases, YaRN; SmolLM2's tokenizer and ChatML template). Under
`--weights exact` and an f32 KV cache its completions give llama.cpp's greedy text from
`tests/fixtures/moe/gpt-oss-f32-greedy.jsonl` word for word, prompts of up to 303 tokens
crossing the window many times with the local layers in a window pool of their own; streams
equal whole answers; `/v1/models` says what it is. Without the file the tests are skipped,
saying which script makes it (scripts/test.sh runs it, so CI does)."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from harness import ROOT, metric_value, run_together, served

OSS = ROOT / "models" / "tiny-moe" / "gpt-oss-mxfp4.gguf"
FIXTURE = ROOT / "tests" / "fixtures" / "moe" / "gpt-oss-f32-greedy.jsonl"

pytestmark = pytest.mark.skipif(
    not OSS.is_file(),
    reason=f"skipped: {OSS.relative_to(ROOT)} missing, run scripts/make-moe-models.sh",
)


@pytest.fixture(scope="module")
def oss_server():
    # Room for 8 sequences' windows: the local layers get their own pool. An f32 KV cache, as
    # llama.cpp's run that recorded the fixture had (f16 rounds K and V).
    yield from served(
        "--kv-cache-memory", "64MiB", "--max-num-seqs", "8", "--weights", "exact",
        "--kv-cache-dtype", "f32", name="gpt-oss", model=OSS,
    )


@pytest.fixture(scope="module")
def client(oss_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=oss_server.base_url, api_key="unused", max_retries=0, timeout=120)


def rows() -> list[dict]:
    with open(FIXTURE) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_models_says_gpt_oss_with_its_experts(oss_server):
    card = requests.get(f"{oss_server.base_url}/models", timeout=10).json()["data"][0]
    assert card["architecture"] == "gpt-oss", card
    assert card["mixture_of_experts"] == {"experts": 8, "experts_per_token": 2}, card
    assert "their own pool of" in oss_server.log_path.read_text()
    text = oss_server.metrics_text()
    assert metric_value(text, "sluice_kv_window_blocks_capacity") > 0, text


def test_exact_completions_equal_llama_cpp_greedy_text(client):
    """The MXFP4 experts dequantized exactly are the F32 file's numbers, which llama.cpp ran:
    every fixture row's text, served alone and all together."""
    fixture = rows()
    alone = []
    for row in fixture:
        r = client.completions.create(
            model=OSS.stem, prompt=row["prompt"], max_tokens=len(row["ids"]), temperature=0
        )
        assert r.usage.prompt_tokens == len(row["prompt_ids"]), row["prompt"]
        assert r.choices[0].text == row["text"], (row["prompt"], r.choices[0].text)
        alone.append(r.choices[0].text)
    together = run_together(
        lambda row: client.completions.create(
            model=OSS.stem, prompt=row["prompt"], max_tokens=len(row["ids"]), temperature=0
        ).choices[0].text,
        fixture,
    )
    assert together == alone


def test_a_stream_carries_the_whole_answer(client):
    row = rows()[-1]
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=OSS.stem, prompt=row["prompt"], max_tokens=len(row["ids"]), temperature=0,
            stream=True,
        )
        if c.choices
    )
    assert streamed == row["text"]
