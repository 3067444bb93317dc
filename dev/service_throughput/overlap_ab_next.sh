#!/usr/bin/env bash
# Issue 20, session 24: the shared GPU process overlapping a round's GPU time with its other
# work (gpu_host.GpuHost.overlap: each UTF-8 encode call is begun, i.e. submitted, and
# answered in the loop's next pass, after the next round's call is submitted; a twin encoder
# takes every other call). At 64 x 64 KB the one thread was the limit, a third of its time
# waiting for the GPU (session 22, bench/results/h200/service.md). The tree with it on
# (the default) and off ($ISTANBUL_GPU_OVERLAP=0), alternated twice; every reply checked
# against tiktoken. ~4 minutes.
#
#   bash dev/service_throughput/overlap_ab_next.sh OUTDIR      (on the GPU machine; .device carries uvloop)
#
# bench/service.py --workers 12 --gpu-process shared-keep-clock, uvloop servers and clients,
# 1 / 64 / 256 clients x 100 B / 1 KB / 64 KB, 3 s a cell. Exit status: failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/service_throughput/overlap_ab_next.sh OUTDIR}"
vocab=$(realpath "${VOCAB:-.device/vocab/gpt2.tiktoken}")
source dev/device_steps.sh
args=(--vocab "$vocab" --workers 12 --gpu-process shared-keep-clock --event-loops uvloop
      --client-loop uvloop --clients 1,64,256 --sizes 100,1024,65536 --duration 3)
for round in 1 2; do
    step "on$round" 120 env ISTANBUL_GPU_OVERLAP=1 "$py" bench/service.py --out "$out/on$round" \
        "${args[@]}"
    step "off$round" 120 env ISTANBUL_GPU_OVERLAP=0 "$py" bench/service.py \
        --out "$out/off$round" "${args[@]}"
done
exit "$failed"
