#!/usr/bin/env bash
# The test suite from a fresh clone: set up with the test extras, then pytest (arguments pass on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,dawn
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
.venv/bin/python -m pytest -q "$@"

# --- Dawn (Tint) as well as wgpu-native (naga): the kernel ladder and the GPU-path tests.
# Dawn runs on the private Mesa 25 lavapipe of scripts/dawn_lavapipe.sh (its libdrm too).
if [ $# -eq 0 ]; then
    lvp_dir="$(ls -d .venv/mesa-backports/root/usr/lib/*-linux-gnu 2>/dev/null | head -1)"
    export ISTANBUL_BACKEND=dawn LD_LIBRARY_PATH="$PWD/$lvp_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    .venv/bin/istanbul kernels check --json .venv/kernels_check_dawn.json > /dev/null \
        || { echo "kernels check under Dawn failed: see .venv/kernels_check_dawn.json" >&2; exit 1; }
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_backends.py tests/test_engine.py \
        tests/test_kernels_*.py tests/test_tokenizer_gpu.py
fi
