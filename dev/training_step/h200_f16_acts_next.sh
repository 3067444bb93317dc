#!/usr/bin/env bash
# Issue 21, session 20's third H200 call: f16 precision keeps h, h2, s (the activations
# that only feed matmuls) in f16, beside the f16 q, k, v of the second call; the attention
# backward's prep reads coalesced. Checked, then timed against the same code with f32
# activations ($ISTANBUL_F16_ACTIVATIONS=0; f16 is the default since session 22) and PyTorch in one call. ~8 minutes, Dawn,
# robustness off (the trainer's default).
#
#   bash dev/training_step/h200_f16_acts_next.sh OUTDIR [STEP ...]   (on the GPU machine; default: all)
#
#   ladder     the new rungs (matmul_tn_w16, rmsnorm/swiglu f16 outputs), the attention
#              backward rungs (the prep), the f16-input attention rungs; RoPE and copy_heads
#              (session 20's review folded their f16 twins, session 21 moved RMSNorm's
#              forwards into their own file: both verified on lavapipe only)
#   pytest     f16 training (incl. f16 copies change no result, bit for bit), attention,
#              model parity, the rmsnorm / activation kernels
#   pytest_wgpu  f16 training, checkpoints and resume under wgpu-native (no tensor cores
#              there: the f16 precision's fallback), issue 21's "both backends"
#   train_f32acts  bench/train.py 124m f16 with ISTANBUL_F16_ACTIVATIONS=0 (istanbul only)
#              (call 5 ran `train` with f16 activations, then the default; `train` now runs
#              the default, f32 activations)
#   train      bench/train.py 124m f16 beside PyTorch fp32 / TF32 / bf16 / fp16 (10 steps)
#   parity     bench/train_parity.py: the 124M f16 curve beside PyTorch fp16, 100 steps
#   ab         (not in the default set) f16 and f32 activations alternated twice, istanbul
#              only, 10 steps each, with each step's wall time and the host's recording time
# A failing step does not stop the others; exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/training_step/h200_f16_acts_next.sh OUTDIR [STEP ...]}"
export ISTANBUL_BACKEND=dawn ISTANBUL_DAWN_ROBUSTNESS=off
source dev/device_steps.sh
shift
choose_steps "ladder pytest pytest_wgpu train_f32acts train parity" "$@"
wanted ladder && step ladder 240 "$py" -m istanbul kernels check --json "$out/ladder.json" \
    --kernel matmul_tn_w16 --kernel matmul_nt_a16_w16 --kernel rmsnorm --kernel swiglu \
    --kernel attention_backward --kernel attention_forward_sgmat_f16in --kernel rope \
    --kernel copy_heads
wanted pytest && step pytest 300 "$py" -m pytest -q -p no:cacheprovider tests/test_train_f16.py \
    tests/test_kernels_attention.py tests/test_model_parity.py tests/test_kernels_rmsnorm.py \
    tests/test_kernels_activations.py
wanted pytest_wgpu && step pytest_wgpu 300 env ISTANBUL_BACKEND=wgpu "$py" -m pytest -q \
    -p no:cacheprovider tests/test_train_f16.py tests/test_resume.py tests/test_checkpoint.py
wanted train_f32acts && step train_f32acts 150 env ISTANBUL_F16_ACTIVATIONS=0 "$py" \
    bench/train.py --out "$out/train_f32acts" --models 124m --precision f16 --steps 10 \
    --warmup 3 --no-torch
wanted train && step train 300 "$py" bench/train.py --out "$out/train" --models 124m \
    --precision f16 --steps 10 --warmup 3
wanted parity && step parity 150 "$py" bench/train_parity.py --out "$out/parity" \
    --precisions f16 --torch-modes fp16 --vocab-file .device/vocab/gpt2.tiktoken
for round in 1 2; do
    for acts in 1 0; do
        wanted ab && step "ab${round}_acts${acts}" 120 env ISTANBUL_F16_ACTIVATIONS=$acts "$py" \
            bench/train.py --out "$out/ab${round}_acts${acts}" --models 124m --precision f16 \
            --steps 10 --warmup 3 --no-torch
    done
done
exit "$failed"
