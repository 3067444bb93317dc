#!/usr/bin/env bash
# The test suite from a fresh clone: set up with the test extras, then pytest (arguments pass on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
exec .venv/bin/python -m pytest -q "$@"
