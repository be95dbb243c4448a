#!/usr/bin/env bash
# The whole test suite, as CI runs it: fetch what the tests need, check formatting and lints,
# then every test of the workspace (release build: model tests are too slow in debug).
#
#   ./scripts/test.sh           # everything (CI)
#   ./scripts/test.sh --quick   # day to day: formatting, clippy (without `cuda`), the module and
#                               # doc checks, every cargo test, and the end-to-end suite on the
#                               # default model; no optional model, CUDA lint or container image
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
case "${1:-}" in
    --quick) quick=1 ;;
    "") ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

./scripts/fetch-model.sh
if [ "$quick" = 1 ]; then
    cargo fmt --all -- --check
    cargo clippy --release --workspace --all-targets -- -D warnings
    python3 scripts/check-module-cycles.py
    python3 scripts/check-file-sizes.py
    python3 scripts/check-doc-paths.py
    # Tests of the optional models print that they skipped (those models are not fetched here).
    cargo test --release --workspace
    ./scripts/setup-e2e.sh
    cargo build --release -p sluice-server
    # The files about other models' serving (Qwen, the MoE files, Gemma, the agent CLIs on Qwen)
    # are left out; the rest runs on the default model.
    .venv/bin/pytest -q tests/e2e --ignore=tests/e2e/test_qwen.py \
        --ignore=tests/e2e/test_moe.py --ignore=tests/e2e/test_gemma.py \
        --ignore=tests/e2e/test_gpt_oss.py --ignore=tests/e2e/test_agent_clients.py \
        --ignore=tests/e2e/test_qwen35.py
    exit 0
fi
# The optional second model (Qwen2.5-Coder-0.5B, qwen2): its tests skip without it, CI runs them.
./scripts/fetch-qwen.sh
# The optional larger model (Qwen2.5-Coder-1.5B, 1.1 GB): its tests skip without it, CI runs them.
./scripts/fetch-qwen-1.5b.sh
# Gemma 3 270M (gemma3, SentencePiece vocabulary): its tests skip without it, CI runs them.
./scripts/fetch-gemma.sh
# The tiny mixture-of-experts models llama.cpp's fixtures in tests/fixtures/moe were made on
# (the PyPI gguf package writes them; llama.cpp's llama-quantize, built once by
# scripts/llama-server.sh, makes the Q4_K_M ones), checked against their sha256: their tests
# skip without them, CI runs them.
./scripts/make-moe-models.sh >/dev/null
# The tiny SmolLM3 models of tests/fixtures/smollm3, made and checked the same way.
./scripts/make-smollm3-models.sh >/dev/null
# The tiny Qwen3.5 hybrids (qwen35, qwen35moe: Gated DeltaNet layers) of tests/fixtures/qwen35,
# made and checked the same way.
./scripts/make-qwen35-models.sh >/dev/null
# The tiny Gemma 3 with its vision tower (a gemma3 text model and its llama.cpp projector) of
# tests/fixtures/vision, made and checked the same way.
./scripts/make-vision-models.sh >/dev/null
# The random LoRA adapter llama.cpp's fixtures in tests/fixtures/lora were made with (the PyPI
# gguf package writes it, in llama.cpp's and PEFT's layouts): its tests skip without it.
./scripts/make-lora-adapters.sh >/dev/null
# llama.cpp's Phi-3 and Baichuan SentencePiece test vocabularies (sluice-tokenizer's spm_vocab
# tests skip without them, CI runs them).
./scripts/fetch-vocab-fixtures.sh
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
# The CUDA build, compiled and linted without a GPU: the pinned CUDA 13.0 toolkit from PyPI
# (scripts/setup-cuda.sh, cached in ~/.cache/sluice-cuda), then the same clippy with the `cuda`
# feature. nvcc builds candle's kernels (minutes cold) and ours (crates/sluice-kernels/cuda),
# whose build script fails on a kernel that spills registers. Release, like the step above, so
# the crates the feature does not touch are shared with it.
cuda_env=$(./scripts/setup-cuda.sh | tail -n 1)
(
    # shellcheck disable=SC1090
    . "$cuda_env"
    cargo clippy --release --workspace --all-targets --features cuda -- -D warnings
)
# No module of a crate imports a module that imports it back (ARCHITECTURE.md, invariants).
python3 scripts/check-module-cycles.py
# No Rust file is over 1,200 lines (one module, one job).
python3 scripts/check-file-sizes.py
# Every file ARCHITECTURE.md, README.md and docs/ name exists.
python3 scripts/check-doc-paths.py
cargo test --release --workspace

# End-to-end tests (tests/e2e): the real `sluice serve` binary against the official OpenAI Python
# and Node SDKs, curl and a real Prometheus. setup-e2e.sh installs them (.venv, Debian's
# prometheus, npm); pytest exits non-zero on a failure and also when no test ran.
./scripts/setup-e2e.sh
cargo build --release -p sluice-server
.venv/bin/pytest -q tests/e2e
# The guard against expectations that hold only on the day they were written: the Harmony file
# (a random model's choices, behind a template that prints the date) again with the server's
# and the tests' clock a year ahead. Its server pins the template's date, so every result must
# be the same. (libfaketime moves the monotonic clock by the same offset, which nothing reads as
# a date; DONT_FAKE_MONOTONIC=1 would break Python's time.sleep with EINVAL.)
faketime -f '+365d' .venv/bin/pytest -q tests/e2e/test_harmony.py

# The container image (scripts/test-image.sh): the Dockerfile built as the README builds it, with
# podman and locally made base images (no Docker daemon or registry needed; root installs podman),
# run, and /health, a completion and /metrics checked from the host. About 12 minutes cold on
# 2 cores (a release build inside the image), under a minute when its caches are warm.
./scripts/test-image.sh
