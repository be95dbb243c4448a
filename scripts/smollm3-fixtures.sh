#!/usr/bin/env bash
# Regenerate the SmolLM3 fixtures, tests/fixtures/smollm3/*.jsonl (see its README): the tiny
# model (scripts/make-smollm3-models.sh, checked against SHA256SUMS), llama.cpp's server
# (scripts/llama-server.sh, built once), then scripts/smollm3-fixtures.py. Extra arguments go to
# it (e.g. --format f32).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
models=$("$root/scripts/make-smollm3-models.sh")
bin=$(LLAMA_TARGETS="llama-server llama-quantize" "$root/scripts/llama-server.sh")
python3 "$root/scripts/smollm3-fixtures.py" --bin "$bin" --models "$models" --out "$root/tests/fixtures/smollm3" "$@"
