#!/usr/bin/env bash
# The CPU tests on an AVX2-only processor, emulated: no development host here lacks AVX-512,
# and forcing the AVX2 tier on one (what the tests do on every CPU) checks the kernel choice,
# not the compiler's code for a CPU without AVX-512. This builds the kernels' unit tests and the
# batch-invariance test for x86-64-v3 (AVX2, FMA, F16C; no AVX-512) and runs them under
# `qemu-x86_64 -cpu Haswell-v4`, whose CPUID reports AVX2 and no AVX-512: the kernels then
# find only the AVX2 tier, as on such a CPU. QEMU computes FMA fused, as the hardware does.
#
#   ./scripts/avx2-check.sh
#
# Needs qemu-user 7.2 or newer (AVX2 in its emulator; Debian: apt-get install qemu-user).
# Emulation is slow (the full invariance test would take hours), so the invariance test runs
# the cases of SLUICE_INVARIANCE_CASES, by default each format our models ship under the default
# `auto`; set it to run others (see crates/sluice-model/tests/batch_invariance.rs). The build
# goes to target/x86-64-v3. Each run is under `timeout` (AVX2_CHECK_TIMEOUT seconds, 3600).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v qemu-x86_64 >/dev/null; then
    echo "avx2-check: needs qemu-x86_64 (qemu-user 7.2 or newer)" >&2
    exit 1
fi
export SLUICE_INVARIANCE_CASES=${SLUICE_INVARIANCE_CASES:-F32:auto,Q4_1:auto,Q5_0:auto,Q8_0:auto,Q4K:auto,Q6K:auto}
limit=${AVX2_CHECK_TIMEOUT:-3600}

# shellcheck source=scripts/lib/test-binary.sh
. scripts/lib/test-binary.sh
export RUSTFLAGS="-C target-cpu=x86-64-v3" CARGO_TARGET_DIR=target/x86-64-v3

kernels=$(test_binary sluice_kernels -p sluice-kernels --lib)
invariance=$(test_binary batch_invariance -p sluice-model --test batch_invariance)
# The kernels' tests of the CPU (`cpu::`; the CUDA plan's host-side tests are the same on every
# CPU), then the invariance test, printing this CPU's kernel tiers and each case it ran.
for run in "$kernels cpu::" "$invariance --nocapture"; do
    echo "== $(basename "${run%% *}") on an emulated Haswell (AVX2, no AVX-512)"
    # QEMU warns once per thread about CPUID bits it does not emulate (pcid, x2apic...).
    # shellcheck disable=SC2086 # the binary and its filter
    timeout "$limit" qemu-x86_64 -cpu Haswell-v4 $run --test-threads 2 2>&1 |
        grep -v "TCG doesn't support requested feature"
done
