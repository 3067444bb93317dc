#!/usr/bin/env bash
# The next H200 call for issue 20 (prepared in session 21, no device then): the service of
# 108e184 (session 20's end) and of now (session 21: the workers' own Python per request cut
# -4% / -12% on the dev CPU; the GPU process's thread reports its wall time by phase and its
# CPU), interleaved twice in one call so the machine's drift shows, all with 12 workers, the
# shared GPU process keeping the clock, uvloop servers and clients. The new columns (the GPU
# process's thread: wait / receive / round / answer shares) say whether a 64 KB round waits
# for the workers or the workers for the round: the next step (receiving while the GPU
# works) only pays in the second case.
# ~9 minutes for all four steps; give two calls two steps each if the limit is 10 minutes.
#
#   git archive 108e184 | gzip > .device/before_108e184.tgz     (here, before the call)
#   bash dev/service_throughput/h200_service_next.sh OUTDIR [STEP ...]     (on the GPU machine; .device carries
#                                                        uvloop; default: all four steps)
#
#   before1, now1, before2, now2   bench/service.py --workers 12 --gpu-process
#             shared-keep-clock --event-loops uvloop --client-loop uvloop, every default cell
#             (the `before` steps from BEFORE_TGZ; skipped when it is absent)
# Every reply is checked against tiktoken in each. Exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/service_throughput/h200_service_next.sh OUTDIR [STEP ...]}"
vocab=$(realpath "${VOCAB:-.device/vocab/gpt2.tiktoken}")
source dev/device_steps.sh
shift
choose_steps "before1 now1 before2 now2" "$@"
"$py" -c "import uvloop" || { echo "uvloop is missing: carry its wheel in .device/whl"; exit 9; }
before=${BEFORE_TGZ:-.device/before_108e184.tgz}
old=""
if [ -f "$before" ]; then
    old=$(mktemp -d)
    tar -xzf "$before" -C "$old"
fi
args=(--vocab "$vocab" --workers 12 --gpu-process shared-keep-clock --event-loops uvloop
      --client-loop uvloop)
for round in 1 2; do
    if wanted "before$round" && [ -n "$old" ]; then
        step "before$round" 280 env -C "$old" "$py" bench/service.py --out "$out/before$round" \
            "${args[@]}"
    fi
    wanted "now$round" && step "now$round" 280 "$py" bench/service.py --out "$out/now$round" \
        "${args[@]}"
done
exit "$failed"
