#!/usr/bin/env bash
# The main job from a fresh clone: set up, then run `istanbul demo` (extra arguments pass on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plot          # the loss-curve picture needs the `plot` extra
exec .venv/bin/istanbul demo "$@"
