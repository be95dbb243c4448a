"""The calls to llama.cpp's server that the fixture scripts share (scripts/moe-fixtures.py,
scripts/smollm3-fixtures.py, scripts/gemma-fixtures.py, scripts/lora-fixtures.py): llama.cpp is
their oracle. Standard library only.

- `complete` asks for greedy tokens with the raw logits' top 5 (`post_sampling_probs` false:
  log-softmax of the logits before any sampler), the prompt given as ids, no prompt cache.
- `alone` recovers a step whose probabilities the server left out (see its docstring).
- `record_file` records the greedy fixture of one tiny random-weight model file (the MoE and
  SmolLM3 ones): one server on it, a row per prompt of `PROMPTS`.
"""
import json
import os
import subprocess
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


# The tiny random-weight models' fixtures (tests/fixtures/moe, tests/fixtures/smollm3): 32
# greedy tokens after each of these prompts.
N_PREDICT = 32
PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5, 6,",
    "<|im_start|>user\nWhat is a mixture of experts?<|im_end|>\n<|im_start|>assistant\n",
    # Longer prompts (100-300 tokens): attention over many positions, and many routing choices.
    "The river left its banks in the spring of that year, and the people of the valley moved "
    "their animals to the high pastures. For three weeks the water stood in the fields. When it "
    "went down, it left a layer of fine grey silt over everything: the roads, the walls of the "
    "houses, the floors of the barns. The old men said that the silt would make the ground rich, "
    "and that the harvest would be the best in twenty years. The young men did not believe them, "
    "but they planted anyway, because there was nothing else to do. By August the wheat stood "
    "taller than anyone could remember, and the",
    "import json\nimport sys\n\n\ndef load_rows(path):\n    \"\"\"Read a JSON-lines file and "
    "return its rows as a list of dicts.\"\"\"\n    rows = []\n    with open(path) as f:\n"
    "        for n, line in enumerate(f, 1):\n            line = line.strip()\n"
    "            if not line:\n                continue\n            try:\n"
    "                rows.append(json.loads(line))\n            except json.JSONDecodeError as e:\n"
    "                print(f\"{path}:{n}: {e}\", file=sys.stderr)\n                raise\n"
    "    return rows\n\n\ndef main():\n    rows = load_rows(sys.argv[1])\n"
    "    by_key = {}\n    for row in rows:\n        by_key.setdefault(row[\"key\"], []).append(row)\n"
    "    for key in sorted(by_key):\n",
    "Inventory report, warehouse 7, week 32. Item A-1043 (steel brackets, 40 mm): 1,250 units in "
    "stock, 310 shipped, 95 returned, reorder point 500. Item A-1044 (steel brackets, 60 mm): 870 "
    "units in stock, 402 shipped, 12 returned, reorder point 600. Item B-2210 (hex bolts, M8 x 30): "
    "14,400 units in stock, 3,120 shipped, 0 returned, reorder point 5,000. Item B-2211 (hex bolts, "
    "M10 x 40): 9,830 units in stock, 2,245 shipped, 40 returned, reorder point 4,000. Item C-0007 "
    "(washers, 8 mm): 52,000 units in stock, 11,600 shipped, 150 returned, reorder point 20,000. "
    "Notes: the 60 mm brackets fell below the reorder point on Thursday; an order for 1,000 "
    "units was placed with the usual supplier, delivery expected in week 34. Summary:",
]


def record_row(port, prompt, n_predict=N_PREDICT):
    """One fixture row: /tokenize (no BOS, special tokens parsed), then greedy tokens on those
    ids. Returns the row and how many of its steps were taken alone."""
    ids = post(port, "/tokenize", {"content": prompt, "add_special": False, "parse_special": True})["tokens"]
    res = complete(port, ids, n_predict)
    steps, _, filled = greedy_steps(port, ids, res, pieces=True)
    row = {"prompt": prompt, "prompt_ids": ids, "text": res["content"], "ids": res["tokens"], "steps": steps}
    return row, filled


def record_file(bin_dir, model, path, port, server_args=(), prompts=PROMPTS):
    """Serves `model` with llama-server from `bin_dir` (its log next to the model as
    NAME.server.log), records a row per prompt into `path` (JSON lines) and prints a summary
    of it on stderr."""
    log = model[:-len(".gguf")] + ".server.log"
    # One slot, two threads; the KV cache f32 and flash attention off, so that F32 files run in
    # exact f32 arithmetic.
    cmd = [os.path.join(bin_dir, "llama-server"), "-m", model, "-t", "2", "-tb", "2",
           "-np", "1", "-c", "4096", "--port", str(port), "--host", "127.0.0.1",
           "--no-warmup", "-ctk", "f32", "-ctv", "f32", "-fa", "off"] + list(server_args)
    env = dict(os.environ, LD_LIBRARY_PATH=bin_dir)
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(port, proc, log)
        rows, filled = zip(*[record_row(port, p) for p in prompts])
    finally:
        proc.terminate()
        proc.wait()
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{path}: {summary(rows)}; steps taken alone: {sum(filled)}", file=sys.stderr)
    return rows


def summary(rows):
    """Distinct tokens, the longest run of one token, and the top-1 minus top-2 margins."""
    toks = [t for r in rows for t in r["ids"]]
    margins = sorted(s["top"][0][1] - s["top"][1][1] for r in rows for s in r["steps"])
    small = sum(m < 0.1 for m in margins)
    return (f"{len(rows)} rows, {len(toks)} tokens, {len(set(toks))} distinct; "
            f"longest run of one token {longest_run(rows)}; top1-top2 logprob margin p10 / median "
            f"/ p90 {margins[len(margins) // 10]:.2f} / {margins[len(margins) // 2]:.2f} / "
            f"{margins[len(margins) * 9 // 10]:.2f}, < 0.1 in {small}/{len(margins)}; prompt lengths "
            f"{[len(r['prompt_ids']) for r in rows]}")


def longest_run(rows):
    best = 0
    for r in rows:
        run, prev = 0, None
        for t in r["ids"]:
            run = run + 1 if t == prev else 1
            prev = t
            best = max(best, run)
    return best
