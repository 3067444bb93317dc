#!/usr/bin/env bash
# Issue 21, session 24: the round on the card that comes (an H100 or an H200), with the
# shipped tuned files (session 24 added the H100's: shaders/tuned/
# nvidia-h100-80gb-hbm3-vulkan-dawn.json) and the default wide backward ("w8"). The tests
# issue 21 asks to pass on the GPU under both backends, the 124M step beside PyTorch, the
# loss curve beside PyTorch fp16. Dawn, robustness off (the trainer's default). ~9 minutes.
#
#   bash dev/training_step/round16_next.sh OUTDIR [STEP ...]   (on the GPU machine; default: all)
#
#   pytest       Dawn: f16 training, checkpoints and resume, attention, model parity
#   pytest_wgpu  wgpu-native: f16 training (its no-tensor-core fallback), checkpoints, resume
#   train        bench/train.py 124m f16 beside PyTorch fp32 / TF32 / bf16 / fp16 (10 steps)
#   parity       bench/train_parity.py: the 124M f16 curve beside PyTorch fp16, 100 steps
# A failing step does not stop the others; exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/training_step/round16_next.sh OUTDIR [STEP ...]}"
export ISTANBUL_BACKEND=dawn ISTANBUL_DAWN_ROBUSTNESS=off
source dev/device_steps.sh
shift
choose_steps "pytest pytest_wgpu train parity" "$@"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
wanted pytest && step pytest 240 "$py" -m pytest -q -p no:cacheprovider tests/test_train_f16.py \
    tests/test_resume.py tests/test_checkpoint.py tests/test_kernels_attention.py \
    tests/test_model_parity.py
wanted pytest_wgpu && step pytest_wgpu 200 env ISTANBUL_BACKEND=wgpu "$py" -m pytest -q \
    -p no:cacheprovider tests/test_train_f16.py tests/test_resume.py tests/test_checkpoint.py
wanted train && step train 300 "$py" bench/train.py \
    --out "$out/train" --models 124m --precision f16 --steps 10 --warmup 3
wanted parity && step parity 150 "$py" \
    bench/train_parity.py --out "$out/parity" --precisions f16 --torch-modes fp16 \
    --vocab-file .device/vocab/gpt2.tiktoken
exit "$failed"
