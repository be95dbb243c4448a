#!/usr/bin/env bash
# Installs the pinned CUDA 13.0 toolkit from PyPI wheels (docs/gpu.md) into a cached
# virtual environment and writes the environment that builds with `--features cuda` need.
#
#   ./scripts/setup-cuda.sh            # nvcc, ptxas, headers: enough for `cargo clippy/check`
#   ./scripts/setup-cuda.sh --link     # also cuBLAS, cuRAND, NVRTC and a stub libcuda.so, so
#                                      # CUDA binaries link here (they run only on a GPU machine)
#   . "$(./scripts/setup-cuda.sh --print-env-file)"   # then build
#
# Idempotent: pip runs only when the pinned requirements changed. The cache lives in
# $SLUICE_CUDA_HOME (default $HOME/.cache/sluice-cuda). Prints the env file's path last.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${SLUICE_CUDA_HOME:-$HOME/.cache/sluice-cuda}
env_file=$prefix/env.sh
link=0
for arg in "$@"; do
    case $arg in
        --link) link=1 ;;
        --print-env-file) echo "$env_file"; exit 0 ;;
        *) echo "usage: $0 [--link] [--print-env-file]" >&2; exit 2 ;;
    esac
done

if [ ! -x "$prefix/bin/python" ]; then
    python3 -m venv "$prefix"
fi
install_pinned() { # requirements file, stamp name
    local stamp=$prefix/.$2
    if ! cmp -s "$1" "$stamp"; then
        "$prefix/bin/python" -m pip install --quiet --disable-pip-version-check -r "$1"
        cp "$1" "$stamp"
    fi
}
install_pinned scripts/cuda-requirements.txt toolkit-requirements
cu=$("$prefix/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')

if [ "$link" = 1 ]; then
    install_pinned scripts/cuda-link-requirements.txt link-requirements
    # The wheels ship versioned sonames only (libcublas.so.13); the linker looks for libX.so.
    for lib in "$cu"/lib/lib*.so.*; do
        base=${lib%%.so.*}.so
        [ -e "$base" ] || ln -s "$(basename "$lib")" "$base"
    done
    # No driver here: a stub libcuda.so defining every driver API name of the toolkit's cuda.h
    # (what cudarc's bindings declare) lets binaries link. Its soname is the real driver's,
    # libcuda.so.1, so a binary linked against it loads the driver where one is installed.
    stub_dir=$prefix/stub
    if [ ! -e "$stub_dir/libcuda.so" ]; then
        mkdir -p "$stub_dir"
        grep -oE '\bcu[A-Z][A-Za-z0-9_]*\b' "$cu/include/cuda.h" | sort -u \
            | sed 's/.*/void &(void) {}/' > "$stub_dir/stub.c"
        cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub_dir/libcuda.so" "$stub_dir/stub.c"
    fi
fi

{
    echo "# Written by scripts/setup-cuda.sh: source it before building with --features cuda."
    echo "export PATH=\"$cu/bin:\$PATH\""
    echo "export CUDA_HOME=\"$cu\" CUDA_PATH=\"$cu\""
    # No GPU to detect: Hopper, as on the lent H100/H200 (candle-kernels makes 90 into sm_90a).
    echo "export CUDA_COMPUTE_CAP=90"
    # candle-kernels' nvcc jobs: one per core of the 2-core CI machine.
    echo "export CUDAFORGE_THREADS=\${CUDAFORGE_THREADS:-2}"
    if [ "$link" = 1 ]; then
        echo "export LIBRARY_PATH=\"$cu/lib:$prefix/stub\${LIBRARY_PATH:+:\$LIBRARY_PATH}\""
    fi
} > "$env_file.tmp"
mv "$env_file.tmp" "$env_file"
# shellcheck disable=SC1090
. "$env_file"
nvcc --version | tail -n 2 >&2
echo "$env_file"
