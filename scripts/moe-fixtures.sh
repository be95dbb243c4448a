#!/usr/bin/env bash
# Regenerate the MoE fixtures, tests/fixtures/moe/*.jsonl (see its README): the tiny models
# (scripts/make-moe-models.sh, checked against SHA256SUMS), llama.cpp's server
# (scripts/llama-server.sh, built once), then scripts/moe-fixtures.py. Extra arguments go to it
# (e.g. --arch qwen3moe --format f32).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
models=$("$root/scripts/make-moe-models.sh")
bin=$(LLAMA_TARGETS="llama-server llama-quantize" "$root/scripts/llama-server.sh")
python3 "$root/scripts/moe-fixtures.py" --bin "$bin" --models "$models" --out "$root/tests/fixtures/moe" "$@"
