#!/usr/bin/env python3
"""Record the Gemma 3 270M fixtures (tests/fixtures/gemma3-270m-*.jsonl) with llama.cpp's server
as the oracle, on the F32 GGUF that llama-quantize dequantizes from the shipped Q4_K_M file (the
weights sluice computes with in f32). Standard library only.

    scripts/gemma-fixtures.sh     # = fetch, build/locate llama.cpp, dequantize, then:
    python3 scripts/gemma-fixtures.py --bin "$BIN" --model /tmp/gemma-3-270m-f32.gguf --out tests/fixtures

One llama-server (-t 2, one slot; KV cache f32 and flash attention off, so that the F32 file
runs in exact f32 arithmetic; `--no-jinja --chat-template gemma`: the file carries no chat
template, and with --jinja this llama-server falls back to ChatML, which is wrong for Gemma).

- gemma3-270m-tokenize.jsonl: /tokenize with add_special false (no BOS) and parse_special true.
- gemma3-270m-greedy.jsonl: /tokenize with add_special true (Gemma's file asks for BOS, so
  prompt_ids start with <bos> = 2), then /completion on those ids, greedy (temperature 0),
  n_probs 5 with post_sampling_probs false (logprobs are log-softmax of the raw logits, before
  any sampler), cache_prompt false.
- gemma3-270m-chat-greedy.jsonl: the messages rendered with Gemma 3's chat template (below,
  `gemma_template`), checked against llama.cpp's own renderer of it (/apply-template, which
  leaves the BOS to the tokenizer); the rendered text starts with "<bos>", which /tokenize with
  parse_special turns into id 2, so prompt_ids hold one BOS. Then /completion as above.

Steps whose probabilities the server leaves out (a token that ends in an incomplete UTF-8
sequence) are taken from a one-token request on the same prefix (`alone`). Prints a summary
per file (rows, tokens, smallest top-1 margin per row) on stderr.
"""
import argparse
import json
import os
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from llama_oracle import complete, greedy_steps, post, wait_ready  # noqa: E402

BOS = 2  # <bos>; tokenizer.ggml.add_bos_token is true in the file
N_PREDICT = 32

TOKENIZE_TEXTS = [
    "Hello world",
    "The capital of France is",
    " leading space",
    "  two leading spaces",
    "trailing spaces   ",
    "multiple    spaces   inside  words",
    "\ttab\tseparated\tvalues",
    "\t\tdouble tab indent",
    "line one\nline two",
    "para one\n\npara two",
    "windows\r\nline endings\r\n",
    "\n\n\n\nfour newlines",
    "mixed \n  \n \t \n whitespace",
    " ",
    "\n",
    "   ",
    "",
    "中文分词测试：北京是中国的首都。",
    "日本語のテキスト、カタカナとひらがな。東京タワー",
    "한국어 문장입니다. 안녕하세요!",
    "مرحبا بالعالم، هذه جملة عربية.",
    "हिन्दी भाषा और ไทย ภาษา",
    "Emoji: 😀🎉🚀 and 👍🏽",
    "ZWJ family 👨\u200d👩\u200d👧\u200d👦 and flags 🇫🇷🇯🇵🏳️\u200d🌈",
    "Combining: e\u0301 a\u0300 n\u0303 vs precomposed \u00e9 \u00e0 \u00f1",
    "Rare symbols: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ℵ₀ ⊗ ⨁ 𓀀 \ue000 \U0001fae8",
    "bell\u0007 and controls \u0001\u001f\u007f end",
    "Ünïcödé àccents: naïve café résumé Straße Ελληνικά Кириллица",
    "def f(x):\n    return x * 2  # double\n",
    "fn main() {\n\tprintln!(\"{}\", 42);\n}",
    "3.14159 2718281828 1,000,000 -42 0x1F 1e-9",
    "Year 2024, phone +1-555-0123, id 12345678901234567890",
    "https://example.com/path?q=a+b&lang=en#frag",
    "email: someone@example.org, path C:\\Users\\me\\file.txt",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after bos<eos>",
    "<b>bold</b> and <table><tr><td>cell</td></tr></table>",
    "....!!!???---***___=== ~~~ ```",
    "MiXeD CaSe, ALLCAPS, snake_case_identifier and camelCaseIdentifier",
    "The committee met on Tuesday to review the proposal for the new library. After a long "
    "discussion about costs, location and opening hours, the members agreed that the building "
    "should stand near the station, where buses and trains already bring people from the "
    "surrounding villages. The architect promised revised drawings within six weeks; the "
    "treasurer warned that the budget could not grow by more than 8% without a public vote. "
    "Construction, if approved, would begin in the spring and take roughly two years.",
]

