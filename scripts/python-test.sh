#!/usr/bin/env bash
# Builds the Python package into a virtual environment and runs its tests (python/tests).
# Idempotent: the venv (target/python-venv, or $TRMASK_VENV) is made once and reused; the
# extension is rebuilt by `maturin develop` (debug profile, incremental). Installs maturin,
# pytest, NumPy, verl's wheel (--no-deps), OmegaConf and TensorBoard, and torch's CPU wheel where it can (torch tests skip without it; under CI,
# `CI` set, torch is required).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TRMASK_VENV:-target/python-venv}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "scripts/python-test.sh: creating $venv"
  "$py" -m venv "$venv" 2>/dev/null || {
    # Debian's python3 lacks ensurepip until python3-venv is installed
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    fi
    rm -rf "$venv"
    "$py" -m venv "$venv"
  }
fi
vpy="$venv/bin/python"
if ! "$vpy" -c 'import maturin, pytest, numpy' >/dev/null 2>&1 || ! command -v "$venv/bin/maturin" >/dev/null; then
  echo "scripts/python-test.sh: installing maturin, pytest, numpy"
  "$vpy" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  "$vpy" -m pip install -q "maturin>=1.5,<2" pytest numpy
fi
if ! "$vpy" -c 'import torch' >/dev/null 2>&1; then
  echo "scripts/python-test.sh: installing torch (CPU wheel)"
  "$vpy" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu 2>/dev/null ||
    "$vpy" -m pip install -q torch 2>/dev/null ||
    echo "scripts/python-test.sh: no torch; the torch tests skip"
  if [ -n "${CI:-}" ] && ! "$vpy" -c 'import torch' >/dev/null 2>&1; then
    echo "scripts/python-test.sh: torch is required under CI" >&2
    exit 1
  fi
fi
# verl's config classes (its wheel without dependencies: the tests load two of its files),
# OmegaConf for Hydra's DictConfig, TensorBoard to read back the Monitor's event files
if ! "$vpy" -c 'import omegaconf, yaml, tensorboard, safetensors' >/dev/null 2>&1 ||
  ! "$vpy" -m pip show -q verl >/dev/null 2>&1; then
  echo "scripts/python-test.sh: installing verl (--no-deps), omegaconf, tensorboard"
  "$vpy" -m pip install -q --no-deps "verl==0.9.1"
  "$vpy" -m pip install -q omegaconf pyyaml tensorboard safetensors
fi
echo "== python: maturin develop =="
VIRTUAL_ENV="$(cd "$venv" && pwd)" "$venv/bin/maturin" develop -q --manifest-path python/Cargo.toml \
  --features extension-module
echo "== python: pytest =="
exec "$vpy" -m pytest -q python/tests "$@"
