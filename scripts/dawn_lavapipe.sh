#!/usr/bin/env bash
# A software Vulkan driver that Dawn accepts, for CPU-only Debian 12 machines (CI).
#
# Dawn refuses Debian 12's lavapipe (Mesa 22.3: "shaderUniform*ArrayDynamicIndexing
# required") and runs on Mesa 25's from bookworm-backports. This unpacks that lavapipe into
# VENV/mesa-backports/ without root and without touching the system's Mesa (wgpu-native keeps
# using it): a private apt list of bookworm-backports from the machine's own Debian mirror,
# `apt-get download` of mesa-vulkan-drivers and the libdrm it needs, `dpkg -x`, and a Vulkan
# driver manifest, VENV/mesa-backports/lvp_icd.json, that the Dawn backend adds to its Vulkan
# loader's drivers (shaders/backends.py). Idempotent.
#
# Usage: scripts/dawn_lavapipe.sh VENV
set -euo pipefail
venv="${1:?usage: scripts/dawn_lavapipe.sh VENV}"
dest="$(cd "$venv" && pwd)/mesa-backports"
manifest="$dest/lvp_icd.json"
suite=bookworm-backports
packages=(mesa-vulkan-drivers libdrm2 libdrm-amdgpu1)

json_field() {   # json_field NAME FILE...: the first "NAME": "value" in the files
    sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p" "${@:2}" | head -1
}
if [ -f "$manifest" ] && [ -f "$(json_field library_path "$manifest")" ]; then
    exit 0
fi
. /etc/os-release
if [ "${VERSION_CODENAME:-}" != bookworm ]; then
    echo "dawn_lavapipe: not Debian 12 (${PRETTY_NAME:-unknown}); for Dawn on a CPU install" \
         "a Mesa >= 24 lavapipe and set ISTANBUL_DAWN_ICD to its lvp_icd json" >&2
    exit 1
fi

# The machine's Debian mirror (deb822 or one-line sources), else the default one.
mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
          2>/dev/null | grep -v '^[[:space:]]*#' | grep -oE 'https?://[^ ]+/debian/?( |$)' \
          | head -1 | tr -d ' ')" || true
mirror="${mirror:-http://deb.debian.org/debian}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
echo "deb ${mirror%/} $suite main" > "$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=$work/none"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o "Debug::NoLocking=1" -o "APT::Sandbox::User=$(id -un)")
echo "dawn_lavapipe: Mesa's lavapipe from $suite ($mirror) into $dest"
apt-get "${apt_opts[@]}" -qq update
(cd "$work/debs" && apt-get "${apt_opts[@]}" -qq download "${packages[@]/%//$suite}")

rm -rf "$dest"
mkdir -p "$dest/root"
for deb in "$work"/debs/*.deb; do
    dpkg -x "$deb" "$dest/root"
done
lvp="$(find "$dest/root" -name libvulkan_lvp.so -print -quit)"
if [ -z "$lvp" ]; then
    echo "dawn_lavapipe: no libvulkan_lvp.so in the downloaded packages" >&2
    exit 1
fi
# Only lavapipe is wanted: drop the hardware drivers and layers (~50 MB).
find "$dest/root" \( -name 'libvulkan_*.so' ! -name libvulkan_lvp.so \) -delete
find "$dest/root" -name 'libVkLayer_*.so' -delete
rm -rf "$dest/root/usr/share/vulkan/explicit_layer.d" "$dest/root/usr/share/vulkan/implicit_layer.d"
version="$(dpkg-deb -f "$work"/debs/mesa-vulkan-drivers_*.deb Version)"
api="$(json_field api_version "$dest"/root/usr/share/vulkan/icd.d/lvp_icd*.json)"
cat > "$manifest" <<EOF
{
    "file_format_version": "1.0.0",
    "ICD": {"library_path": "$lvp", "api_version": "${api:-1.3.0}"},
    "comment": "mesa-vulkan-drivers $version from $suite, for the Dawn backend only"
}
EOF
echo "dawn_lavapipe: $manifest (Mesa $version)"
