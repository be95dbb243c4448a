#!/usr/bin/env bash
# The Python venv with the pinned PyPI `gguf` package and numpy (scripts/tiny-moe-requirements.txt)
# that writes the tiny test models and adapters: made once, remade when the pins change. Prints
# its python. MOE_VENV (default ~/.cache/sluice-moe-venv) is the venv.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${MOE_VENV:-$HOME/.cache/sluice-moe-venv}
req=$root/scripts/tiny-moe-requirements.txt
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$venv/requirements.txt"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$req" >&2
  cp "$req" "$venv/requirements.txt"
fi
echo "$venv/bin/python"
