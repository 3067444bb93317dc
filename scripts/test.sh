#!/usr/bin/env bash
# The test suite from a fresh clone: set up with the test extras, then pytest (arguments pass on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,dawn
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
.venv/bin/python -m pytest -q "$@"

# --- Dawn (Tint) as well as wgpu-native (naga): the kernel ladder and the GPU-path tests.
# Dawn runs on the private Mesa 25 lavapipe of scripts/dawn_lavapipe.sh (with its libdrm),
# whose LLVM compiles the big generated kernels 5-20x slower than Mesa 22's: one input
# variant per ladder case (every pipeline compiled and run once; the other variants only
# change shapes) and lighter compiles (GALLIVM_PERF=nopt, 4-wide subgroups) keep it ~4 min.
# Only on a full run: with arguments, test.sh runs just the tests named.
if [ $# -eq 0 ]; then
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
    .venv/bin/python -m pytest -q -p no:cacheprovider -k "not climbs_the_ladder" \
        tests/test_backends.py tests/test_engine.py tests/test_engine_copy.py \
        tests/test_kernels_*.py tests/test_tokenizer_gpu.py
fi
