#!/usr/bin/env bash
# Set-up on a fresh Debian/Ubuntu machine, idempotent: a Vulkan driver (software Vulkan,
# Mesa's lavapipe, when the machine has none), a virtual environment in .venv, and the
# package with the extras named in $1 (e.g. "test" or "test,dawn"; with `dawn` also a
# lavapipe that Dawn accepts, in .venv/mesa-backports/). Re-running it is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"
    else
        echo "error: need root to run: $*" >&2
        echo "       run this script as root, or install those packages first" >&2
        exit 1
    fi
}

apt_install() {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "error: Python >= 3.11 is required (found $(python3 --version 2>&1))" >&2
    exit 1
fi
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt_install python3-venv
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
.venv/bin/python -m pip install -q --disable-pip-version-check -e "$spec"

# A Vulkan adapter is all the engine needs: a GPU driver with Vulkan, or lavapipe.
probe='from istanbul.shaders.adapters import enumerate_adapters as e; import sys; sys.exit(0 if e() else 1)'
if ! .venv/bin/python -c "$probe" 2>/dev/null; then
    echo "no Vulkan adapter found: installing Mesa's software Vulkan (mesa-vulkan-drivers)"
    apt_install mesa-vulkan-drivers libvulkan1
    if ! .venv/bin/python -c "$probe" 2>/dev/null; then
        echo "error: still no Vulkan adapter after installing mesa-vulkan-drivers;" >&2
        echo "       \`vulkaninfo --summary\` (package vulkan-tools) shows what the loader sees" >&2
        exit 1
    fi
fi
# Dawn (the optional `dawn` extra) refuses Debian 12's lavapipe: without an adapter Dawn
# accepts, unpack Mesa 25's lavapipe privately for it (the system Mesa stays as it is).
dawn_probe='from istanbul.shaders.adapters import enumerate_adapters as e; import sys
sys.exit(0 if e("dawn") else 1)'
if .venv/bin/python -c 'import wgpudawn' 2>/dev/null \
        && ! .venv/bin/python -c "$dawn_probe" 2>/dev/null; then
    bash scripts/dawn_lavapipe.sh .venv \
        || echo "warning: Dawn has no Vulkan adapter here; --backend dawn will not work" >&2
fi
# Silence the harmless XDG_RUNTIME_DIR warning of Mesa's software drivers.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
devices="$(.venv/bin/istanbul devices)"     # no `| head`: a closed pipe would fail the script
echo "${devices%%$'\n'*}"
