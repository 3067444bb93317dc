#!/usr/bin/env bash
# The H200 call that session 18 prepared and could not run (no device): is the emulation of
# subgroup matrices the extension's meaning, is dK/dV's descending query order right and
# faster, and would f16 copies of q, k, v, do pay? One device call, ~6 minutes.
#
#   bash dev/tensor_core_attention/h200_attention_next.sh OUTDIR      (on the GPU machine: Dawn, robustness off)
#
#   semantics  tests/test_sgmat_emulation.py unemulated: the matrix operations against numpy
#   ladder     the sgmat2 backward rungs, both query orders, robustness off and on
#   ablation   dev/tensor_core_attention/attention_ablation.py: base, qdown, f16_loads, no_global (ms per layer call)
# A failing step does not stop the others; exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: dev/tensor_core_attention/h200_attention_next.sh OUTDIR}"
export ISTANBUL_BACKEND=dawn ISTANBUL_DAWN_ROBUSTNESS=off
source dev/device_steps.sh
step semantics 120 "$py" -m pytest -q -p no:cacheprovider tests/test_sgmat_emulation.py
for r in off on; do
    step "ladder_robustness_$r" 200 env ISTANBUL_DAWN_ROBUSTNESS=$r "$py" -m istanbul kernels \
        check --kernel attention_backward_sgmat2 --json "$out/ladder_robustness_$r.json"
done
step ablation 300 "$py" dev/tensor_core_attention/attention_ablation.py --out "$out" \
    --variants base,qdown,f16_loads,no_global
exit "$failed"
