#!/usr/bin/env bash
# Runs the whole test suite. Installs what the tests need where it is missing and this user can
# (root with apt-get / pip): Mesa's software Vulkan (lavapipe) so the GPU tests have an adapter,
# Chromium for the HTML report test, numpy + safetensors for the docs/RECIPES.md test; then the
# Python package's tests (scripts/python-test.sh: a venv with maturin, pytest, numpy, torch) when
# no cargo arguments are given.
set -euo pipefail
cd "$(dirname "$0")/.."

can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
apt_updated=0
apt_install() {
  if can_apt; then
    if [ "$apt_updated" = 0 ]; then apt-get update -qq; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  fi
}

icd=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json
if [ ! -f "$icd" ] && ! ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1; then
  echo "scripts/test.sh: installing software Vulkan (mesa-vulkan-drivers libvulkan1)"
  apt_install mesa-vulkan-drivers libvulkan1 ||
    echo "scripts/test.sh: no Vulkan driver and cannot install one; GPU tests will skip (set TRMASK_REQUIRE_GPU=1 to fail instead)"
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  echo "scripts/test.sh: installing chromium (report test)"
  apt_install chromium || echo "scripts/test.sh: no chromium; the report test skips outside CI"
fi
if ! python3 -c 'import numpy, safetensors' >/dev/null 2>&1; then
  echo "scripts/test.sh: installing numpy and safetensors (recipe test)"
  if ! command -v pip3 >/dev/null 2>&1; then apt_install python3-pip || true; fi
  pip3 install -q --break-system-packages numpy safetensors 2>/dev/null ||
    pip3 install -q numpy safetensors 2>/dev/null ||
    echo "scripts/test.sh: no numpy/safetensors; the recipe test skips outside CI"
fi
# Prefer lavapipe when no other Vulkan driver is requested (a real GPU is still used when
# WGPU_ADAPTER_NAME or VK_DRIVER_FILES is set by the caller).
if [ -f "$icd" ] && [ -z "${VK_DRIVER_FILES:-}" ] && [ -z "${WGPU_ADAPTER_NAME:-}" ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  export VK_DRIVER_FILES="$icd"
fi
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"
  chmod 700 "$XDG_RUNTIME_DIR"
  export XDG_RUNTIME_DIR
fi
cargo test "$@"
if [ "$#" = 0 ]; then
  scripts/python-test.sh
fi
