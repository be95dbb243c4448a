#!/usr/bin/env python3
"""Record the SmolLM3 fixtures (tests/fixtures/smollm3/smollm3-FORMAT-greedy.jsonl) with
llama.cpp's server as the oracle, on the tiny model of scripts/make-smollm3-models.sh. Standard
library only.

    scripts/smollm3-fixtures.sh     # = the three steps:
    MODELS=$(scripts/make-smollm3-models.sh)
    BIN=$(LLAMA_TARGETS="llama-server llama-quantize" scripts/llama-server.sh)
    python3 scripts/smollm3-fixtures.py --bin "$BIN" --models "$MODELS" --out tests/fixtures/smollm3

The same server flags, prompts and rows as the MoE fixtures (scripts/moe-fixtures.py): both
call `record_file` of scripts/lib/llama_oracle.py, one llama-server per file.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from llama_oracle import record_file  # noqa: E402

# The files of scripts/make-smollm3-models.sh.
FORMATS = ["f32", "q8_0", "q4_k_m", "q4_k_m-f32"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder with llama-server (scripts/llama-server.sh)")
    ap.add_argument("--models", required=True, help="folder with the tiny SmolLM3 GGUF files")
    ap.add_argument("--out", required=True, help="fixtures folder (tests/fixtures/smollm3)")
    ap.add_argument("--port", type=int, default=18292)
    ap.add_argument("--name", default="smollm3", help="the files' stem (NAME-FORMAT.gguf)")
    ap.add_argument("--format", action="append", choices=FORMATS)
    ap.add_argument("--server-args", default="", help="more llama-server arguments (for experiments)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for fmt in args.format or FORMATS:
        record_file(args.bin, os.path.join(args.models, f"{args.name}-{fmt}.gguf"),
                    os.path.join(args.out, f"{args.name}-{fmt}-greedy.jsonl"), args.port,
                    args.server_args.split())


if __name__ == "__main__":
    main()
