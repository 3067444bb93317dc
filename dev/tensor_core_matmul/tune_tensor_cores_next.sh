#!/usr/bin/env bash
# Issue 21, session 22: the product's tuner (`istanbul kernels tune`) now covers the
# tensor-core matmuls (nt_w16_sgmat, nn_w16_sgmat, tn_sgmat; until now only dev/tensor_core_matmul/sgmat_sweep.py
# tuned them, for the H200's shipped file). On a GPU without a shipped file (the H100) the
# trainer ran their defaults. This call tunes them at the 124M shapes into a fresh user cache,
# then times the 124M f16 step with the defaults (or the shipped file) and with the fresh
# cache, alternated twice. ~7 minutes. Dawn, robustness off (the trainer's default).
#
#   bash dev/tensor_core_matmul/tune_tensor_cores_next.sh OUTDIR [STEP ...]   (on the GPU machine; default: all)
#
#   tune       istanbul kernels tune --preset 124m --key {nt_w16,nn_w16,tn}_sgmat
#              --no-attention --total-s ${TUNE_TOTAL_S:-240} (the cache goes to OUTDIR/cache)
#   ab         bench/train.py 124m f16 (--no-torch) without, then with OUTDIR/cache, twice
# A failing step does not stop the others; exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/tensor_core_matmul/tune_tensor_cores_next.sh OUTDIR [STEP ...]}"
mkdir -p "$out/cache" "$out/none"
export ISTANBUL_BACKEND=dawn ISTANBUL_DAWN_ROBUSTNESS=off
source dev/device_steps.sh
shift
choose_steps "tune ab" "$@"
wanted tune && step tune 300 env ISTANBUL_AUTOTUNE_DIR="$out/cache" "$py" -m istanbul kernels \
    tune --preset 124m --key nt_w16_sgmat --key nn_w16_sgmat --key tn_sgmat --no-attention \
    --total-s "${TUNE_TOTAL_S:-240}" --out "$out/tune"
for round in 1 2; do
    for cache in none cache; do
        wanted ab && step "ab${round}_${cache}" 120 env ISTANBUL_AUTOTUNE_DIR="$out/$cache" \
            "$py" bench/train.py --out "$out/ab${round}_${cache}" --models 124m --precision f16 \
            --steps 10 --warmup 3 --no-torch
    done
done
exit "$failed"
