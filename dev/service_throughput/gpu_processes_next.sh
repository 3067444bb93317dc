#!/usr/bin/env bash
# Issue 20, session 26: several shared GPU processes (`istanbul serve --gpu-processes G`,
# worker k batching through process k mod G). At 64 KB requests the one GPU process's Python
# thread was what the workers waited for (its thread busy 0.97 of a core, the GPU 0.48,
# bench/results/h200/service.md). ~3 minutes per step on the GPU machine. (Session 26's
# call also ran a `local` step: 0bf3344's $ISTANBUL_LOCAL_LONE_BYTES, retired since.)
#
#   bash dev/service_throughput/gpu_processes_next.sh OUTDIR [ab] [service]
#
#   ab       bench/service.py's issue-20 cells, 12 workers, with 1, 2 and 3 GPU processes
#            (shared-keep-clock, -x2, -x3, or $AB_LAYOUTS), uvloop
#   service  every default cell with $LAYOUTS (default shared-keep-clock-x2,shared-keep-clock)
#            (the committed table)
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/service_throughput/gpu_processes_next.sh OUTDIR [steps]}"
vocab=$(realpath "${VOCAB:-.device/vocab/gpt2.tiktoken}")
source dev/device_steps.sh
shift
choose_steps "ab service" "$@"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
common=(--vocab "$vocab" --workers 12 --event-loops uvloop --client-loop uvloop --duration 3)
wanted ab && step ab 400 "$py" bench/service.py --out "$out/ab" "${common[@]}" \
    --gpu-process "${AB_LAYOUTS:-shared-keep-clock,shared-keep-clock-x2,shared-keep-clock-x3}" \
    --clients 1,64,256 --sizes 100,1024,65536
wanted service && step service 400 "$py" bench/service.py --out "$out/service" "${common[@]}" \
    --gpu-process "${LAYOUTS:-shared-keep-clock-x2,shared-keep-clock}"
exit "$failed"
