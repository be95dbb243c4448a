#!/usr/bin/env bash
# The GPU check: sluice's CUDA build on one GPU, in minutes, from a bundle built elsewhere.
#
#   ./scripts/gpu-check.sh build [BUNDLE]   # here (no GPU): the cuda binaries, stripped and
#                                           # xz-compressed into BUNDLE (default gpu-bundle/,
#                                           # git-ignored; ~20 MB)
#   ./scripts/gpu-check.sh run [BUNDLE]     # on the GPU machine: prints one table
#
# The run needs the NVIDIA driver (580 or newer) and CUDA 13's cuBLAS, cuRAND, NVRTC and cudart,
# found on LD_LIBRARY_PATH or in the places the lent H100/H200 machines keep them (PyTorch's
# wheels, /usr/local/cuda-13.0); nothing from the network: its models are random-weight
# checkpoints of real shapes that `sluice synth` writes there. Every step runs under `timeout`.
# What it runs:
# - the GPU tests (the CUDA forward against the CPU's, graphs replayed against their eager
#   launches bit for bit, GGUF blocks on the device, device sampling);
# - on the machine's own processor, the CPU batch-invariance test and the kernels' unit tests,
#   each kernel tier that CPU has (AMX where it has it) forced in turn;
# - for each model of SLUICE_GPU_MODELS (SHAPE:FORMAT:WEIGHTS[:baseline], default below),
#   `sluice serve` and a sluice-bench sweep of SLUICE_GPU_LEVELS clients (128-token prompts and
#   outputs, ignore_eos): output tok/s, TTFT p50 and the server's mean step;
# - the same sweep with a baseline bundle's sluice, for the models marked `:baseline`, where
#   SLUICE_GPU_BASELINE names that bundle (paired: same machine, same run), and with
#   `--cuda-graphs off` where SLUICE_GPU_COMPARE_GRAPHS=1;
# - SLUICE_CUDA_PROFILE=200 at SLUICE_GPU_PROFILE_LEVEL clients (default 1), graphs on and off,
#   where SLUICE_GPU_PROFILE=1: where a step's time goes, decode and op-by-op steps apart
#   (SLUICE_CUDA_PROFILE_SYNC=1 in the environment: each phase as its kernels' GPU time); SLUICE_GPU_NCU=1 counts one decode
#   step's kernels with Nsight Compute (`sluice generate`, one row); SLUICE_GPU_NCU_LEVEL=N
#   counts them on the first model's server while N clients decode (a full step's kernels;
#   SLUICE_GPU_NCU_GRAPHS=graph: a replayed graph as one record, its whole time).
# SLUICE_GPU_TESTS=0 skips the tests, SLUICE_GPU_SWEEP=0 the sweeps (the models are still made).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-run}
bundle=${2:-gpu-bundle}

# shellcheck source=scripts/lib/test-binary.sh
. scripts/lib/test-binary.sh

build() {
    env_file=$(./scripts/setup-cuda.sh --link | tail -n 1)
    # shellcheck disable=SC1090
    . "$env_file"
    # Its own target directory: the cuda feature rebuilds candle, which would otherwise evict
    # the CPU build's artefacts.
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target-cuda}
    # The bundle runs on another machine, whose CPU may lack this one's extensions (a
    # sluice-bench built for this CPU died of SIGILL on a lent H200): AVX2-era code, as the
    # container image builds by default.
    export RUSTFLAGS=${RUSTFLAGS:--C target-cpu=x86-64-v3}
    mkdir -p "$bundle"
    cargo build --release --features sluice-server/cuda -p sluice-server -p sluice-bench
    # The GPU tests, and two CPU test binaries for the GPU machine's own processor (another
    # CPU than ours, often with AMX): the batch-invariance test and the kernels' unit tests,
    # each forcing every kernel tier that CPU has. Built with the cuda feature, so that they
    # share the GPU tests' dependencies instead of a second build of candle.
    local gpu_tests cpu_invariance cpu_kernels
    gpu_tests=$(test_binary gpu -p sluice-model --features cuda --test gpu)
    cpu_invariance=$(test_binary batch_invariance -p sluice-model --features cuda \
        --test batch_invariance)
    cpu_kernels=$(test_binary sluice_kernels -p sluice-kernels --features cuda --lib)
    for pair in "sluice:$CARGO_TARGET_DIR/release/sluice" \
        "sluice-bench:$CARGO_TARGET_DIR/release/sluice-bench" "gpu-tests:$gpu_tests" \
        "cpu-invariance:$cpu_invariance" "cpu-kernels:$cpu_kernels"; do
        strip --strip-debug -o "$bundle/${pair%%:*}" "${pair#*:}"
        xz -6 -T2 -f "$bundle/${pair%%:*}"
    done
    ls -la "$bundle"
}

