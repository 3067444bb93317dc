#!/usr/bin/env bash
# Issue 20, session 26: several shared GPU processes (`istanbul serve --gpu-processes G`,
# worker k batching through process k mod G). At 64 KB requests the one GPU process's Python
# thread was what the workers waited for (its thread busy 0.97 of a core, the GPU 0.48,
# bench/results/service/service.md). ~7 minutes on the GPU machine.
#
#   bash dev/gpu_processes_next.sh OUTDIR [ab] [local] [service]
#
#   ab       bench/service.py's issue-20 cells, 12 workers, with 1, 2 and 3 GPU processes
#            (shared-keep-clock, -x2, -x3, or $AB_LAYOUTS), uvloop
#   local    a lone small batch encoded on the worker's own device ($ISTANBUL_LOCAL_LONE_BYTES
#            4096) or through the GPU process (0), alternated ($LOCAL_ROUNDS, default 2
#            rounds), 1 / 64 / 256 clients of 100 B and 1 KB
#   service  every default cell with $LAYOUTS (default shared-keep-clock-x2,shared-keep-clock)
#            and $ISTANBUL_LOCAL_LONE_BYTES as given (the committed table)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: dev/gpu_processes_next.sh OUTDIR [steps]}"
vocab=$(realpath "${VOCAB:-.device/vocab/gpt2.tiktoken}")
source dev/device_steps.sh
shift
choose_steps "ab local" "$@"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
common=(--vocab "$vocab" --workers 12 --event-loops uvloop --client-loop uvloop --duration 3)
wanted ab && step ab 400 "$py" bench/service.py --out "$out/ab" "${common[@]}" \
    --gpu-process "${AB_LAYOUTS:-shared-keep-clock,shared-keep-clock-x2,shared-keep-clock-x3}" \
    --clients 1,64,256 --sizes 100,1024,65536
for round in $(seq 1 "${LOCAL_ROUNDS:-2}"); do
    for lone in 0 4096; do
        wanted local && step "local${round}_$lone" 150 env ISTANBUL_LOCAL_LONE_BYTES=$lone \
            "$py" bench/service.py --out "$out/local/r${round}_$lone" "${common[@]}" \
            --gpu-process shared-keep-clock --clients 1,64,256 --sizes 100,1024
    done
done
wanted service && step service 400 "$py" bench/service.py --out "$out/service" "${common[@]}" \
    --gpu-process "${LAYOUTS:-shared-keep-clock-x2,shared-keep-clock}"
exit "$failed"
