#!/usr/bin/env bash
# The main job from a fresh clone: set up, then run `istanbul demo` (extra arguments pass on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plot,dashboard   # the loss-curve picture (`plot`), the live dashboard (`dashboard`)
exec .venv/bin/istanbul demo "$@"