# The CUDA 13 libraries the binaries link, where the GPU machines keep them.
cuda_libs() {
    local dirs=() d
    for d in /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib \
        /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/cuda/lib64; do
        [ -d "$d" ] && dirs+=("$d")
    done
    local IFS=:
    echo "${dirs[*]}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

run() {
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "skipped: no NVIDIA GPU here (nvidia-smi finds none)"
        exit 0
    fi
    LD_LIBRARY_PATH=$(cuda_libs)
    export LD_LIBRARY_PATH
    local gpu work out
    gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)
    work=${SLUICE_GPU_WORK:-/tmp/sluice-gpu}
    out=${SLUICE_GPU_OUT:-$work/results}
    mkdir -p "$work/bin" "$work/models" "$out"
    for bin in sluice sluice-bench gpu-tests cpu-invariance cpu-kernels; do
        [ -f "$bundle/$bin.xz" ] && xz -dc "$bundle/$bin.xz" >"$work/bin/$bin"
    done
    chmod +x "$work/bin/"*
    if [ -n "${SLUICE_GPU_BASELINE:-}" ]; then
        xz -dc "$SLUICE_GPU_BASELINE/sluice.xz" >"$work/bin/sluice-baseline"
        chmod +x "$work/bin/sluice-baseline"
    fi
    echo "## GPU check: $gpu ($(date -u +%FT%TZ))"
    echo

    tests=skipped
    if [ -x "$work/bin/gpu-tests" ] && [ "${SLUICE_GPU_TESTS:-1}" != 0 ]; then
        tests=pass
        # --test-threads 1: the tests share one GPU. The fixture test needs the real SmolLM2
        # file (SLUICE_MODEL) and the fixtures (SLUICE_FIXTURES); skipped where they are absent.
        local skip=()
        [ -f "${SLUICE_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}" ] ||
            skip=(--skip greedy_tokens_agree_with_the_fixtures)
        timeout "${SLUICE_GPU_TEST_TIMEOUT:-180}" "$work/bin/gpu-tests" --test-threads 1 \
            --nocapture "${skip[@]}" >"$out/gpu-tests.log" 2>&1 || tests=FAIL
        echo "GPU tests: $tests"
        grep -E "^test |test result|gap|bitwise|graphs|agreed" "$out/gpu-tests.log" | sed 's/^/    /'
        echo
    fi

    cpu_tests "$work" "$out" || tests=FAIL

    echo "| model | weights | server | clients | output tok/s | TTFT p50 ms | mean step ms |"
    echo "| --- | --- | --- | ---: | ---: | ---: | ---: |"
    local spec
    for spec in ${SLUICE_GPU_MODELS:-smollm2-135m:q4_1:f16:baseline qwen2.5-1.5b:bf16:bf16:baseline qwen2.5-1.5b:q4_k_m:quantized qwen2.5-7b:bf16:bf16 qwen2.5-7b:q4_k_m:quantized}; do
        local shape format weights marks
        IFS=: read -r shape format weights marks <<<"$spec"
        local model="$work/models/$shape-$format.gguf"
        if [ ! -f "$model" ]; then
            timeout 300 "$work/bin/sluice" synth --shape "$shape" --format "$format" \
                --out "$model" >"$out/synth-$shape-$format.log" 2>&1 ||
                { echo "| $shape | $format | synth FAILED | | | | |"; continue; }
        fi
        local tag="$shape-$format-$weights"
        [ "${SLUICE_GPU_SWEEP:-1}" = 0 ] && continue
        if [ -n "${SLUICE_GPU_BASELINE:-}" ] && [ "$marks" = baseline ]; then
            sweep "$out/$tag-baseline" "$work/bin/sluice-baseline" "$model" "$weights" \
                "$shape ($format) | $weights | baseline"
        fi
        if [ "${SLUICE_GPU_COMPARE_GRAPHS:-0}" = 1 ]; then
            sweep "$out/$tag-graphs-off" "$work/bin/sluice" "$model" "$weights" \
                "$shape ($format) | $weights | graphs off" --cuda-graphs off
        fi
        sweep "$out/$tag" "$work/bin/sluice" "$model" "$weights" "$shape ($format) | $weights | sluice"
        if [ "${SLUICE_GPU_PROFILE:-0}" = 1 ]; then
            local graphs
            for graphs in on off; do
                SLUICE_CUDA_PROFILE=200 SLUICE_GPU_LEVELS_ONE=${SLUICE_GPU_PROFILE_LEVEL:-1} sweep "$out/$tag-profile-$graphs" \
                    "$work/bin/sluice" "$model" "$weights" \
                    "$shape ($format) | $weights | profiled, graphs $graphs" --cuda-graphs "$graphs"
                # The last report of each kind of step (decode on a graph, op by op).
                local kind
                for kind in Decode OpByOp; do
                    grep -h "cuda step profile" "$out/$tag-profile-$graphs.serve.log" |
                        grep "kind=$kind" | tail -n 1 |
                        sed 's/^.*cuda step profile/    profile/' || true
                done
            done
        fi
    done
    if [ "${SLUICE_GPU_NCU:-0}" = 1 ]; then
        ncu_launches "$work" "$out"
    fi
    if [ -n "${SLUICE_GPU_NCU_LEVEL:-}" ]; then
        ncu_serve "$work" "$out" "$SLUICE_GPU_NCU_LEVEL"
    fi
    echo
    echo "sweep: sluice-bench --sweep ${SLUICE_GPU_LEVELS:-1,16,64,256} --num-requests 4x --prompt-tokens 128 --output-tokens 128, ignore_eos"
    echo "serve: --kv-cache-memory ${SLUICE_GPU_KV:-40GiB} --max-num-seqs 256 --max-num-batched-tokens 8192"
    [ "$tests" != FAIL ]
}

