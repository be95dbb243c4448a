#!/usr/bin/env bash
# Makes the figures of BENCHMARKS.md on this machine, in one run: the machine's limits (read
# bandwidth and GEMM peak), the paged-attention kernel, the forward-pass bench, then sluice and llama.cpp's server side by
# side on the default model (the same Q4_1 file, and llama.cpp also on an F32 copy, its best
# file at many clients), the same request shape, one server at a time; last, a table of the
# figures with sluice's ratio to llama.cpp's best and the fraction of the limits each reaches.
#
#   ./scripts/bench.sh [OUT_DIR]        (default: benchmarks/)
#
# Environment: SLUICE_BENCH_LEVELS (default 1,4,16,64), SLUICE_BENCH_REQUESTS (default 2x:
# requests per client at each level). Takes 10 to 25 minutes on 2 cores (the first run also
# builds llama.cpp, about 10 more). The host's speed drifts by 30% or more between periods, so
# only ratios from one run mean anything; run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-benchmarks}
levels=${SLUICE_BENCH_LEVELS:-1,4,16,64}
requests=${SLUICE_BENCH_REQUESTS:-2x}
mkdir -p "$out"

./scripts/fetch-model.sh
cargo build --release -p sluice-server -p sluice-bench

echo "== limits and GEMM (cargo bench -p sluice-kernels --bench gemm)"
cargo bench -p sluice-kernels --bench gemm | tee "$out/gemm.md"
echo "== attention (cargo bench -p sluice-kernels --bench attention)"
cargo bench -p sluice-kernels --bench attention | tee "$out/attention.md"
echo "== forward (cargo bench -p sluice-model --bench forward)"
SLUICE_BENCH_WEIGHTS=${SLUICE_BENCH_WEIGHTS:-auto,auto/q8_0,quantized,f32} \
    cargo bench -p sluice-model --bench forward | tee "$out/forward.md"

echo "== servers side by side (scripts/compare-llama.sh)"
COMPARE_F32=1 COMPARE_REQUESTS=$requests \
    ./scripts/compare-llama.sh models/SmolLM2-135M-Instruct.Q4_1.gguf "$levels" "$out"
