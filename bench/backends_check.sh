#!/usr/bin/env bash
# Both WebGPU backends on a GPU machine (wgpudawn installed): the whole kernel ladder under
# wgpu-native (naga) and Dawn (Tint), and the roofline ceilings of each (FMA chains, and the
# subgroup-matrix / tensor-core ceiling where the adapter offers subgroup matrices).
#
#   bash bench/backends_check.sh OUTDIR [STEP ...]
#
# Steps (default: all, in this order):
#   devices       istanbul devices --json (both backends; Dawn's subgroup-matrix configs)
#   check_wgpu    istanbul kernels check --backend wgpu   -> kernels_check_wgpu.{txt,json}
#   check_dawn    istanbul kernels check --backend dawn   -> kernels_check_dawn.{txt,json}
#   bench_wgpu    ceilings + the f32/f16 matmuls that used to exceed 100% of the roofline
#   bench_dawn    the same under Dawn (adds the subgroup-matrix ceiling)
#   bench_dawn_nr the same under Dawn with ISTANBUL_DAWN_TOGGLES=disable_robustness
#
# Each step has its own time limit (LIMIT_<step> seconds overrides it) and log; a failing
# step does not stop the others. Exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bench/backends_check.sh OUTDIR [STEP ...]}"
shift
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(devices check_wgpu check_dawn bench_wgpu bench_dawn bench_dawn_nr)
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" PYTHONUNBUFFERED=1
declare -A limit=([devices]=60 [check_wgpu]=200 [check_dawn]=200 [bench_wgpu]=120
                  [bench_dawn]=120 [bench_dawn_nr]=120)
kernels=(--kernel matmul_nt_tiled_8x8 --kernel matmul_nt_h16_tiled_8x8 --kernel attention_forward_tiled
         --kernel copy_op)

run_step() {   # $1 step, $2 time limit in seconds
    local step=$1 py="timeout $2 $py"
    case $step in
        devices) $py -m istanbul devices --json > "$out/devices.json" ;;
        check_wgpu|check_dawn)
            $py -m istanbul kernels check --backend "${step#check_}" \
                --json "$out/kernels_check_${step#check_}.json" ;;
        bench_wgpu|bench_dawn)
            $py -m istanbul kernels bench --backend "${step#bench_}" "${kernels[@]}" \
                --json "$out/kernels_bench_${step#bench_}.json" \
                --markdown "$out/kernels_bench_${step#bench_}.md" ;;
        bench_dawn_nr)
            ISTANBUL_DAWN_TOGGLES=disable_robustness $py -m istanbul kernels bench --backend dawn \
                "${kernels[@]}" --json "$out/kernels_bench_dawn_norobust.json" \
                --markdown "$out/kernels_bench_dawn_norobust.md" ;;
        *) echo "unknown step $step" >&2; return 2 ;;
    esac
}

failed=0
for step in "${steps[@]}"; do
    lim_var="LIMIT_$step"
    lim=${!lim_var:-${limit[$step]:-300}}
    echo "== $step (limit ${lim}s)"
    start=$(date +%s)
    run_step "$step" "$lim" > "$out/$step.log" 2>&1
    rc=$?
    echo "   rc=$rc in $(( $(date +%s) - start ))s; $(tail -1 "$out/$step.log")"
    [ "$rc" -ne 0 ] && failed=$((failed + 1))
done
echo "# $failed failed step(s); results in $out"
exit "$failed"