# cpu_tests WORK OUT: batch invariance on this machine's own processor (the GPU machines' CPUs
# are not ours: AMX, other vector widths), each kernel tier it has forced in turn: the
# bundle's batch-invariance test and the kernels' unit tests. SLUICE_GPU_CPU_TESTS=0 skips.
cpu_tests() {
    local work=$1 out=$2 status=0 cpu flags
    [ -x "$work/bin/cpu-invariance" ] && [ "${SLUICE_GPU_CPU_TESTS:-1}" != 0 ] || return 0
    cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
    flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
        grep -x -E 'avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|amx_tile|amx_int8|amx_bf16' |
        tr '\n' ' ')
    echo "CPU: $cpu, $(nproc) threads; flags: $flags"
    # The invariance test writes its models under the temporary directory.
    if ! (cd "$work" && timeout "${SLUICE_GPU_CPU_TIMEOUT:-300}" "$work/bin/cpu-invariance" \
        --nocapture) >"$out/cpu-invariance.log" 2>&1; then
        status=1
    fi
    echo "CPU batch invariance: $([ $status = 0 ] && echo pass || echo FAIL)"
    grep -E "kernel tiers|invariant on|panicked|differ|test result" "$out/cpu-invariance.log" |
        sed 's/^/    /'
    local kernels=pass
    timeout "${SLUICE_GPU_CPU_TIMEOUT:-300}" "$work/bin/cpu-kernels" --nocapture >"$out/cpu-kernels.log" 2>&1 ||
        { kernels=FAIL; status=1; }
    echo "CPU kernel tests: $kernels ($(grep -c skipped "$out/cpu-kernels.log" || true) lines saying skipped)"
    grep -E "FAILED|panicked|test result|skipped" "$out/cpu-kernels.log" | sed 's/^/    /'
    echo
    return $status
}

