#!/usr/bin/env bash
# The test suite from a fresh clone: set up with the test extras, then pytest (arguments pass on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,dawn
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"

# --- Headless Chromium for the dashboard's browser tests (marker `browser`, driven by
# Playwright, which never downloads a browser): Debian's chromium and chromium-driver,
# installed when missing and root (or sudo) is at hand. Without them those tests skip, unless
# ISTANBUL_REQUIRE_BROWSER=1 (CI), which makes that a failure.
if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; then
        sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
        $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            chromium chromium-driver >/dev/null
    else
        echo "note: no chromium (needs root to install); the dashboard's browser tests will skip" >&2
    fi
fi

if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q

# --- Redis servers: the Redis-backed tests (marker `redis`) once more, against the system's
# redis-server (Debian's packaged Redis 7), installed when missing. The whole suite above ran
# against the embedded default's binary. ISTANBUL_REQUIRE_SYSTEM_REDIS=1 (CI) makes a missing
# server an error instead of a skip.
if ! command -v redis-server >/dev/null; then
    if [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; then
        sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
        $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            redis-server >/dev/null
    fi
fi
if command -v redis-server >/dev/null; then
    ISTANBUL_TEST_REDIS=system .venv/bin/python -m pytest -q -m redis
elif [ "${ISTANBUL_REQUIRE_SYSTEM_REDIS:-0}" = 1 ]; then
    echo "error: no redis-server to run the Redis-backed tests against (apt-get install redis-server)" >&2
    exit 1
else
    echo "note: no system redis-server (needs root to install); Redis-backed tests ran against the embedded one only" >&2
fi

# --- Dawn (Tint) as well as wgpu-native (naga): the kernel ladder and the GPU-path tests.
# Dawn runs on the private Mesa 25 lavapipe of scripts/dawn_lavapipe.sh (with its libdrm),
# whose LLVM compiles the big expanded kernels 5-20x slower than Mesa 22's: one input
# variant per ladder case (every pipeline compiled and run once; the other variants only
# change shapes) and lighter compiles (GALLIVM_PERF=nopt, 4-wide subgroups) keep it ~4 min.
lvp_dir="$(ls -d "$PWD"/.venv/mesa-backports/root/usr/lib/*-linux-gnu 2>/dev/null | head -1)"
export ISTANBUL_BACKEND=dawn GALLIVM_PERF=nopt LP_NATIVE_VECTOR_WIDTH=128 \
    LD_LIBRARY_PATH="$lvp_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log=.venv/kernels_check_dawn.log
if ! .venv/bin/istanbul kernels check --max-variants 1 > "$log" 2>&1; then
    grep -E "FAIL|Error" "$log" | head -40 >&2
    echo "error: kernels check under Dawn failed; the whole output is in $log" >&2
    exit 1
fi
tail -1 "$log"
# The tensor-core kernels (subgroup matrices: lavapipe has none) with the matrices emulated in
# plain WGSL (shaders/sgmat_emulation.py): each *_sgmat* rung against its reference, exact
# and slow; where a kernel needs more than lavapipe's 32 KiB of workgroup memory, matmul
# rungs run smaller tiles of the same flags and attention variants are skipped (~5 min).
log=.venv/kernels_check_sgmat_emulated.log
if ! .venv/bin/istanbul kernels check --emulate-subgroup-matrix --max-variants 1 > "$log" 2>&1; then
    grep -E "FAIL|Error" "$log" | head -40 >&2
    echo "error: the emulated tensor-core kernels failed under Dawn; the whole output is in $log" >&2
    exit 1
fi
tail -1 "$log"
.venv/bin/python -m pytest -q -p no:cacheprovider -k "not climbs_the_ladder" \
    tests/test_backends.py tests/test_engine.py tests/test_engine_copy.py tests/test_autotune_sgmat.py \
    tests/test_kernels_*.py tests/test_tokenizer_gpu.py tests/test_tokenizer_pipeline.py \
    tests/test_tokenizer_decode.py tests/test_vocab_train_gpu.py tests/test_vocab_train_gpu_corpus.py
