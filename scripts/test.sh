#!/usr/bin/env bash
# The test suite from a fresh clone: set up with the test extras, then pytest (arguments pass on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q

# --- Redis servers: the Redis-backed tests (marker `redis`) once more, against the system's
# redis-server (Debian's packaged Redis 7), installed when missing. The whole suite above ran
# against the embedded default's binary. ISTANBUL_REQUIRE_SYSTEM_REDIS=1 (CI) makes a missing
# server an error instead of a skip.
if ! command -v redis-server >/dev/null; then
    if [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; then
        sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
        $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            redis-server >/dev/null
    fi
fi
if command -v redis-server >/dev/null; then
    ISTANBUL_TEST_REDIS=system .venv/bin/python -m pytest -q -m redis
elif [ "${ISTANBUL_REQUIRE_SYSTEM_REDIS:-0}" = 1 ]; then
    echo "error: no redis-server to run the Redis-backed tests against (apt-get install redis-server)" >&2
    exit 1
else
    echo "note: no system redis-server (needs root to install); Redis-backed tests ran against the embedded one only" >&2
fi