# sweep PREFIX BINARY MODEL WEIGHTS LABEL [SERVE FLAGS...]: serves MODEL, runs sluice-bench
# at SLUICE_GPU_LEVELS (or one client) into PREFIX.{csv,md}, prints a row a level, stops it.
sweep() {
    local prefix=$1 bin=$2 model=$3 weights=$4 label=$5
    shift 5
    local levels=${SLUICE_GPU_LEVELS:-1,16,64,256}
    [ -n "${SLUICE_GPU_LEVELS_ONE:-}" ] && levels=$SLUICE_GPU_LEVELS_ONE
    local port=8497
    # From the models' directory: no config/sluice.toml there, so every binary (a baseline
    # too, which may not know today's keys) runs on its defaults and these flags.
    (cd "$(dirname "$model")" && exec "$bin" serve --model "$model" --host 127.0.0.1 \
        --port "$port" --weights "$weights" --kv-cache-memory "${SLUICE_GPU_KV:-40GiB}" \
        --max-num-seqs 256 --max-num-batched-tokens 8192 "$@") >"$prefix.serve.log" 2>&1 &
    local server=$!
    local ready=0
    for _ in $(seq 1 360); do
        if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
            ready=1
            break
        fi
        kill -0 "$server" 2>/dev/null || break
        sleep 0.5
    done
    if [ "$ready" = 1 ]; then
        timeout "${SLUICE_GPU_SWEEP_TIMEOUT:-240}" "$(dirname "$bin")/sluice-bench" \
            --base-url "http://127.0.0.1:$port" --sweep "$levels" --num-requests 4x \
            --prompt-tokens 128 --output-tokens 128 --quiet --csv "$prefix.csv" \
            >"$prefix.md" 2>&1 || echo "| $label | sweep failed ($prefix.md) | | | | |"
        [ -f "$prefix.csv" ] && python3 - "$prefix.csv" "$label" <<'EOF'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    failed = f" ({r['failed']} failed)" if r["failed"] not in ("", "0") else ""
    print(f"| {sys.argv[2]} | {r['concurrency']} | {float(r['output_throughput']):,.0f}{failed} "
          f"| {float(r['ttft_p50_ms']):.1f} | {r['server_step_ms'] or '-'} |")
EOF
    else
        echo "| $label | did not start: $(tail -n 2 "$prefix.serve.log" | tr '\n' ' ') | | | | |"
    fi
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
}

# ncu_launches WORK OUT: the kernels of one decode step of the first model, counted by Nsight
# Compute on `sluice generate` (SLUICE_GPU_NCU_ARGS: more flags for today's sluice, e.g.
# `--cuda-graphs eager` to see the graph's kernels one by one; SLUICE_GPU_NCU_PROMPT: the
# prompt, whose length is the decode step's context), with each one's GPU time.
ncu_launches() {
    local work=$1 out=$2 ncu spec shape format weights marks bin
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1 || true)
    [ -n "$ncu" ] || { echo "ncu: not found"; return; }
    spec=${SLUICE_GPU_MODELS:-smollm2-135m:q4_1:f16}
    IFS=: read -r shape format weights marks <<<"${spec%% *}"
    for bin in sluice-baseline sluice; do
        [ -x "$work/bin/$bin" ] || continue
        local extra=()
        [ "$bin" = sluice ] && read -r -a extra <<<"${SLUICE_GPU_NCU_ARGS:-}"
        # Prefill and the first decode steps are skipped; the next launches are counted.
        timeout 150 "$ncu" --launch-skip "${SLUICE_GPU_NCU_SKIP:-1200}" \
            --launch-count "${SLUICE_GPU_NCU_COUNT:-600}" --metrics gpu__time_duration.sum \
            --csv --page raw "$work/bin/$bin" generate "${extra[@]}" \
            --model "$work/models/$shape-$format.gguf" --weights "$weights" \
            --prompt "${SLUICE_GPU_NCU_PROMPT:-hello there}" --max-tokens 8 --temperature 0 \
            >"$out/ncu-$bin.csv" 2>&1 || true
        echo
        echo "ncu, $bin ${extra[*]}, $shape $format --weights $weights: kernels (count, mean GPU time)"
        python3 scripts/ncu-summary.py "$out/ncu-$bin.csv" | sed 's/^/    /'
    done
}

