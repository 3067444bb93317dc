#!/usr/bin/env bash
# Peak RSS of `istanbul prepare` on a JSONL.zst corpus at two sizes (dev/prepare_memory/README.md).
#   bash dev/prepare_memory/run.sh [SIZES_MB...]      (default 160 480; vocabulary gpt2)
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for mb in "${@:-160 480}"; do
  for m in $mb; do
    .venv/bin/python -c "
import sys; sys.path.insert(0, '.')
from pathlib import Path
from bench.prepare_bench import write_jsonl_zst
print(write_jsonl_zst(Path('$work/c$m.jsonl.zst'), int($m * 1e6)))"
    /usr/bin/time -v .venv/bin/python -m istanbul prepare "$work/c$m.jsonl.zst" --vocab gpt2 \
        --out "$work/s$m" --no-progress --replace > "$work/log$m.txt" 2>&1
    grep -E "Maximum resident|documents" "$work/log$m.txt"
    rm -rf "$work/s$m"
  done
done
