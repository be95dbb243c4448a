"""The calls to llama.cpp's server that the fixture scripts share (scripts/moe-fixtures.py,
scripts/gemma-fixtures.py): llama.cpp is their oracle. Standard library only.

- `complete` asks for greedy tokens with the raw logits' top 5 (`post_sampling_probs` false:
  log-softmax of the logits before any sampler), the prompt given as ids, no prompt cache.
- `alone` recovers a step whose probabilities the server left out (see its docstring).
"""
import json
import sys
import time
import urllib.error
import urllib.request


def post(port, path, body, timeout=600):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(port, proc, log):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"llama-server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if json.loads(r.read()).get("status") == "ok":
                    return
        except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    sys.exit(f"llama-server did not become ready; see {log}")


def complete(port, ids, n, ban=()):
    return post(port, "/completion", {
        "prompt": ids,
        "n_predict": n,
        "temperature": 0,
        "n_probs": 5,
        "post_sampling_probs": False,
        "cache_prompt": False,
        "return_tokens": True,
        "stream": False,
        "logit_bias": [[t, False] for t in ban],
    })


def step_of(top, pieces=False):
    """A fixture step from the server's `top_logprobs`; `pieces` adds their texts."""
    step = {
        "id": top[0]["id"],
        "logprob": top[0]["logprob"],
        "top": [[t["id"], t["logprob"]] for t in top],
    }
    if pieces:
        step["top_pieces"] = [t["token"] for t in top]
    return step


def alone(port, prefix, tok, pieces=False):
    """The raw top-5 after `prefix`, whose greedy token is `tok`, from a one-token request.

    llama-server leaves a token out of completion_probabilities when the text generated so far
    ends in an incomplete UTF-8 sequence (byte tokens). The same request for one token with
    that token banned (logit_bias false) samples another one, whose probabilities are
    returned; they are the raw logits' (post_sampling_probs false), which the ban does not
    touch, so top[0] is still `tok`."""
    ban = [tok]
    for _ in range(8):
        r = complete(port, prefix, 1, ban)
        if r["completion_probabilities"]:
            top = r["completion_probabilities"][0]["top_logprobs"]
            assert top[0]["id"] == tok, (tok, top)
            return step_of(top, pieces)
        ban.append(r["tokens"][0])
    sys.exit(f"no probabilities for the step after {prefix}")


def greedy_steps(port, ids, res, pieces=False):
    """The fixture steps of `res`, a `complete` answer for prompt `ids`: the returned
    probabilities paired with the tokens (a subsequence: see `alone`), the left-out ones taken
    alone. Returns the steps, the ids that were left out, and how many steps were taken alone."""
    toks, probs = res["tokens"], res["completion_probabilities"]
    steps, j = [], 0
    for t in toks:
        if j < len(probs) and probs[j]["id"] == t:
            top = probs[j]["top_logprobs"]
            assert len(top) == 5 and top[0]["id"] == t, probs[j]  # greedy: the chosen one is top-1
            steps.append(step_of(top, pieces))
            j += 1
        else:
            steps.append(None)
    assert j == len(probs), (toks, [p["id"] for p in probs])
    dropped = {t for t, s in zip(toks, steps) if s is None}
    if any(s is not None and t in dropped for t, s in zip(toks, steps)):
        # A left-out token's id also appears among the returned ones: the pairing above could be
        # off, so take every step alone.
        steps = [None] * len(toks)
    filled = 0
    for i, t in enumerate(toks):
        if steps[i] is None:
            steps[i] = alone(port, ids + toks[:i], t, pieces)
            filled += 1
    return steps, dropped, filled
