#!/usr/bin/env bash
# Issue 21, session 26: the tensor-core matmuls with their f16 operands staged as 16 x 16
# tiles by subgroup-matrix loads and stores ("-m", 03_linear_sgmat.wgsl's MATA / MATB) instead
# of vec4 loads and scalar f16 stores. Dawn, robustness off (the trainer's default). ~8 min.
#
#   bash dev/sgmat_copy_next.sh OUTDIR [ladder] [ab] [step] [gpuhost]   (GPU machine)
#
#   ladder   the ladder's tensor-core matmul rungs (the _copy ones beside the shipped kernels)
#   ab       dev/sgmat_copy_ab.py: a battery of -m against numpy, then each 124M product at
#            the trainer's configuration with and without -m, alternated twice; writes
#            OUTDIR/ab/cache, the shipped tuned file with -m where it won
#   step     bench/train.py 124m f16 (--no-torch): the shipped file, then OUTDIR/ab/cache,
#            alternated twice
#   gpuhost  tests/test_service_gpu_host.py five times under Dawn (session 25's crash: Dawn
#            devices now ask for implicit-device-synchronization)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: dev/sgmat_copy_next.sh OUTDIR [steps]}"
export ISTANBUL_BACKEND=dawn ISTANBUL_DAWN_ROBUSTNESS=off
source dev/device_steps.sh
shift
choose_steps "ladder ab step gpuhost" "$@"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
wanted ladder && step ladder 240 "$py" -m istanbul kernels check --require-gpu \
    --kernel matmul_ --json "$out/ladder.json"
wanted ab && step ab 300 "$py" dev/sgmat_copy_ab.py --out "$out/ab"
mkdir -p "$out/none"
for round in 1 2; do
    for cache in none ab/cache; do
        tag=${cache%%/*}
        wanted step && [[ -d "$out/$cache" ]] && step "step${round}_${tag}" 120 env \
            ISTANBUL_AUTOTUNE_DIR="$out/$cache" "$py" bench/train.py \
            --out "$out/step${round}_${tag}" --models 124m --precision f16 --steps 10 \
            --warmup 3 --no-torch
    done
done
for run in 1 2 3 4 5; do
    wanted gpuhost && step "gpuhost$run" 120 "$py" -m pytest -q -p no:cacheprovider \
        tests/test_service_gpu_host.py
done
exit "$failed"
