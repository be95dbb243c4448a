#!/usr/bin/env bash
# Regenerate the Qwen3.5 hybrid fixtures, tests/fixtures/qwen35/*.jsonl (see its README): the
# tiny models (scripts/make-qwen35-models.sh, checked against SHA256SUMS), llama.cpp's server
# (scripts/llama-server.sh, built once), then scripts/qwen35-fixtures.py. Extra arguments go to
# it (e.g. --file qwen35-f32).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
models=$("$root/scripts/make-qwen35-models.sh")
bin=$(LLAMA_TARGETS="llama-server llama-quantize" "$root/scripts/llama-server.sh")
python3 "$root/scripts/qwen35-fixtures.py" --bin "$bin" --models "$models" --out "$root/tests/fixtures/qwen35" "$@"
