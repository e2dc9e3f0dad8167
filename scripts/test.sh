#!/usr/bin/env bash
# Runs the whole test suite. Installs Mesa's software Vulkan (lavapipe) first where it is
# missing and this user can (root with apt-get), so the GPU tests have an adapter on any box.
set -euo pipefail
cd "$(dirname "$0")/.."

icd=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json
if [ ! -f "$icd" ] && ! ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "scripts/test.sh: installing software Vulkan (mesa-vulkan-drivers libvulkan1)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mesa-vulkan-drivers libvulkan1 >/dev/null
  else
    echo "scripts/test.sh: no Vulkan driver and cannot install one; GPU tests will skip (set TRMASK_REQUIRE_GPU=1 to fail instead)"
  fi
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
exec cargo test "$@"