# ncu_serve WORK OUT CLIENTS: the kernels of full decode steps, counted by Nsight Compute on the
# first model's `sluice serve` while CLIENTS clients decode (`--graph-profiling node`: each
# kernel of a replayed graph is its own record). The first SLUICE_GPU_NCU_SKIP launches
# (default 12000: start-up, the prompts' prefill, the first decode steps) are skipped and the
# next SLUICE_GPU_NCU_COUNT (default 800, two steps of a 28-layer model) counted; the server is
# stopped when the sweep ends, which makes ncu write its records.
ncu_serve() {
    local work=$1 out=$2 clients=$3 ncu spec shape format weights marks
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1 || true)
    [ -n "$ncu" ] || { echo "ncu: not found"; return; }
    spec=${SLUICE_GPU_MODELS:-smollm2-135m:q4_1:f16}
    IFS=: read -r shape format weights marks <<<"${spec%% *}"
    local model="$work/models/$shape-$format.gguf" port=8498
    (cd "$work/models" && exec timeout 400 "$ncu" --target-processes all \
        --graph-profiling "${SLUICE_GPU_NCU_GRAPHS:-node}" \
        --launch-skip "${SLUICE_GPU_NCU_SKIP:-12000}" --launch-count "${SLUICE_GPU_NCU_COUNT:-800}" \
        --metrics gpu__time_duration.sum --csv --page raw "$work/bin/sluice" serve \
        --model "$model" --host 127.0.0.1 --port "$port" --weights "$weights" \
        --kv-cache-memory "${SLUICE_GPU_KV:-40GiB}" --max-num-seqs 256 \
        --max-num-batched-tokens 8192) >"$out/ncu-serve.csv" 2>"$out/ncu-serve.err" &
    local server=$! ready=0
    for _ in $(seq 1 360); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && { ready=1; break; }
        kill -0 "$server" 2>/dev/null || break
        sleep 0.5
    done
    if [ "$ready" = 1 ]; then
        timeout "${SLUICE_GPU_SWEEP_TIMEOUT:-240}" "$work/bin/sluice-bench" \
            --base-url "http://127.0.0.1:$port" --sweep "$clients" \
            --num-requests "${SLUICE_GPU_NCU_REQUESTS:-1x}" --prompt-tokens 128 \
            --output-tokens 128 --quiet >"$out/ncu-serve.md" 2>&1 || true
    fi
    # SIGTERM to the server alone (ncu's child): it drains and exits, then ncu prints.
    pkill -TERM -f "^$work/bin/sluice serve" || true
    wait "$server" 2>/dev/null || true
    echo
    echo "ncu, sluice serve at $clients clients, $shape $format --weights $weights: kernels of decode steps (count, mean GPU time)"
    python3 scripts/ncu-summary.py "$out/ncu-serve.csv" | sed 's/^/    /'
}

case $mode in
    build) build ;;
    run) run ;;
    *) echo "usage: $0 [build|run] [BUNDLE]" >&2; exit 2 ;;
esac
