#!/usr/bin/env bash
# The tiny random-weight Qwen3.5 hybrids that tests/fixtures/qwen35/ was recorded on, in
# models/tiny-qwen35/ (or $QWEN35_MODELS): for qwen35, qwen35moe and qwen3next, ARCH-f32.gguf and
# ARCH-q8_0.gguf (scripts/tiny-qwen35.py, pinned gguf and numpy in the venv of
# scripts/lib/gguf-venv.sh), ARCH-q4_k_m.gguf (llama.cpp's llama-quantize on the F32 file,
# scripts/llama-server.sh) and ARCH-q4_k_m-f32.gguf (that file dequantized back to F32).
# Idempotent: files whose sha256 already matches tests/fixtures/qwen35/SHA256SUMS are kept.
# Ends by checking every file against SHA256SUMS and fails, naming the file, on any mismatch.
#
#   scripts/make-qwen35-models.sh                     # all 8 files (builds llama.cpp once)
#   QWEN35_KQUANTS=0 scripts/make-qwen35-models.sh    # F32 and Q8_0 only: Python, no llama.cpp
#   QWEN35_UPDATE_SUMS=1 scripts/make-qwen35-models.sh   # after changing the weights on
#                                                     # purpose: regenerate, rewrite SHA256SUMS
#
# Prints the models folder on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${QWEN35_MODELS:-$root/models/tiny-qwen35}
update=${QWEN35_UPDATE_SUMS:-0}
sums=$root/tests/fixtures/qwen35/SHA256SUMS
# expected, matches, stale, q4_k_m and check_sums.
. "$root/scripts/lib/tiny-models.sh"

python=$("$root/scripts/lib/gguf-venv.sh")
"$root/scripts/fetch-model.sh" "$root/models" >&2
mkdir -p "$out"

files=()
for arch in qwen35 qwen35moe qwen3next; do
  for fmt in f32 q8_0; do
    files+=("$arch-$fmt.gguf")
    if stale "$arch-$fmt.gguf"; then
      "$python" "$root/scripts/tiny-qwen35.py" --tokenizer "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
        --out "$out" --arch "$arch" --format "$fmt"
    fi
  done
done
if [ "${QWEN35_KQUANTS:-1}" != 0 ]; then
  bin=$(LLAMA_TARGETS="llama-quantize" "$root/scripts/llama-server.sh")
  q4_k_m "$bin" qwen35
  q4_k_m "$bin" qwen35moe
  q4_k_m "$bin" qwen3next
fi
check_sums
