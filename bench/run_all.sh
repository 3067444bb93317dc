#!/usr/bin/env bash
# The GPU verification and benchmark suite in one command, for a machine with a real GPU.
#
#   bench/run_all.sh OUTDIR [STEP ...]
#
# Steps (default: all, in this order):
#   devices   istanbul devices --json
#   check     istanbul kernels check (every kernel: compile, run, correct, grad)
#   tune      the matmul/attention autotuner at the model's shapes (cache -> OUTDIR/tuned)
#   kbench    istanbul kernels bench with roofline fractions (uses the tuned cache)
#   train     bench/train.py: 124m and small, istanbul vs PyTorch eager, same run
#   o200k     bench/train.py: 124m with o200k_base (200,019 ids) at 8 x 1024 (chunked LM head),
#             peak GPU memory per row, istanbul vs PyTorch eager
#   tests     the GPU-relevant pytest files (tokenizer, vocab training, model parity, resume,
#             generation) on this GPU; the kernel ladder itself is the `check` step
#   tokenize  bench/tokenize_bench.py on 64 MB per vocabulary
#   tprobe    dev/tokenizer_throughput/tokenize_host_probe.py (the tokenizer's host split, pipeline chunk sizes, the
#             corpus by pre-tokenizer chunk and at 768-byte long-piece windows beside the
#             default, the lone document by pre-tokenizer chunk, long pieces inline or not and
#             by window size; results belong in dev/tokenizer_throughput/results/tokenize_host/)
#   vtrain    bench/vocab_train.py (GPU trainer vs HF BpeTrainer and rustbpe, 100 MB and 1 GB)
#   vprobe    dev/vocab_train_speed/vocab_merge_probe.py (the merge phase's host phases, per-kernel GPU time and
#             schedule knobs on vtrain's 100 MB corpus; results belong in dev/vocab_train_speed/results/)
#   service   bench/service.py (gRPC throughput and latency, --workers 1 and 6 with the shared
#             GPU process and with a device per worker, every reply checked)
#   sprobe    dev/lone_request/service_latency_probe.py (a lone 1 KB request layer by layer: in-process,
#             through a thread, through the GPU process, gRPC's floor, whole requests)
#   chunks    dev/tokenizer_throughput/call_chunk_sweep.py (pre-tokenizer chunk by call size, 64 KB to 16 MB)
#   probe     dev/compiler_probes/matmul_probe.py (a compiler probe: loops over private arrays vs
#             unrolled register blocks; results belong in dev/compiler_probes/results/)
#   e2e       bench/daemon_e2e.py (service -> prepare -> submit -> daemon killed -> takeover)
#             followed by `istanbul generate` from the job's final checkpoint
#
# Each step runs under its own time limit (LIMIT_<step> seconds overrides the default) and
# writes OUTDIR/<step>.log; a failing or timed-out step does not stop the others. The real
# vocabularies are looked up in $ISTANBUL_VOCAB_DIR (default: ../shared/vocab).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bench/run_all.sh OUTDIR [STEP ...]}"
shift
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(devices check tune kbench train o200k tests tokenize vtrain service e2e)
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" PYTHONUNBUFFERED=1
export ISTANBUL_VOCAB_DIR="${ISTANBUL_VOCAB_DIR:-$(cd .. && pwd)/shared/vocab}"
export ISTANBUL_SHARED_VOCAB="$ISTANBUL_VOCAB_DIR"
export ISTANBUL_AUTOTUNE_DIR="$out/tuned"

declare -A limit=([devices]=30 [check]=150 [tune]=150 [kbench]=300 [train]=200 [o200k]=300 [tests]=300
                  [tokenize]=200 [tprobe]=200 [vtrain]=560 [vprobe]=150 [service]=330 [sprobe]=150
                  [chunks]=90 [e2e]=240 [probe]=60)

