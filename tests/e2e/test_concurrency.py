"""Continuous batching must not change what a greedy client gets: 16 concurrent streams produce
the same text as each one alone."""

from __future__ import annotations

import openai

from harness import run_together

PROMPTS = [
    "The capital of France is",
    "The largest planet in the solar system is",
    "Water boils at a temperature of",
    "The first president of the United States was",
    "A recipe for pancakes starts with",
    "The speed of light is about",
    "My favourite programming language is",
    "In the morning I like to",
    "The tallest mountain on Earth is",
    "Photosynthesis is the process by which",
    "Once upon a time, in a small village,",
    "The three primary colours are",
    "To be or not to be, that is",
    "The chemical symbol for gold is",
    "A haiku about the sea:",
    "The best way to learn mathematics is",
]
MAX_TOKENS = 32


def stream_text(client: openai.OpenAI, model: str, prompt: str) -> tuple[str, str]:
    text, finish = "", None
    for chunk in client.completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
    ):
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def test_16_concurrent_streams_match_each_alone(server, model_name):
    assert len(PROMPTS) == 16
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=180)
    alone = [stream_text(client, model_name, p) for p in PROMPTS]
    assert all(finish in ("stop", "length") for _, finish in alone), alone

    def on_own_client(prompt: str) -> tuple[str, str]:
        c = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=180)
        return stream_text(c, model_name, prompt)

    together = run_together(on_own_client, PROMPTS)

    mismatches = [
        f"{PROMPTS[i]!r}:\n  alone:    {alone[i]!r}\n  together: {together[i]!r}"
        for i in range(len(PROMPTS))
        if together[i] != alone[i]
    ]
    assert not mismatches, "concurrent streams differ from each alone:\n" + "\n".join(mismatches)


def test_a_repeated_prompt_gets_the_same_answer_from_the_prefix_cache(server, model_name):
    """The second request finds the prompt's whole blocks in the prefix cache and prefills only
    its last partial block: a step of a few rows where the first prefilled the whole prompt in
    one. Batching is invisible bit for bit, so text and every logprob are the same."""
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=180)
    code = "\n".join(
        f"def f{i}(x):\n    # step {i}: scale and shift\n    return x * {i} + {i * 7} # done"
        for i in range(24)
    )
    prompt = code + "\n# The comment character of the code above is"
    runs = []
    for _ in range(3):
        r = client.completions.create(
            model=model_name, prompt=prompt, max_tokens=48, temperature=0, logprobs=1
        )
        runs.append((r.choices[0].text, r.choices[0].logprobs.token_logprobs))
    assert r.usage.prompt_tokens > 300, r.usage
    assert runs[1] == runs[0], f"first {runs[0][0]!r}, repeated {runs[1][0]!r}"
    assert runs[2] == runs[0]
