#!/usr/bin/env bash
# Issue 21's next H200 call: the trainer's q, k, v in f16 (head-major copies the tensor-core
# attention loads: half the bytes). One device call, ~8 minutes, Dawn, robustness off (the
# trainer's default).
#
#   bash dev/training_step/h200_f16_heads_next.sh OUTDIR [STEP ...]   (on the GPU machine; default: all)
#
#   ladder    the f16-input attention rungs, the trainer's f32-input pair beside them, and
#             the f16 outputs of RoPE and copy_heads that fill the copies
#   ablation  dev/tensor_core_attention/attention_ablation.py base,f16_in: ms per layer call, f32 vs f16 inputs
#   pytest    the attention, f16-training and model-parity tests on the H200
#   parity    bench/train_parity.py: 100 steps of the 124M f16 curve beside PyTorch fp16
#   train     bench/train.py 124m f16 beside PyTorch fp32 / TF32 / bf16 / fp16 (one run)
# A failing step does not stop the others; exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/training_step/h200_f16_heads_next.sh OUTDIR}"
export ISTANBUL_BACKEND=dawn ISTANBUL_DAWN_ROBUSTNESS=off
source dev/device_steps.sh
shift
choose_steps "ladder ablation pytest parity train" "$@"
wanted ladder && step ladder 200 "$py" -m istanbul kernels check --json "$out/ladder.json" \
    --kernel attention_forward_sgmat_f16in \
    --kernel attention_backward_sgmat_f16in --kernel attention_backward_sgmat2_staged \
    --kernel attention_backward_sgmat2_staged_f16in --kernel attention_backward_sgmat2_small_f16in \
    --kernel rope --kernel copy_heads
wanted ablation && step ablation 150 "$py" dev/tensor_core_attention/attention_ablation.py --out "$out" --variants base,f16_in,f16_in_vec4
wanted pytest && step pytest 200 "$py" -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py \
    tests/test_train_f16.py tests/test_model_parity.py
wanted parity && step parity 150 "$py" bench/train_parity.py --out "$out/parity" --precisions f16 \
    --torch-modes fp16 --vocab-file .device/vocab/gpt2.tiktoken
wanted train && step train 240 "$py" bench/train.py --out "$out/train" --models 124m --precision f16 \
    --steps 5 --warmup 2
exit "$failed"
