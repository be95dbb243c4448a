"""A mixture of experts served for real: the tiny random-weight qwen3moe file that
`scripts/make-moe-models.sh` writes with the PyPI `gguf` package (SmolLM2's real tokenizer and
chat template, 8 experts, 2 a token). Chat and completion requests answer, streams carry the
same text as whole answers, `/v1/models` and `/metrics` say the model is a mixture (parameters,
experts, the share of expert weights a step read), and the cancellation storm of
`test_storm.py` leaves the KV blocks idle. Without the file the tests are skipped, saying
which script makes it (scripts/test.sh runs it, so CI does)."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from harness import ROOT, metric_value, parse_metrics, run_together, served
from test_storm import storm

MOE = ROOT / "models" / "tiny-moe" / "qwen3moe-q8_0.gguf"

pytestmark = pytest.mark.skipif(
    not MOE.is_file(),
    reason=f"skipped: {MOE.relative_to(ROOT)} missing, run scripts/make-moe-models.sh",
)


@pytest.fixture(scope="module")
def moe_server():
    yield from served("--kv-cache-memory", "64MiB", name="moe", model=MOE)


@pytest.fixture(scope="module")
def moe_client(moe_server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=moe_server.base_url, api_key="unused", max_retries=0, timeout=120
    )


def test_models_lists_a_mixture_of_experts(moe_server):
    card = requests.get(f"{moe_server.base_url}/models", timeout=10).json()["data"][0]
    assert card["id"] == MOE.stem, card
    assert card["architecture"] == "qwen3moe", card
    assert card["mixture_of_experts"] == {"experts": 8, "experts_per_token": 2}, card
    assert 0 < card["active_parameters"] < card["parameters"], card


def test_chat_and_completion_answer_and_stream_the_same_text(moe_client):
    chat = moe_client.chat.completions.create(
        model=MOE.stem,
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=16,
        temperature=0,
    )
    assert chat.choices[0].message.content, chat
    assert chat.usage.completion_tokens > 0
    whole = moe_client.completions.create(
        model=MOE.stem, prompt="The experts said", max_tokens=16, temperature=0, seed=1
    )
    streamed = "".join(
        c.choices[0].text
        for c in moe_client.completions.create(
            model=MOE.stem,
            prompt="The experts said",
            max_tokens=16,
            temperature=0,
            seed=1,
            stream=True,
        )
        if c.choices
    )
    assert whole.choices[0].text and streamed == whole.choices[0].text


def test_metrics_count_parameters_experts_and_the_share_read(moe_server, moe_client):
    moe_client.completions.create(model=MOE.stem, prompt="metrics", max_tokens=4)
    text = moe_server.metrics_text()
    # Each series is labelled with its model's served name and its kind.
    samples = {(n, labels): v for n, labels, v in parse_metrics(text)}
    model = f'model="{MOE.stem}"'
    assert samples[("sluice_model_experts", "{" + model + ',kind="total"}')] == 8, text
    assert samples[("sluice_model_experts", "{" + model + ',kind="per_token"}')] == 2, text
    total = samples[("sluice_model_parameters", "{" + model + ',kind="total"}')]
    active = samples[("sluice_model_parameters", "{" + model + ',kind="active"}')]
    assert 0 < active < total
    count = metric_value(text, "sluice_moe_expert_weights_read_ratio_count")
    assert count and count > 0, text
    share = metric_value(text, "sluice_moe_expert_weights_read_ratio_sum") / count
    # A step of one row reads 2 of 8 experts a layer; a prompt's rows read more.
    assert 0.25 <= share <= 1.0, share


def test_cancellation_storm_on_the_mixture(moe_server):
    # test_storm.py's storm on this server: every completed stream equals its prompt alone,
    # and the blocks come back.
    storm(moe_server)


def test_a_prompt_alone_equals_it_among_others(moe_server):
    """Batching is invisible on a mixture: eight greedy prompts sent together give what each
    gives alone (their rows share the experts' matmuls, in groups that change every step)."""
    prompts = [f"Item {i} of the list is" for i in range(8)]

    def complete(p: str) -> str:
        body = {"prompt": p, "max_tokens": 12, "temperature": 0}
        r = requests.post(f"{moe_server.base_url}/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    alone = [complete(p) for p in prompts]
    together = run_together(complete, prompts)
    assert together == alone, json.dumps({"alone": alone, "together": together})
