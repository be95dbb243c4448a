#!/usr/bin/env python3
"""Record llama.cpp's GPT-4o (o200k) pre-tokenizer fixtures in tests/fixtures/tokenizer/.
Standard library only (and g++ for the split reference).

    BIN=$(LLAMA_TARGETS=llama-tokenize scripts/llama-server.sh)
    python3 scripts/gpt4o-tokenize-fixture.py --bin "$BIN"

- gpt-4o-tokenize.jsonl: llama.cpp's ids for each of TEXTS on the vocab-only GGUF
  ggml-vocab-gpt-4o.gguf (GPT-2's vocabulary with `tokenizer.ggml.pre = "gpt-4o"`), one row
  `{"text", "ids"}` per string. Each string goes to `llama-tokenize --file F --ids --no-bos
  --no-escape` (the file read verbatim; special tokens parsed, llama-tokenize's default and what
  `Tokenizer::encode` does).
- gpt-4o-split.jsonl: llama.cpp's split itself, `{"text", "words"}`, for TEXTS and N_RANDOM
  random strings (seed SEED) over POOL: gpt4o-split-ref.cpp, built against the same libllama,
  runs its exported `unicode_regex_split` with the GPT-4o regexes read from the llama.cpp
  source's src/llama-vocab.cpp. GPT-2's merges hide most split differences in the ids; the
  words show them all.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizer")

TEXTS = [
    # Contractions: suffixes of the word before them, ASCII case-insensitive.
    "don't",
    "I'M here",
    "They'Re",
    "DON'T STOP",
    "we'LL see, you'VE been, she'D go, it'S",
    "I'll we've they're you'd",
    "'s alone",
    "x's 'S 'Re",
    "O'Neil rock'n'roll",
    "McDonald's",
    "'\u017f long s",
    "what'sUp",
    "É's É'S",
    # Digits: groups of up to three.
    "1234567",
    "3.14159",
    "1,000,000 and 12 345",
    "x1234567y",
    "\u0663\u0664\u0665\u0666 \u00b2\u00b3\u2074 \u216b",
    "v2.0.10-rc1",
    # Whitespace.
    "  leading spaces",
    "trailing spaces   ",
    "a\t\tb\tc",
    "\r\n",
    "line1\r\nline2\r\n\r\nline3",
    " \n \n  x",
    "\n\n\n",
    "   \n",
    "a  b   c\n\n  d \n e",
    "\u00a0nbsp\u2009thin\u3000ideographic",
    " ",
    "\t",
    "x \t\n y",
    # Slashes after punctuation ([\r\n/]*).
    "path/to/file\n/next",
    "a//\n/\nb",
    "./\n/\r\n/x",
    "http://example.com/a/b?q=1&r=2#frag\n",
    # Letters: camelCase, ALLCAPS, titles.
    "camelCaseWord",
    "XMLHttpRequest",
    "getHTTPResponseCode",
    "ALLCAPS WORDS HERE",
    "iPhone PascalCase snake_case kebab-case",
    "ABCdef ABC def",
    "YouTube JavaScript GitHub WordPress PlayStation LinkedIn iPad eBay PowerPoint McDonald",
    "iOS macOS PayPal DeVos LeBron McConnell HuffPost iTunes eSports PvP McCain",
    " APIs GPUs DVDs NGOs URLs IDs",
    # Non-ASCII letters: cased, precomposed and with combining marks.
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9",
    "cafe\u0301 nai\u0308ve",
    "\u00c9COLE \u00e9cole \u00c9cole",
    "NA\u00cfVE Stra\u00dfe STRASSE",
    "\u00d6l\u00e7\u00fc \u0130stanbul",
    "\u0391\u0392\u0393 \u03b1\u03b2\u03b3 \u0391\u03b2\u03b3",
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u041c\u0418\u0420",
    "\u01c4ungla \u01c5ungla \u02b0ello \u00aaa",
    "\u212a kelvin",
    "\u0301 alone, a\u0301b, x\u200dy",
    # Other scripts.
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\u4e2d\u6587\u6d4b\u8bd5\uff0c\u6807\u70b9\u3002",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
    "abc\u0430\u0431\u0432 Hello\u4e16\u754c \u30c6\u30b9\u30c8Test",
    # Emoji.
    "\U0001f44d\U0001f3fd thumbs",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
    "\U0001f1fa\U0001f1f8\U0001f1eb\U0001f1f7 flags",
    "\U0001f980 crab \u2764\ufe0f",
    # Punctuation.
    "!!!???...",
    "--- *** ===",
    "(a) [b] {c} <d>",
    "\u00abquotes\u00bb \u201eGerman\u201c \u2014 dash",
    "Hello, world!",
    "$100 \u20ac50 50%",
    # Code.
    "def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)\n",
    "fn main() {\n\tlet x: Vec<u8> = vec![1, 2, 3];\n\tprintln!(\"{x:?}\");\n}\n",
    '{"key": "value", "n": [1, 2.5, null]}',
    "<div class=\"a\">text</div>\n",
    "if (a && b || !c) { return; } // done\n",
    # Special tokens inside text (parsed).
    "hello<|endoftext|>world",
    "<|endoftext|>",
    " <|endoftext|> x",
    # Control characters.
    "a\x01b\x7fc",
]


SEED = 4242
N_RANDOM = 400
# Characters that exercise every branch of the regex: ASCII letters of both cases (the
# contraction letters among them), cased and uncased non-ASCII letters, combining marks,
# digits of several scripts, every kind of whitespace, punctuation, `/`, emoji.
POOL = list(
    "aBsStrEvmlLdDxzI'' '\n\r\t/.,(!-_$07"
    "\u00a0\u2009\u3000\u0085\u0663\u00b2\u216b\u20ac\u4e2d\u00e9\u00c9\u00df\u0416\u0436"
    "\u017f\u0301\u094d\u0928\u200d\u01c4\u01c5\u02b0\u00aa\u03a3\u03c3\u212a\x7f"
    "\U0001f980\U0001f44d\U0001f3fd"
)


def random_texts():
    rng = random.Random(SEED)
    return ["".join(rng.choice(POOL) for _ in range(rng.randrange(25))) for _ in range(N_RANDOM)]


def gpt4o_regexes(llama_src):
    """The regex strings llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O case sets, unescaped."""
    with open(os.path.join(llama_src, "src", "llama-vocab.cpp"), encoding="utf-8") as f:
        src = f.read()
    start = src.index("case LLAMA_VOCAB_PRE_TYPE_GPT4O:")
    block = src[start:src.index("break;", start)]
    literals = re.findall(r'^\s*"(.*)",\s*$', block, re.M)
    assert literals, "no GPT-4o regex found in llama-vocab.cpp"
    return [lit.encode().decode("unicode_escape") for lit in literals]


def splits(args, texts):
    """llama.cpp's words for each text, by gpt4o-split-ref.cpp."""
    ref = os.path.join(FIXTURES, "gpt4o-split-ref.cpp")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "split")
        subprocess.run(["g++", "-O1", "-std=c++17", "-o", exe, ref, "-L" + args.bin, "-lllama",
                        "-Wl,-rpath," + args.bin], check=True)
        data = "\0".join(texts).encode("utf-8")
        out = subprocess.run([exe] + gpt4o_regexes(args.llama_src), input=data,
                             capture_output=True, check=True).stdout.decode()
    rows = []
    for text, line in zip(texts, out.splitlines(), strict=True):
        raw, words, at = text.encode("utf-8"), [], 0
        for n in map(int, line.split()):
            words.append(raw[at:at + n].decode("utf-8"))
            at += n
        assert at == len(raw), text
        rows.append({"text": text, "words": words})
    return rows


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{path}: {len(rows)} rows", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, help="folder holding llama-tokenize")
    ap.add_argument("--vocab", default=os.path.join(FIXTURES, "ggml-vocab-gpt-4o.gguf"))
    ap.add_argument("--llama-src", help="llama.cpp source tree (default: BIN/../..)")
    args = ap.parse_args()
    args.llama_src = args.llama_src or os.path.dirname(os.path.dirname(args.bin))
    env = dict(os.environ, LD_LIBRARY_PATH=args.bin)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "text")
        for text in TEXTS:
            with open(path, "wb") as f:
                f.write(text.encode("utf-8"))
            out = subprocess.run(
                [os.path.join(args.bin, "llama-tokenize"), "-m", args.vocab, "--file", path,
                 "--ids", "--no-bos", "--no-escape", "--log-disable"],
                env=env, capture_output=True, text=True, check=True,
            ).stdout
            ids = json.loads(out.strip().splitlines()[-1])
            rows.append({"text": text, "ids": ids})
    write_jsonl(os.path.join(FIXTURES, "gpt-4o-tokenize.jsonl"), rows)
    write_jsonl(os.path.join(FIXTURES, "gpt-4o-split.jsonl"), splits(args, TEXTS + random_texts()))


if __name__ == "__main__":
    main()
