#!/usr/bin/env bash
# The tiny random-weight Gemma 3 with its vision tower that tests/fixtures/vision/ was made on,
# in models/tiny-gemma3-vision/ (or $VISION_MODELS): text-f32.gguf (a `gemma3` text model with
# Gemma 3's tokenizer, copied from models/gemma-3-270m-q4_k_m.gguf, which scripts/fetch-gemma.sh
# fetches) and its `gemma3` projector, llama.cpp's `--mmproj` file, as mmproj-f32.gguf,
# mmproj-f16.gguf and mmproj-q8_0.gguf (scripts/tiny-gemma3-vision.py, pinned gguf and numpy in
# the venv of scripts/lib/gguf-venv.sh). Idempotent: files whose sha256 already matches
# tests/fixtures/vision/SHA256SUMS are kept. Ends by checking every file against SHA256SUMS and
# fails, naming the file, on any mismatch.
#
#   scripts/make-vision-models.sh                       # the four files (Python only)
#   VISION_UPDATE_SUMS=1 scripts/make-vision-models.sh  # after changing the weights on
#                                                       # purpose: regenerate, rewrite SHA256SUMS
#                                                       # (then scripts/vision-ref.py and
#                                                       # scripts/vision-fixtures.sh again)
#
# Prints the models folder on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${VISION_MODELS:-$root/models/tiny-gemma3-vision}
update=${VISION_UPDATE_SUMS:-0}
sums=$root/tests/fixtures/vision/SHA256SUMS
# expected, matches, stale and check_sums.
. "$root/scripts/lib/tiny-models.sh"

python=$("$root/scripts/lib/gguf-venv.sh")
"$root/scripts/fetch-gemma.sh" "$root/models" >&2
mkdir -p "$out"

files=()
for stem in text-f32 mmproj-f32 mmproj-f16 mmproj-q8_0; do
  files+=("$stem.gguf")
  if stale "$stem.gguf"; then
    "$python" "$root/scripts/tiny-gemma3-vision.py" --tokenizer "$root/models/gemma-3-270m-q4_k_m.gguf" \
      --out "$out" --only "$stem" >&2
  fi
done
check_sums
