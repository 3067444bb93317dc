#!/usr/bin/env bash
# Issue 20, prepared in session 22 (no device time left to run it): does a second thread in
# the GPU process that sends the answers of multi-message rounds (dev/patches/
# gpu_answer_thread.patch) raise the 64 x 64 KB cell? At that cell the one thread spent 22%
# of its time answering and waited for nobody (bench/results/service/service.md, session 22).
# On the dev CPU (2 cores, an Encoding that answers at once: no GPU wait to overlap) it cost
# 7% of the hop's calls/s at 16 callers and improved their p50 by ~10%, and a lone message
# (answered inline) was unchanged (dev/RESULTS.md, session 22). Ship it only if the H200
# says so. ~4 minutes.
#
#   bash dev/h200_answer_thread_next.sh OUTDIR      (on the GPU machine; .device carries uvloop)
#
# The tree as it is (`base`) and a copy with the patch applied (`thread`), alternated twice:
# bench/service.py --workers 12 --gpu-process shared-keep-clock, uvloop servers and clients,
# 1 / 64 / 256 clients x 100 B / 1 KB / 64 KB, 3 s a cell, every reply checked against
# tiktoken. Exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: dev/h200_answer_thread_next.sh OUTDIR}"
mkdir -p "$out"
out=$(realpath "$out")
py=${PYTHON:-python3}
vocab=$(realpath "${VOCAB:-.device/vocab/gpt2.tiktoken}")
export PYTHONUNBUFFERED=1
source dev/device_steps.sh
patched=$(mktemp -d)
tar --exclude=./.device --exclude=./.git --exclude=./.venv -cf - . | tar -xf - -C "$patched"
if command -v git >/dev/null; then
    git -C "$patched" apply dev/patches/gpu_answer_thread.patch
else
    patch -d "$patched" -p1 < dev/patches/gpu_answer_thread.patch
fi || { echo "the patch does not apply to this tree"; exit 9; }
args=(--vocab "$vocab" --workers 12 --gpu-process shared-keep-clock --event-loops uvloop
      --client-loop uvloop --clients 1,64,256 --sizes 100,1024,65536 --duration 3)
for round in 1 2; do
    step "base$round" 120 "$py" bench/service.py --out "$out/base$round" "${args[@]}"
    step "thread$round" 120 env -C "$patched" "$py" bench/service.py --out "$out/thread$round" \
        "${args[@]}"
done
exit "$failed"
