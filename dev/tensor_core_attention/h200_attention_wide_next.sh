#!/usr/bin/env bash
# Issue 21, session 23: the wide backward kernels (attention_backward_dq_sgmat2w and
# attention_backward_dkv_sgmat2w, 128 rows a workgroup: each staged tile of the other operand
# serves twice the rows) on the H200. dK/dV and dQ were the step's largest attention kernels
# (7.8 and 4.6 ms of 61.6 in round 14, ~40 TFLOP/s). Dawn, robustness off (the trainer's
# default).
#
#   bash dev/tensor_core_attention/h200_attention_wide_next.sh OUTDIR [STEP ...]   (on the GPU machine; default:
#   ladder timing ab)
#
#   ladder   the wide kernels' rungs ("w8", "w4x2", their 64-row form "w4", the trainer's
#            f16-input pairs) and the shipped sgmat2 backward rungs beside them
#   timing   dev/tensor_core_attention/attention_ablation.py: the trainer's attention with f16 q, k, v and each
#            pair of backward kernels, GPU timestamps per kernel in interleaved rounds
#   ab       bench/train.py 124m f16 (istanbul only) with $ISTANBUL_ATTENTION_DQ and _DKV
#            both base (the shipped kernels), w8, w4x2, one after the other
#   train    bench/train.py 124m f16 beside PyTorch with dq $DQ and dkv $DKV (default w8)
#   parity   bench/train_parity.py f16 vs PyTorch fp16, 100 steps, with the same
# A failing step does not stop the others; exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/tensor_core_attention/h200_attention_wide_next.sh OUTDIR [STEP ...]}"
export ISTANBUL_BACKEND=dawn ISTANBUL_DAWN_ROBUSTNESS=off
source dev/device_steps.sh
shift
choose_steps "ladder timing ab" "$@"
wanted ladder && step ladder 240 "$py" -m istanbul kernels check --json "$out/ladder.json" \
    --kernel attention_backward_sgmat2
wanted timing && step timing 180 "$py" dev/tensor_core_attention/attention_ablation.py --out "$out/timing" \
    --variants base,f16_in_wide_base,f16_in_wide_w4,f16_in_wide_w8,f16_in_wide_w4x2 --rounds 3
for wide in base w8 w4x2; do
    wanted ab && step "ab_$wide" 120 env ISTANBUL_ATTENTION_DQ=$wide ISTANBUL_ATTENTION_DKV=$wide \
        "$py" bench/train.py --out "$out/ab_$wide" --models 124m --precision f16 --steps 10 \
        --warmup 3 --no-torch
done
export ISTANBUL_ATTENTION_DQ="${DQ:-w8}" ISTANBUL_ATTENTION_DKV="${DKV:-w8}"
wanted train && step train 300 "$py" bench/train.py \
    --out "$out/train" --models 124m --precision f16 --steps 10 --warmup 3
wanted parity && step parity 150 "$py" \
    bench/train_parity.py --out "$out/parity" --precisions f16 --torch-modes fp16 \
    --vocab-file .device/vocab/gpt2.tiktoken
exit "$failed"