LONG_PROMPT = (
    "Ship's log of the schooner Marigold, kept by the second mate.\n\n"
    "3 June. Left the harbour at first light with a fair wind from the north-west. Cargo: "
    "forty barrels of salt cod, twelve crates of window glass packed in straw, six bolts of "
    "blue wool for the merchant Halvorsen, and the mail. Crew of nine, all in good health. The "
    "captain set a course due west to clear the shoals before turning south.\n\n"
    "4 June. Wind backed to the south and freshened through the afternoon. We reefed the "
    "mainsail at four bells. The cook reports that one barrel of fresh water has a bad taste "
    "and has set it aside for washing. Sighted a whaler on the starboard bow, too far off to "
    "speak her. Position at noon by dead reckoning: fifty-eight degrees north, four degrees west.\n\n"
    "5 June. Fog from dawn until nearly midday. We sounded every half hour and found between "
    "thirty and forty fathoms, sand and shell. When the fog lifted there was a low grey coast "
    "to the east that the captain took to be the outer islands. The boy Tomas cut his hand on "
    "a block; the captain stitched it and says it will heal clean.\n\n"
    "6 June. A fine clear day. Made good progress south under all plain sail, logging seven "
    "knots for most of the forenoon watch. Mended the jib, which had split along a seam in "
    "the squall of the fourth. In the evening the men sang, and Olsen played the fiddle until "
    "the captain sent everyone below.\n\n"
    "7 June. Heavy swell from the west, no wind to speak of. The ship rolled badly and two "
    "crates of glass shifted in the hold; we restowed them and found only one pane cracked. "
    "Halvorsen's wool is dry. The barometer is falling slowly, and the captain has ordered the "
    "topmasts struck before dark as a precaution.\n\n"
    "8 June. Gale from the south-west, beginning in the middle watch and blowing hard until "
    "the afternoon. Hove to under storm canvas. A sea came aboard over the waist and carried "
    "away the port quarter boat and part of the rail. No one hurt. By evening the wind "
    "moderated and we made sail again, steering south-east to recover our course.\n\n"
    "10 June. Raised the lighthouse on the point at two in the afternoon, and came to anchor "
    "in the roads before dark. The harbour master came out in his boat and told us the quay "
    "is full until Thursday. The captain went ashore with the mail and returned with fresh "
    "bread, eggs and word that the price of salt cod has risen.\n\n"
    "12 June. Brought the ship alongside the quay at seven in the morning and began to "
    "unload. By noon the cod was ashore and weighed, and Halvorsen's clerk had signed for "
    "the wool. The clerk asked for a list of everything else we had brought, and the "
    "captain read it out from the manifest:"
)


