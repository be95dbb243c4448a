#!/usr/bin/env python3
"""Record the Qwen3.5 hybrid fixtures (tests/fixtures/qwen35/FILE-greedy.jsonl) with
llama.cpp's server as the oracle, on the tiny models of scripts/make-qwen35-models.sh.
Standard library only.

    scripts/qwen35-fixtures.sh     # = the three steps:
    MODELS=$(scripts/make-qwen35-models.sh)
    BIN=$(LLAMA_TARGETS="llama-server llama-quantize" scripts/llama-server.sh)
    python3 scripts/qwen35-fixtures.py --bin "$BIN" --models "$MODELS" --out tests/fixtures/qwen35

The server flags and rows of the MoE fixtures (`record_file` of scripts/lib/llama_oracle.py, one
llama-server per file), with its prompts and one more of 400+ tokens, so that the recurrent
state carries far.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from llama_oracle import PROMPTS, record_file  # noqa: E402

FILES = [f"{arch}-{fmt}" for arch in ["qwen35", "qwen35moe", "qwen3next"] for fmt in ["f32", "q8_0", "q4_k_m", "q4_k_m-f32"]]

LONG = (
    "Minutes of the harbour board, third meeting of the autumn session. Present: the chair, the "
    "treasurer, the harbour master, four members and the clerk. The chair opened the meeting at "
    "six and asked the clerk to read the minutes of the last one, which were agreed without "
    "change. The harbour master reported on the state of the north wall. The storm of the "
    "fourteenth had moved two of the large stones at its end, and the gap between them now let "
    "the swell into the inner basin at high water. Three boats had been damaged against the "
    "quay, one of them badly. He had put a line of old tyres along the worst stretch as a stop, "
    "but said that the wall itself must be repaired before the winter gales, and that the work "
    "would need a crane, a barge and about six weeks of calm weather. The treasurer said that "
    "the repair fund held a little over half of what the last estimate had given, and that the "
    "estimate was four years old. A member asked whether the county would pay a share, as it "
    "had for the slipway. The clerk said that he had written to the county in the spring and had "
    "received no answer, and that he would write again and telephone as well. Another member "
    "proposed that the mooring fees be raised by a tenth for the next season, the extra to go "
    "to the repair fund. There was a long discussion. Some members said that the fishermen "
    "could not pay more in a bad year; others that the wall protected their boats above all, "
    "and that a damaged boat cost far more than the fee. The chair put the proposal to a vote "
    "and it was carried by five to two. The harbour master then asked for leave to get three "
    "quotes for the work, which was given. Under any other business, a member raised the "
    "question of the lights on the east pier, two of which had failed. The harbour master said "
    "that new lamps had been ordered and would be fitted within the week. The meeting closed at "
    "a quarter to eight. Actions agreed:"
)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder with llama-server (scripts/llama-server.sh)")
    ap.add_argument("--models", required=True, help="folder with the tiny Qwen3.5 GGUF files")
    ap.add_argument("--out", required=True, help="fixtures folder (tests/fixtures/qwen35)")
    ap.add_argument("--port", type=int, default=18293)
    ap.add_argument("--file", action="append", choices=FILES)
    ap.add_argument("--server-args", default="", help="more llama-server arguments (for experiments)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in args.file or FILES:
        record_file(args.bin, os.path.join(args.models, f"{name}.gguf"),
                    os.path.join(args.out, f"{name}-greedy.jsonl"), args.port,
                    args.server_args.split(), prompts=PROMPTS + [LONG])


if __name__ == "__main__":
    main()
