#!/usr/bin/env bash
# Issue 49, session 35 (not yet run on a GPU: no device started this session): do raster
# bands (-g8) and 16-byte f16 reads (-v16) speed the tensor-core matmuls and the 124M f16
# step, and do 256-invocation workgroups (two per SM, if the registers allow) hide the slice
# staging? ~6 minutes on an H100; Dawn, robustness off (the trainer's default).
#
#   bash dev/tensor_core_matmul/global_loads_next.sh OUTDIR [STEP ...]   (on the GPU machine; default: all)
#
#   knobs      sgmat_ablation.py --only base --a16 --extra +g8,+v16,+g8-v16: each product's
#              shipped configuration beside the same with the knobs (A f32 and A f16)
#   ab         bench/train.py 124m f16 B 8 (--torch none) with the shipped file and with
#              suffix_cache.py's copy of it with -g8-v16 on every tensor-core entry, twice
#              alternated (the step's ms and per-kernel table)
#   occupancy  sgmat_ablation.py --only base,stage_only with sg2x4-t2x4, sg2x4-t4x4 and
#              sg4x2-t2x4 (256 invocations) beside the shipped 512-invocation configuration
# A failing step does not stop the others; exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/tensor_core_matmul/global_loads_next.sh OUTDIR [STEP ...]}"
export ISTANBUL_BACKEND=dawn ISTANBUL_DAWN_ROBUSTNESS=off
source dev/device_steps.sh
shift
choose_steps "knobs ab occupancy" "$@"
here=dev/tensor_core_matmul
wanted knobs && step knobs 200 "$py" $here/sgmat_ablation.py --out "$out/knobs" --warm-s 1.0 \
    --a16 --extra +g8,+v16,+g8-v16 --only base
if wanted ab; then
    mkdir -p "$out/none"
    step suffix 60 "$py" $here/suffix_cache.py --out "$out/g8v16" --suffix g8-v16
    for round in 1 2; do
        for cache in none g8v16; do
            step "ab${round}_${cache}" 90 env ISTANBUL_AUTOTUNE_DIR="$out/$cache" "$py" \
                bench/train.py --out "$out/ab${round}_${cache}" --models 124m --precision f16 \
                --batch 8 --steps 10 --warmup 3 --torch none
        done
    done
fi
wanted occupancy && step occupancy 200 "$py" $here/sgmat_ablation.py --out "$out/occupancy" \
    --warm-s 1.0 --only base,stage_only \
    --extra sg2x4-t2x4-k32-p8-s1-b1,sg2x4-t4x4-k32-p8-s1-b1,sg4x2-t2x4-k32-p8-s1-b1
exit "$failed"