# (prompt, tokens to generate)
PROMPTS = [
    ("The capital of France is", N_PREDICT),
    ("Q: What is the capital of France?\nA:", N_PREDICT),
    ("Once upon a time, there was a little", N_PREDICT),
    ("def fibonacci(n):", N_PREDICT),
    ("1, 2, 3, 4, 5, 6,", N_PREDICT),
    ("Translate to French: \"Good morning, my friend.\"\nFrench:", N_PREDICT),
    # Longer prompts (100-300 tokens): attention over many positions.
    ("The river left its banks in the spring of that year, and the people of the valley moved "
     "their animals to the high pastures. For three weeks the water stood in the fields. When it "
     "went down, it left a layer of fine grey silt over everything: the roads, the walls of the "
     "houses, the floors of the barns. The old men said that the silt would make the ground rich, "
     "and that the harvest would be the best in twenty years. The young men did not believe them, "
     "but they planted anyway, because there was nothing else to do. By August the wheat stood "
     "taller than anyone could remember, and the", N_PREDICT),
    ("import json\nimport sys\n\n\ndef load_rows(path):\n    \"\"\"Read a JSON-lines file and "
     "return its rows as a list of dicts.\"\"\"\n    rows = []\n    with open(path) as f:\n"
     "        for n, line in enumerate(f, 1):\n            line = line.strip()\n"
     "            if not line:\n                continue\n            try:\n"
     "                rows.append(json.loads(line))\n            except json.JSONDecodeError as e:\n"
     "                print(f\"{path}:{n}: {e}\", file=sys.stderr)\n                raise\n"
     "    return rows\n\n\ndef main():\n    rows = load_rows(sys.argv[1])\n"
     "    by_key = {}\n    for row in rows:\n        by_key.setdefault(row[\"key\"], []).append(row)\n"
     "    for key in sorted(by_key):\n", N_PREDICT),
    ("Inventory report, warehouse 7, week 32. Item A-1043 (steel brackets, 40 mm): 1,250 units in "
     "stock, 310 shipped, 95 returned, reorder point 500. Item A-1044 (steel brackets, 60 mm): 870 "
     "units in stock, 402 shipped, 12 returned, reorder point 600. Item B-2210 (hex bolts, M8 x 30): "
     "14,400 units in stock, 3,120 shipped, 0 returned, reorder point 5,000. Item B-2211 (hex bolts, "
     "M10 x 40): 9,830 units in stock, 2,245 shipped, 40 returned, reorder point 4,000. Item C-0007 "
     "(washers, 8 mm): 52,000 units in stock, 11,600 shipped, 150 returned, reorder point 20,000. "
     "Notes: the 60 mm brackets fell below the reorder point on Thursday; an order for 1,000 "
     "units was placed with the usual supplier, delivery expected in week 34. Summary:", N_PREDICT),
    # ~600 tokens, past the local layers' sliding window (512): the cargo list the continuation
    # should recall sits more than 512 positions back, where only the global layers see it.
    (LONG_PROMPT, 16),
]

