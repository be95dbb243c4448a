#!/usr/bin/env bash
# Builds the CUDA build of sluice and runs it on a GPU: the GPU test binary (the CUDA forward
# against the CPU's, the fixtures, device sampling), the end-to-end suite against
# `sluice serve` on the GPU, and a sluice-bench sweep of 1 to 256 clients; prints one table.
#
#   ./scripts/gpu-check.sh                 # build and run, on one machine with a GPU and network
#   ./scripts/gpu-check.sh build [BUNDLE]  # here (no GPU needed): build into BUNDLE (gpu-bundle/)
#   ./scripts/gpu-check.sh run [BUNDLE]    # on the GPU machine, from a bundle built elsewhere
#
# The build needs the toolkit and link libraries (scripts/setup-cuda.sh --link: CUDA 13.0 from
# PyPI, ~1 GB with cuBLAS). The run needs the NVIDIA driver (580 or newer, CUDA 13.0) and
# nothing from the network: models/ and the e2e .venv must already be there (scripts/test.sh
# installs both). Environment: SLUICE_GPU_MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf),
# SLUICE_GPU_LEVELS (1,4,16,64,128,256), SLUICE_GPU_SERVE_ARGS (extra `sluice serve` flags),
# SLUICE_GPU_E2E=0 to skip the end-to-end suite, SLUICE_GPU_WEIGHTS (the `--weights` kinds whose
# speed at 1 and 64 clients is compared after the sweep; default "quantized bf16": candle's CUDA
# quantized matmul on the file's blocks against bf16 cuBLAS on weights dequantized at load).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-all}
bundle=${2:-gpu-bundle}

build() {
    env_file=$(./scripts/setup-cuda.sh --link | tail -n 1)
    # shellcheck disable=SC1090
    . "$env_file"
    mkdir -p "$bundle"
    cargo build --release --features sluice-server/cuda -p sluice-server -p sluice-bench
    # Without debug info: the bundle travels to the GPU machine (sluice is ~200 MB with it).
    for bin in sluice sluice-bench; do
        strip --strip-debug -o "$bundle/$bin" "target/release/$bin"
    done
    # The GPU test binary: cargo names it by hash; ask cargo where it wrote it.
    test_bin=$(cargo test --release -p sluice-model --features cuda --test gpu --no-run \
        --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "gpu" and m.get("executable"):
        print(m["executable"])')
    strip --strip-debug -o "$bundle/gpu-tests" "$test_bin"
    # What the binaries link from the toolkit (cuBLAS, cuRAND, NVRTC, cudart): the GPU machine
    # may not have the toolkit, only the driver.
    mkdir -p "$bundle/lib"
    cp -L "$CUDA_HOME"/lib/lib{cublas,cublasLt,curand,nvrtc,cudart}.so.* "$bundle/lib/" 2>/dev/null || true
    echo "bundle: $bundle (sluice, sluice-bench, gpu-tests, lib/)"
}

run() {
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "skipped: no NVIDIA GPU here (nvidia-smi finds none)"
        exit 0
    fi
    export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)
    model=${SLUICE_GPU_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
    levels=${SLUICE_GPU_LEVELS:-1,4,16,64,128,256}
    out=$bundle/results
    mkdir -p "$out"

    tests=pass
    # --test-threads 1: the tests share one GPU.
    if ! SLUICE_FIXTURES=${SLUICE_FIXTURES:-../shared/fixtures} "$bundle/gpu-tests" \
        --test-threads 1 --nocapture >"$out/gpu-tests.log" 2>&1; then
        tests=FAIL
    fi

    e2e=skipped
    if [ "${SLUICE_GPU_E2E:-1}" != 0 ] && [ -x .venv/bin/pytest ]; then
        e2e=pass
        SLUICE_BIN="$PWD/$bundle/sluice" .venv/bin/pytest -q tests/e2e >"$out/e2e.log" 2>&1 || e2e=FAIL
    fi

    port=8497
    server=
    trap 'stop_server' EXIT
    # The main sweep with the default weights, then each weights kind at 1 and 64 clients.
    sweep "$out/sweep" "$levels"
    for weights in ${SLUICE_GPU_WEIGHTS:-quantized bf16}; do
        sweep "$out/weights-$weights" 1,64 --weights "$weights"
    done

    echo "## GPU check: $gpu, $(basename "$model")"
    echo
    echo "command: scripts/gpu-check.sh run (levels $levels, 128-token prompts and outputs)"
    echo "GPU tests: $tests ($out/gpu-tests.log); end-to-end: $e2e ($out/e2e.log)"
    echo
    cat "$out/sweep.md"
    for weights in ${SLUICE_GPU_WEIGHTS:-quantized bf16}; do
        echo
        echo "### --weights $weights, 1 and 64 clients"
        echo
        cat "$out/weights-$weights.md"
    done
    [ "$tests" = pass ] && [ "$e2e" != FAIL ]
}

stop_server() {
    if [ -n "${server:-}" ]; then
        kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
        server=
    fi
}

# sweep PREFIX LEVELS [SERVE FLAGS...]: serves the model with those flags, runs sluice-bench at
# LEVELS into PREFIX.{md,csv,json}, and stops the server.
sweep() {
    local prefix=$1 at=$2
    shift 2
    # shellcheck disable=SC2086 # SLUICE_GPU_SERVE_ARGS is a list of flags
    "$bundle/sluice" serve --model "$model" --host 127.0.0.1 --port "$port" \
        ${SLUICE_GPU_SERVE_ARGS:-} "$@" >"$prefix.serve.log" 2>&1 &
    server=$!
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
        kill -0 "$server" 2>/dev/null || { cat "$prefix.serve.log" >&2; exit 1; }
        sleep 0.5
    done
    "$bundle/sluice-bench" --base-url "http://127.0.0.1:$port" --sweep "$at" \
        --num-requests 4x --prompt-tokens 128 --output-tokens 128 --quiet \
        --csv "$prefix.csv" --json "$prefix.json" >"$prefix.md"
    stop_server
}

case $mode in
    build) build ;;
    run) run ;;
    all) build && run ;;
    *) echo "usage: $0 [build|run|all] [BUNDLE]" >&2; exit 2 ;;
esac
