#!/usr/bin/env bash
# Whole-process comparison of BENCHMARKS.md: `trmask analyze FILE --backend …` against PyTorch
# CPU (`scripts/torch_ref.py file FILE --reps 2`: its first repetition and the same process
# warm), in alternating rounds so that host drift hits every row alike.
#
#   scripts/whole-process.sh FILE [ROUNDS] [BASE_BINARY]
#
# FILE: a safetensors pair with rollout_logits / old_logits in bf16 (e.g. from
# `cargo run --release --example synth_batch -- out.safetensors 1024 65536 bf16`). ROUNDS:
# default 5. BASE_BINARY: an older `trmask` build timed with --backend gpu beside the current
# one (optional). Uses target/release/trmask (build it first) and the Python of
# $TRMASK_PYTHON (default: the test venv, ~/.cache/trmask/python-venv/bin/python). Prints the
# raw seconds per round and the medians.
set -euo pipefail
file=${1:?usage: scripts/whole-process.sh FILE [ROUNDS] [BASE_BINARY]}
rounds=${2:-5}
base=${3:-}
cd "$(dirname "$0")/.."
bin=target/release/trmask
py=${TRMASK_PYTHON:-$HOME/.cache/trmask/python-venv/bin/python}
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
timed() { # name command...
    local name=$1; shift
    /usr/bin/env time -a -o "$tmp/$name" -f "%e" "$@" > /dev/null 2> "$tmp/err" \
        || { cat "$tmp/err" >&2; exit 1; }
}
# warm the shader caches and the page cache once
"$bin" analyze "$file" --backend gpu > /dev/null 2>&1 || true
[ -n "$base" ] && { "$base" analyze "$file" --backend gpu > /dev/null 2>&1 || true; }
echo "start $(date -u +%T) UTC, $(git rev-parse --short HEAD), $rounds rounds, $file"
for _ in $(seq "$rounds"); do
    [ -n "$base" ] && timed base-gpu "$base" analyze "$file" --backend gpu
    timed gpu "$bin" analyze "$file" --backend gpu
    timed cpu "$bin" analyze "$file" --backend cpu
    timed cpu-fast "$bin" analyze "$file" --backend cpu-fast
    "$py" scripts/torch_ref.py file "$file" --reps 2 | awk '{print $2}' > "$tmp/t"
    sed -n 1p "$tmp/t" >> "$tmp/torch-first"
    sed -n 2p "$tmp/t" >> "$tmp/torch-second"
done
echo "end $(date -u +%T) UTC"
for name in base-gpu gpu cpu cpu-fast torch-first torch-second; do
    [ -f "$tmp/$name" ] || continue
    median=$(sort -g "$tmp/$name" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    echo "$name: $(tr '\n' ' ' < "$tmp/$name")(median $median s)"
done