CHATS = [
    [{"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
     {"role": "user", "content": "What is the capital of Japan?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Hi! What is 2 + 2?"},
     {"role": "assistant", "content": "2 + 2 = 4."},
     {"role": "user", "content": "And what is that times 3?"}],
]


def gemma_template(messages):
    """Gemma 3's chat template (google/gemma-3-*-it), text content only: BOS, then a system
    message, if first, goes into the first user turn followed by a blank line; "assistant" is
    "model"; each turn's content is trimmed; a trailing "<start_of_turn>model\n" asks for the
    reply."""
    prefix, loop = "", messages
    if messages[0]["role"] == "system":
        prefix, loop = messages[0]["content"] + "\n\n", messages[1:]
    out = "<bos>"
    for i, m in enumerate(loop):
        assert (m["role"] == "user") == (i % 2 == 0), "roles must alternate user/assistant"
        role = "model" if m["role"] == "assistant" else m["role"]
        out += f"<start_of_turn>{role}\n" + (prefix if i == 0 else "") + m["content"].strip() + "<end_of_turn>\n"
    return out + "<start_of_turn>model\n"


def tokenize(port, text, add_special):
    return post(port, "/tokenize", {"content": text, "add_special": add_special, "parse_special": True})["tokens"]


def record(port, prompt, ids, n):
    assert ids[0] == BOS and BOS not in ids[1:], ids[:4]
    res = complete(port, ids, n)
    # The server evaluated exactly these ids: given ids, it adds no second BOS.
    assert res["tokens_evaluated"] == len(ids), (res["tokens_evaluated"], len(ids))
    steps, _, filled = greedy_steps(port, ids, res)
    toks = res["tokens"]
    row = {"prompt": prompt, "prompt_ids": ids, "text": res["content"], "ids": toks, "steps": steps}
    return row, filled, res.get("stop_type")


def margins(row):
    return [s["top"][0][1] - s["top"][1][1] for s in row["steps"]]


def summary(rows, filled, stops):
    toks = [t for r in rows for t in r["ids"]]
    per_row = [min(margins(r)) for r in rows]
    small = sum(m < 0.1 for r in rows for m in margins(r))
    lines = [f"{len(rows)} rows, {len(toks)} tokens, prompt lengths {[len(r['prompt_ids']) for r in rows]}, "
             f"steps taken alone {filled}, top1-top2 margin < 0.1 in {small}/{len(toks)} steps"]
    for i, (r, m, s) in enumerate(zip(rows, per_row, stops)):
        at = margins(r).index(m)
        lines.append(f"  row {i}: {len(r['ids'])} tokens (stop: {s}), smallest margin {m:.4f} at step {at}"
                     f"{'  <- near tie' if m < 0.1 else ''}; text {r['text'][:60]!r}")
    return "\n".join(lines)


def write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder with llama-server (scripts/llama-server.sh)")
    ap.add_argument("--model", required=True, help="the F32 GGUF dequantized from gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--out", required=True, help="fixtures folder (tests/fixtures)")
    ap.add_argument("--port", type=int, default=18292)
    ap.add_argument("--server-args", default="", help="more llama-server arguments (for experiments)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, LD_LIBRARY_PATH=args.bin)
    log = os.path.splitext(args.model)[0] + ".server.log"
    cmd = [os.path.join(args.bin, "llama-server"), "-m", args.model, "-t", "2", "-tb", "2",
           "-np", "1", "-c", "4096", "--port", str(args.port), "--host", "127.0.0.1",
           "--no-warmup", "-ctk", "f32", "-ctv", "f32", "-fa", "off",
           "--no-jinja", "--chat-template", "gemma"] + args.server_args.split()
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
    port = args.port
    try:
        wait_ready(port, proc, log)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/props", timeout=30) as r:
            props = json.loads(r.read())
        print(f"llama-server {props.get('build_info')}; bos_token {props.get('bos_token')!r}, "
              f"eos_token {props.get('eos_token')!r}", file=sys.stderr)
        # The server adds BOS (2) when asked to add special tokens, and nothing else.
        assert tokenize(port, "", True) == [BOS], tokenize(port, "", True)

        path = os.path.join(args.out, "gemma3-270m-tokenize.jsonl")
        rows = [{"text": t, "ids": tokenize(port, t, False)} for t in TOKENIZE_TEXTS]
        write(path, rows)
        ids = [i for r in rows for i in r["ids"]]
        byte = sum(238 <= i <= 493 for i in ids)  # <0x00>..<0xFF>
        print(f"{path}: {len(rows)} rows, {len(ids)} ids, {byte} byte-fallback ids, "
              f"{len(set(ids))} distinct", file=sys.stderr)

        path = os.path.join(args.out, "gemma3-270m-greedy.jsonl")
        got = [record(port, p, tokenize(port, p, True), n) for p, n in PROMPTS]
        rows, filled, stops = zip(*got)
        write(path, rows)
        print(f"{path}: {summary(rows, sum(filled), stops)}", file=sys.stderr)

        path = os.path.join(args.out, "gemma3-270m-chat-greedy.jsonl")
        got = []
        for messages in CHATS:
            prompt = gemma_template(messages)
            served = post(port, "/apply-template", {"messages": messages})["prompt"]
            assert prompt == "<bos>" + served, (prompt, served)
            ids = tokenize(port, prompt, False)
            assert ids == tokenize(port, served, True), ids
            row, n, stop = record(port, prompt, ids, N_PREDICT)
            got.append(({**row, "messages": messages}, n, stop))
        rows, filled, stops = zip(*got)
        write(path, rows)
        print(f"{path}: {summary(rows, sum(filled), stops)}", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
