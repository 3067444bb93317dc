#!/usr/bin/env bash
# Issue 49, session 30 (not yet run on a GPU): the retune the 16-byte staging needs, checked
# and measured in one call. The shipped tuned files were picked for the old scalar-store
# staging; the tuner now also offers one-stage slices of BK 64 and checks each winner
# against numpy before keeping it. ~9 minutes on an H100; Dawn, robustness off (the
# trainer's default).
#
#   bash dev/tensor_core_matmul/retune_staging16_next.sh OUTDIR [STEP ...]   (on the GPU machine; default: all)
#
#   tune       istanbul kernels tune --key {nt_w16,nn_w16,tn}_sgmat --no-attention
#              --total-s ${TUNE_TOTAL_S:-170} into OUTDIR/cache (copy OUTDIR/tune's adapter
#              file over shaders/tuned/<adapter>.json to ship it)
#   check      staging16.py --quick with OUTDIR/cache: the configurations the trainer now runs
#              at the 15 products checked against numpy and timed beside a BK 32 sweep
#   ab         bench/train.py 124m f16 B 8 (--torch none) with the shipped file, then OUTDIR/cache,
#              twice alternated (the step's ms and per-kernel table)
#   train      bench/train.py --batch 8,16 --torch user with OUTDIR/cache: the issue's table
#              (istanbul beside PyTorch as a user writes it, eager and torch.compile)
# A failing step does not stop the others; exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/tensor_core_matmul/retune_staging16_next.sh OUTDIR [STEP ...]}"
mkdir -p "$out/cache" "$out/none"
export ISTANBUL_BACKEND=dawn ISTANBUL_DAWN_ROBUSTNESS=off
source dev/device_steps.sh
shift
choose_steps "tune check ab train" "$@"
commit=(${COMMIT:+--commit "$COMMIT"})
wanted tune && step tune 220 env ISTANBUL_AUTOTUNE_DIR="$out/cache" "$py" -m istanbul kernels \
    tune --key nt_w16_sgmat --key nn_w16_sgmat --key tn_sgmat --no-attention \
    --total-s "${TUNE_TOTAL_S:-170}" --out "$out/tune"
wanted check && step check 90 env ISTANBUL_AUTOTUNE_DIR="$out/cache" "$py" \
    dev/tensor_core_matmul/staging16.py --quick --budget-s 30 --out "$out/staging16.json"
for round in 1 2; do
    for cache in none cache; do
        wanted ab && step "ab${round}_${cache}" 60 env ISTANBUL_AUTOTUNE_DIR="$out/$cache" \
            "$py" bench/train.py --out "$out/ab${round}_${cache}" --models 124m --precision f16 \
            --batch 8 --steps 10 --warmup 3 --torch none "${commit[@]}"
    done
done
wanted train && step train 300 env ISTANBUL_AUTOTUNE_DIR="$out/cache" "$py" bench/train.py \
    --batch 8,16 --torch user --rounds 2 --steps 8 --out "$out/train" "${commit[@]}"
exit "$failed"
