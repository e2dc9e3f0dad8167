#!/usr/bin/env bash
# The wheel a user installs: `maturin build --release` makes the abi3 wheel, a fresh venv per
# Python given (default: python3) installs it with pip, and the README's Python snippet runs
# there with no Rust toolchain on PATH and outside the checkout.
# Usage: scripts/dev/wheel-check.sh [PYTHON ...]   (maturin from $MATURIN, else from PATH)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
maturin="${MATURIN:-maturin}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$maturin" build --release --quiet -o "$work/wheels"
wheel=$(ls "$work"/wheels/trmask-*-abi3-*.whl)
echo "wheel: $(basename "$wheel")"
python3 - "$repo/README.md" > "$work/snippet.py" <<'PY'
import re, sys
(code,) = re.findall(r"^```python\n(.*?)^```", open(sys.argv[1]).read(), flags=re.S | re.M)
print(code)
PY
for py in "${@:-python3}"; do
  "$py" -m venv "$work/venv"
  # no cargo, rustc or rustup on PATH: the wheel must not need them
  env -i HOME="$work" PATH="$work/venv/bin:/usr/bin:/bin" ${PIP_FIND_LINKS:+PIP_FIND_LINKS="$PIP_FIND_LINKS"} \
    XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-}" bash -c '
      set -e
      if command -v cargo || command -v rustc; then echo "a Rust toolchain is on PATH" >&2; exit 1; fi
      pip install -q --disable-pip-version-check "$1"
      cd "$2" && python "$2/snippet.py"' _ "$wheel" "$work"
  echo "wheel-check: $("$work/venv/bin/python" -c 'import sys; print(sys.version.split()[0])') ok"
  rm -rf "$work/venv"
done
