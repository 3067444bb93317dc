#!/usr/bin/env bash
# Issue 21, session 20's second H200 call: f16 rows read from storage as their bits
# (vec2<u32> bitcast to vec4<f16>) instead of as vec4<f16> — in the tensor-core matmuls'
# f16 weights and f16 A as well as the attention's f16 q, k, v, do — checked and timed.
# One device call, ~6 minutes, Dawn, robustness off (the trainer's default).
#
#   bash dev/training_step/h200_f16_reads_next.sh OUTDIR [STEP ...]   (on the GPU machine; default: all)
#
#   ladder      every tensor-core matmul rung and the f16-input attention rungs (bits reads)
#   ablation    dev/tensor_core_attention/attention_ablation.py base,f16_in,f16_in_vec4
#   train_vec4  bench/train.py 124m f16 with ISTANBUL_F16_READS=vec4 (istanbul only)
#   train       bench/train.py 124m f16 (bits) beside PyTorch fp32 / TF32 / bf16 / fp16
#   parity      bench/train_parity.py: the 124M f16 curve beside PyTorch fp16, 100 steps
# A failing step does not stop the others; exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/training_step/h200_f16_reads_next.sh OUTDIR [STEP ...]}"
export ISTANBUL_BACKEND=dawn ISTANBUL_DAWN_ROBUSTNESS=off
source dev/device_steps.sh
shift
choose_steps "ladder ablation train_vec4 train parity" "$@"
wanted ladder && step ladder 240 "$py" -m istanbul kernels check --json "$out/ladder.json" \
    --kernel matmul_nt_sgmat --kernel matmul_nt_w16 --kernel matmul_nn_w16 \
    --kernel matmul_nn_sgmat --kernel matmul_tn_sgmat --kernel matmul_nn_a16 \
    --kernel matmul_tn_a16 --kernel matmul_nt_a16 --kernel attention_forward_sgmat_f16in \
    --kernel attention_backward_sgmat_f16in --kernel attention_backward_sgmat2_staged_f16in \
    --kernel attention_backward_sgmat2_small_f16in
wanted ablation && step ablation 150 "$py" dev/tensor_core_attention/attention_ablation.py --out "$out" \
    --variants base,f16_in,f16_in_vec4
wanted train_vec4 && step train_vec4 150 env ISTANBUL_F16_READS=vec4 "$py" bench/train.py \
    --out "$out/train_vec4" --models 124m --precision f16 --steps 5 --warmup 2 --no-torch
wanted train && step train 240 "$py" bench/train.py --out "$out/train" --models 124m \
    --precision f16 --steps 5 --warmup 2
wanted parity && step parity 150 "$py" bench/train_parity.py --out "$out/parity" \
    --precisions f16 --torch-modes fp16 --vocab-file .device/vocab/gpt2.tiktoken
exit "$failed"
