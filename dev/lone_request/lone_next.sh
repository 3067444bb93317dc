#!/usr/bin/env bash
# Issue 20, session 25: where a lone 1 KB request's time goes on the GPU machine, moment by
# moment (dev/lone_request/lone_trace.py), with the clock keeper that no longer waits for its spins (the
# tree) against the one that did (keeper-blocking) and the staging map waited for by polling
# (map-spin), alternated twice; the gRPC floor of that host; and the GPU tests of the code
# this session touched (Dawn, robustness off as the trainer runs). ~5 minutes.
#
#   bash dev/lone_request/lone_next.sh OUTDIR [pytest] [pytest_wgpu] [trace] [ab] [service]  (GPU machine)
#
# ab: the service's cells, this tree against the code before it, alternated twice.
# service: bench/service.py's every default cell in its best configuration (the table).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/lone_request/lone_next.sh OUTDIR [steps]}"
vocab=$(realpath "${VOCAB:-.device/vocab/gpt2.tiktoken}")
source dev/device_steps.sh
shift
choose_steps "pytest trace service" "$@"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
wanted pytest && step pytest 300 env ISTANBUL_BACKEND=dawn ISTANBUL_DAWN_ROBUSTNESS=off \
    "$py" -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py \
    tests/test_begun_calls.py tests/test_service_gpu_host.py tests/test_engine.py \
    tests/test_resume.py
wanted pytest_wgpu && step pytest_wgpu 200 env ISTANBUL_BACKEND=wgpu "$py" -m pytest -q \
    -p no:cacheprovider tests/test_service_gpu_host.py tests/test_engine.py \
    tests/test_begun_calls.py
wanted trace && step trace 400 "$py" dev/lone_request/lone_trace.py --out "$out/trace" --vocab "$vocab" \
    --workers 12 --calls 2000 --warmup 300 --variants base,before,keeper-blocking,map-block,wgpu --rounds 2
# ab: bench/service.py's issue-20 cells, the tree against the code before this session (the
# keeper waiting for each spin, the staging map not polled: dev/lone_request/lone_trace_hook's patches),
# alternated twice
ab_args=(--vocab "$vocab" --workers 12 --gpu-process shared-keep-clock --event-loops uvloop
         --client-loop uvloop --clients 1,64,256 --sizes 100,1024,65536 --duration 3)
hook="$PWD/dev/lone_trace_hook"
for round in 1 2; do
    wanted ab && step "ab_after$round" 150 "$py" bench/service.py --out "$out/ab/after$round" \
        "${ab_args[@]}"
    wanted ab && step "ab_before$round" 150 env PYTHONPATH="$hook:$PYTHONPATH" \
        ISTANBUL_LONE_TRACE_KEEPER=blocking ISTANBUL_LONE_TRACE_MAP=block "$py" \
        bench/service.py --out "$out/ab/before$round" "${ab_args[@]}"
done
wanted service && step service 300 "$py" bench/service.py --out "$out/service" \
    --vocab "$vocab" --workers 12 --gpu-process shared-keep-clock --event-loops uvloop \
    --client-loop uvloop --duration 3
exit "$failed"
