#!/usr/bin/env bash
# The H200 call for issue 20 that sessions 18 and 19 prepared and could not run (no device):
# the service before (76cdeb4, session 18's code: its UTF-8 messages and raw-id replies in
# the GPU process, asyncio, each worker's batches on a thread) and now (session 19: the
# worker's batches awaited on its event loop, uvloop beside asyncio), in one call; then the
# new code again with the load generator on uvloop too (less client CPU beside the server's:
# does the 16-core host's CPU, not the server, cap 256 x 100 B?) with 8 and 12 workers.
# Session 17's committed table (bench/results/service/service.md) is the reference for
# session 18's change.
# ~6-7 minutes.
#
#   bash dev/h200_service_next.sh OUTDIR     (on the GPU machine; .device carries uvloop)
#
#   before    the old code's bench/service.py (BEFORE_TGZ, a `git archive` of 76cdeb4's
#             product and bench; skipped when absent), --workers 8 --gpu-process
#             shared-keep-clock
#   loops     this code's, --event-loops asyncio,uvloop (clients on asyncio as before)
#   clients   --event-loops uvloop --client-loop uvloop, --workers 8 and 12 (more request
#             handling cores, if the leaner clients leave them free)
# Every reply is checked against tiktoken in each. Exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: dev/h200_service_next.sh OUTDIR}"
mkdir -p "$out"
out=$(realpath "$out")
py=${PYTHON:-python3}
vocab=$(realpath "${VOCAB:-.device/vocab/gpt2.tiktoken}")
export PYTHONUNBUFFERED=1
source dev/device_steps.sh
"$py" -c "import uvloop" || { echo "uvloop is missing: carry its wheel in .device/whl"; exit 9; }
before=${BEFORE_TGZ:-.device/before_76cdeb4.tgz}
if [ -f "$before" ]; then
    old=$(mktemp -d)
    tar -xzf "$before" -C "$old"
    step before 200 env -C "$old" "$py" bench/service.py --out "$out/before" \
        --vocab "$vocab" --workers 8 --gpu-process shared-keep-clock
fi
step loops 330 "$py" bench/service.py --out "$out/loops" --vocab "$vocab" --workers 8 \
    --gpu-process shared-keep-clock --event-loops asyncio,uvloop
step clients 260 "$py" bench/service.py --out "$out/clients" --vocab "$vocab" --workers 8,12 \
    --gpu-process shared-keep-clock --event-loops uvloop --client-loop uvloop
exit "$failed"
