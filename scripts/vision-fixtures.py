#!/usr/bin/env python3
"""Record the vision fixtures (tests/fixtures/vision/chat-greedy.jsonl) with llama.cpp's
server as the oracle, on the tiny Gemma 3 pair of scripts/make-vision-models.sh: chats with an
image (a data URI of a test PNG) and one without, greedy, with the raw logits' top 5.
Standard library only.

    scripts/vision-fixtures.sh     # = the three steps:
    MODELS=$(scripts/make-vision-models.sh)
    BIN=$(LLAMA_TARGETS=llama-server scripts/llama-server.sh)
    python3 scripts/vision-fixtures.py --bin "$BIN" --models "$MODELS" --out tests/fixtures/vision

One llama-server, `-m text-f32.gguf --mmproj mmproj-f32.gguf` (-t 2, one slot; KV cache f32 and
flash attention off, which the vision tower follows too, so that both run their f32 paths),
`--jinja --chat-template-file tests/fixtures/vision/gemma.jinja`: the text file has no chat
template, like the Gemma 3 270M file its vocabulary comes from, and gemma.jinja is sluice's
fallback Gemma template (`GEMMA` in crates/sluice-tokenizer/src/chat.rs) character for
character, so sluice renders these chats as llama.cpp does. LLAMA_MEDIA_MARKER pins the media
marker (llama-server draws a random one per process otherwise), so /apply-template's prompt is
the same each run.

Each row: the request's messages (the image as its fixture file's name), the prompt
/apply-template renders (with the marker where the image goes), the server's prompt token count,
the greedy tokens (`ids`, `text`) and per step the top 5 `[id, logprob]` of the raw logits
(`logprobs: true, top_logprobs: 5`: llama-server's default `post_sampling_probs` false, so
log-softmax before any sampler). Fails unless every image row's tokens differ from every other
row's and from the text-only row's; prints the top-1 minus top-2 margins.
"""
import argparse
import base64
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from llama_oracle import post, wait_ready  # noqa: E402

N_PREDICT = 16
MARKER = "<__media__>"
QUESTION = "What is in this picture?"

# (name, content parts): the image after the question (as clients usually send it), one
# before it, and a chat without an image.
CHATS = [
    ("gradient", [("text", QUESTION), ("image", "gradient.png")]),
    ("checker", [("text", QUESTION), ("image", "checker.png")]),
    ("stripes", [("text", QUESTION), ("image", "stripes.png")]),
    ("stripes-first", [("image", "stripes.png"), ("text", "Describe it.")]),
    ("text-only", [("text", QUESTION)]),
]


def content(parts, fixtures):
    out = []
    for kind, value in parts:
        if kind == "text":
            out.append({"type": "text", "text": value})
        else:
            with open(os.path.join(fixtures, value), "rb") as f:
                uri = "data:image/png;base64," + base64.b64encode(f.read()).decode()
            out.append({"type": "image_url", "image_url": {"url": uri}})
    return out


def record(port, name, parts, fixtures):
    messages = [{"role": "user", "content": content(parts, fixtures)}]
    shown = [{"role": "user", "content": [
        {"type": "text", "text": v} if k == "text" else {"type": "image_url", "image": v}
        for k, v in parts]}]
    prompt = post(port, "/apply-template", {"messages": messages})["prompt"]
    r = post(port, "/v1/chat/completions", {
        "messages": messages, "temperature": 0, "max_tokens": N_PREDICT,
        "logprobs": True, "top_logprobs": 5,
    })
    choice = r["choices"][0]
    steps = choice["logprobs"]["content"]
    for s in steps:
        assert s["top_logprobs"][0]["id"] == s["id"], s  # greedy: the chosen token is top-1
    return {
        "name": name,
        "messages": shown,
        "prompt": prompt,
        "prompt_tokens": r["usage"]["prompt_tokens"],
        "text": choice["message"]["content"],
        "ids": [s["id"] for s in steps],
        "steps": [{"id": s["id"], "logprob": s["logprob"],
                   "top": [[t["id"], t["logprob"]] for t in s["top_logprobs"]]} for s in steps],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder with llama-server (scripts/llama-server.sh)")
    ap.add_argument("--models", required=True, help="folder with the tiny pair (scripts/make-vision-models.sh)")
    ap.add_argument("--out", required=True, help="fixtures folder (tests/fixtures/vision)")
    ap.add_argument("--port", type=int, default=18297)
    args = ap.parse_args()
    log = os.path.join(args.models, "vision.server.log")
    cmd = [os.path.join(args.bin, "llama-server"),
           "-m", os.path.join(args.models, "text-f32.gguf"),
           "--mmproj", os.path.join(args.models, "mmproj-f32.gguf"),
           "-t", "2", "-tb", "2", "-np", "1", "-c", "4096", "--port", str(args.port),
           "--host", "127.0.0.1", "--no-warmup", "-ctk", "f32", "-ctv", "f32", "-fa", "off",
           "--jinja", "--chat-template-file", os.path.join(args.out, "gemma.jinja")]
    env = dict(os.environ, LD_LIBRARY_PATH=args.bin, LLAMA_MEDIA_MARKER=MARKER)
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(args.port, proc, log)
        rows = [record(args.port, name, parts, args.out) for name, parts in CHATS]
    finally:
        proc.terminate()
        proc.wait()
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if a["ids"] == b["ids"]:
                sys.exit(f"rows {a['name']} and {b['name']} have the same tokens: the image does not decide them")
    path = os.path.join(args.out, "chat-greedy.jsonl")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    for r in rows:
        margins = [round(s["top"][0][1] - s["top"][1][1], 2) for s in r["steps"]]
        print(f"{r['name']}: {r['prompt_tokens']} prompt tokens, margins {margins}", file=sys.stderr)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
