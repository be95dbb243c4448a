#!/usr/bin/env bash
# The whole test suite, as CI runs it: fetch what the tests need, check formatting and lints,
# then every test of the workspace (release build: model tests are too slow in debug).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/fetch-model.sh
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace
