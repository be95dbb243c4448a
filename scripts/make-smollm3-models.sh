#!/usr/bin/env bash
# The tiny random-weight SmolLM3 model that tests/fixtures/smollm3/ was recorded on, in
# models/tiny-smollm3/ (or $SMOLLM3_MODELS): smollm3-f32.gguf and smollm3-q8_0.gguf
# (scripts/tiny-smollm3.py, pinned gguf and numpy in the venv of scripts/lib/gguf-venv.sh),
# smollm3-q4_k_m.gguf (llama.cpp's llama-quantize on the F32 file, scripts/llama-server.sh) and
# smollm3-q4_k_m-f32.gguf (that file dequantized back to F32 by llama-quantize).
# Idempotent: files whose sha256 already matches tests/fixtures/smollm3/SHA256SUMS are kept.
# Ends by checking every file against SHA256SUMS and fails, naming the file, on any mismatch.
#
#   scripts/make-smollm3-models.sh                     # all 4 files (builds llama.cpp once)
#   SMOLLM3_KQUANTS=0 scripts/make-smollm3-models.sh   # F32 and Q8_0 only: Python, no llama.cpp
#   SMOLLM3_UPDATE_SUMS=1 scripts/make-smollm3-models.sh   # after changing the weights on
#                                                      # purpose: regenerate, rewrite SHA256SUMS
#
# Prints the models folder on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${SMOLLM3_MODELS:-$root/models/tiny-smollm3}
update=${SMOLLM3_UPDATE_SUMS:-0}
sums=$root/tests/fixtures/smollm3/SHA256SUMS
# expected, matches, stale, q4_k_m and check_sums.
. "$root/scripts/lib/tiny-models.sh"

python=$("$root/scripts/lib/gguf-venv.sh")
"$root/scripts/fetch-model.sh" "$root/models" >&2
mkdir -p "$out"

files=()
for fmt in f32 q8_0; do
  files+=("smollm3-$fmt.gguf")
  if stale "smollm3-$fmt.gguf"; then
    "$python" "$root/scripts/tiny-smollm3.py" --tokenizer "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
      --out "$out" --format "$fmt"
  fi
done
if [ "${SMOLLM3_KQUANTS:-1}" != 0 ]; then
  bin=$(LLAMA_TARGETS="llama-quantize" "$root/scripts/llama-server.sh")
  q4_k_m "$bin" smollm3
fi
check_sums