run_step() {
    local step=$1
    case $step in
        devices) $py -m istanbul devices --json > "$out/devices.json" ;;
        check) $py -m istanbul kernels check --json "$out/kernels_check.json" ;;
        tune) $py bench/autotune.py --out "$out/autotune" --total-s $((limit[tune] - 40)) ;;
        kbench) $py -m istanbul kernels bench --repeats "${KBENCH_REPEATS:-5}" --json "$out/kernels_bench.json" \
                    --markdown "$out/kernels_bench.md" ;;
        train) $py bench/train.py --out "$out/train" --models 124m,small --steps 5 --warmup 2 ;;
        o200k) $py bench/train.py --out "$out/train_o200k" --models 124m --vocab o200k_base \
                   --batch 8 --precision fp32,mixed --steps 5 --warmup 2 ;;
        tests) $py -m pytest -q -p no:cacheprovider tests/test_engine.py \
                   tests/test_tokenizer_gpu.py tests/test_tokenizer_decode.py \
                   tests/test_tokenizer_hf.py \
                   tests/test_vocab_train_gpu.py tests/test_vocab_train_gpu_corpus.py \
                   tests/test_model_parity.py \
                   tests/test_resume.py tests/test_generate.py tests/test_lm_head.py ;;
        tokenize) $py bench/tokenize_bench.py --out "$out/tokenize" --mb 64 \
                      --vocab-dir "$ISTANBUL_VOCAB_DIR" ;;
        tprobe) $py dev/tokenizer_throughput/tokenize_host_probe.py --out "$out/tokenize_host" --mb 64 \
                    --pipeline-mb 8,16 --repeats 2 --corpus-chunks 32,64,128 \
                    --corpus-windows 768/192 --chunks 128,16,8 --windows 768,1536 ;;
        vtrain) $py bench/vocab_train.py --out "$out/vocab_train" --corpus-dir /tmp/vt_corpus \
                    --sizes 100,1000 ;;
        vprobe) $py dev/vocab_train_speed/vocab_merge_probe.py --out "$out/vocab_merge_probe" \
                    --corpus-dir /tmp/vt_corpus ;;
        service) $py bench/service.py --out "$out/service" --duration 2 --warmup 0.5 \
                     --vocab "$ISTANBUL_VOCAB_DIR/gpt2.tiktoken" ;;
        sprobe) $py dev/lone_request/service_latency_probe.py --out "$out/service_latency" \
                    --vocab "$ISTANBUL_VOCAB_DIR/gpt2.tiktoken" ;;
        chunks) $py dev/tokenizer_throughput/call_chunk_sweep.py --out "$out/call_chunk" \
                    --vocab "$ISTANBUL_VOCAB_DIR/gpt2.tiktoken" ;;
        e2e) $py bench/daemon_e2e.py --out "$out/e2e" --vocab "$ISTANBUL_VOCAB_DIR/gpt2.tiktoken" \
                 --model tiny --steps 200 --kill-at 80 --checkpoint-every 40 &&
             latest=$(find "$out/e2e" -maxdepth 4 -name latest | head -1) &&
             $py -m istanbul generate --checkpoint "$latest" --prompt "def main(" \
                 --max-tokens 48 --temperature 0.8 --top-k 40 --seed 1 ;;
        probe) $py dev/compiler_probes/matmul_probe.py --out "$out/probe" ;;
        *) echo "unknown step $step" >&2; return 2 ;;
    esac
}

for step in "${steps[@]}"; do
    var="LIMIT_$step"
    seconds=${!var:-${limit[$step]:-300}}
    start=$(date +%s)
    echo "== $step (limit ${seconds}s)"
    timeout --kill-after=10 "$seconds" bash -c "$(declare -f run_step); $(declare -p out py limit); run_step $step" \
        > "$out/$step.log" 2>&1
    rc=$?
    echo "   rc=$rc in $(( $(date +%s) - start ))s; last lines:"
    tail -n 4 "$out/$step.log" | sed 's/^/   | /'
done
