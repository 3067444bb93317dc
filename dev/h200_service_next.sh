#!/usr/bin/env bash
# The H200 call for issue 20 that sessions 18 and 19 prepared and could not run (no device):
# the service with the GPU process's UTF-8 messages and raw-id replies (session 18) and each
# server process on uvloop beside asyncio (session 19), old and new in one run; then the best
# server loop again with the load generator on uvloop (less client CPU beside the server's:
# does the 16-core host's CPU, not the server, cap 256 x 100 B?). ~6 minutes.
#
#   bash dev/h200_service_next.sh OUTDIR     (on the GPU machine; .device carries uvloop)
#
#   loops     bench/service.py --workers 8 --gpu-process shared-keep-clock
#             --event-loops asyncio,uvloop (clients on asyncio, as every earlier table)
#   clients   the same with --event-loops uvloop --client-loop uvloop
# Every reply is checked against tiktoken in both. Exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: dev/h200_service_next.sh OUTDIR}"
mkdir -p "$out"
py=${PYTHON:-python3}
vocab=${VOCAB:-.device/vocab/gpt2.tiktoken}
export PYTHONUNBUFFERED=1
failed=0
step() {   # name, time limit (s), command...
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    if ! timeout "$limit" "$@" > "$out/$name.txt" 2>&1; then
        failed=$((failed + 1))
        echo "   failed: $out/$name.txt"
    fi
    tail -4 "$out/$name.txt"
}
"$py" -c "import uvloop" || { echo "uvloop is missing: carry its wheel in .device/whl"; exit 9; }
step loops 330 "$py" bench/service.py --out "$out/loops" --vocab "$vocab" --workers 8 \
    --gpu-process shared-keep-clock --event-loops asyncio,uvloop
step clients 200 "$py" bench/service.py --out "$out/clients" --vocab "$vocab" --workers 8 \
    --gpu-process shared-keep-clock --event-loops uvloop --client-loop uvloop
exit "$failed"
