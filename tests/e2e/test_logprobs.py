"""Logprobs fidelity with the official SDK: control tokens are named, not empty strings, and every
`top_logprobs` entry holds the alternatives asked for."""

from __future__ import annotations

import math

# SmolLM2's chat format, written out, so a plain completion ends its turn with `<|im_end|>`.
CHAT_PROMPT = (
    "<|im_start|>user\nWhat is the capital of France? Answer in one word.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_completion_that_ends_in_eos_names_it(client, model_name):
    r = client.completions.create(
        model=model_name, prompt=CHAT_PROMPT, max_tokens=64, temperature=0, logprobs=5
    )
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    lp = c.logprobs
    assert lp.tokens[-1] == "<|im_end|>", lp.tokens
    # The text leaves the control token out; every other token's text is the choice's text.
    assert "".join(lp.tokens[:-1]) == c.text
    assert len(lp.top_logprobs) == len(lp.tokens) == r.usage.completion_tokens
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        # Five alternatives, plus the chosen token when it is not among them (greedy: it is).
        assert len(top) == 5, top
        assert math.isclose(top[token], logprob, abs_tol=1e-4)


def test_chat_logprobs_keep_the_count_asked_for(client, model_name):
    r = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=32,
        temperature=0,
        logprobs=True,
        top_logprobs=4,
    )
    entries = r.choices[0].logprobs.content
    assert entries
    for e in entries:
        assert len(e.top_logprobs) == 4
        assert bytes(e.bytes) == e.token.encode() or e.token.startswith("bytes:")
    if r.choices[0].finish_reason == "stop":
        assert entries[-1].token == "<|im_end|>"
