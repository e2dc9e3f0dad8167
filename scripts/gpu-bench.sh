#!/usr/bin/env bash
# The one prepared run for a machine with a real GPU (e.g. an H200 lent for a few minutes, with
# no Rust toolchain and no network there):
#
#   scripts/gpu-bench.sh prepare [DIR]   # here: release-build trmask + the bench examples,
#                                        # strip + xz them with this script and torch_ref.py
#                                        # into DIR (default .devbin/)
#   DIR/gpu-bench.sh run                 # there (or here, on lavapipe): everything, tables
#                                        # under ${OUT:-bench-out}/
#   QUICK=1 scripts/gpu-bench.sh run     # small shapes (a local dry run on software Vulkan)
#   scripts/gpu-bench.sh whole           # only the whole-process comparison and peak RSS
#                                        # (PYTHON=... a python3 with torch)
#   scripts/gpu-bench.sh suite [ARGS]    # `gpu_bench --suite ARGS` (every number of one GPU
#                                        # run, <= 5 min on an H200, PyTorch CUDA in the same
#                                        # run where it exists); the raw log is saved as
#                                        # benches/results/<machine>-<date>/suite.log
#                                        # (RESULTS=dir elsewhere; MACHINE=name overrides the
#                                        # GPU's name)
#
# `run` uses the packed binaries next to the script when they exist, else target/release.
# It writes: machine.txt (nvidia-smi, adapters), check.txt (GPU vs f64 CPU on the real sample),
# bench.md (copy bandwidth, vocab kernel with timestamp queries, host path, CPU, per-sequence
# cost), torch.md (PyTorch CUDA / CPU in the same run), whole.md (whole-process `trmask analyze`
# vs PyTorch CPU on a 1024 x 65536 bf16 pair, 3 alternating runs; peak RSS on a 1 GiB file),
# cuda-dropin.md (the Python drop-in on CUDA tensors vs verl's function on the same CUDA
# tensors, the 9 cells of python/bench/verl_real.py, CUDA events: the host round trip's cost).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mode="${1:-run}"

if [ "$mode" = prepare ]; then
  cd "$here/.."
  dir="${2:-.devbin}"
  cargo build --release --quiet --bin trmask --example gpu_bench --example synth_batch || exit 1
  mkdir -p "$dir"
  for b in target/release/trmask target/release/examples/gpu_bench target/release/examples/synth_batch; do
    n="$(basename "$b")"
    strip -o "$dir/$n" "$b" && xz -f -6 "$dir/$n" || exit 1
  done
  cp scripts/gpu-bench.sh scripts/torch_ref.py scripts/torch_suite.py "$dir/"
  # the Python drop-in on CUDA tensors against verl's function (verl_cuda.py): the abi3 wheel
  # and verl's wheel (installed --no-deps there, offline), beside the binaries
  maturin build --release --quiet --manifest-path python/Cargo.toml --features extension-module \
    --out "$dir" || exit 1
  python3 -m pip download --quiet --no-deps "verl==0.9.1" -d "$dir" || exit 1
  cp python/bench/verl_cuda.py python/bench/verl_real.py python/bench/verl_signature.py \
    python/tests/verl_files.py "$dir/"
  ls -la "$dir"
  exit 0
fi

# ---- run ----
repo="$(cd "$here/.." && pwd)"
cd "$repo"
out="${OUT:-bench-out}"
mkdir -p "$out"
bin=/tmp/trmask-bench-bin
mkdir -p "$bin"
if ls "$here"/*.xz >/dev/null 2>&1; then
  for f in "$here"/*.xz; do xz -dc "$f" >"$bin/$(basename "$f" .xz)"; chmod +x "$bin/$(basename "$f" .xz)"; done
else
  cp target/release/trmask target/release/examples/gpu_bench target/release/examples/synth_batch "$bin/"
fi
torch_ref="$here/torch_ref.py"
[ -f "$torch_ref" ] || torch_ref="$repo/scripts/torch_ref.py"
py="${PYTHON:-python3}"
export TRMASK_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then XDG_RUNTIME_DIR="$(mktemp -d)"; export XDG_RUNTIME_DIR; fi

if [ "$mode" = suite ]; then
  shift
  t0=$(date +%s)
  # the machine: MACHINE, else the first GPU's name, else the host name (letters, digits, -)
  machine="${MACHINE:-}"
  if [ -z "$machine" ] && command -v nvidia-smi >/dev/null; then
    machine="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  fi
  [ -n "$machine" ] || machine="$(hostname)"
  machine="$(printf %s "$machine" | tr 'A-Z' 'a-z' | tr -c 'a-z0-9\n' '-' | sed 's/--*/-/g; s/^-//; s/-$//')"
  dest="${RESULTS:-$repo/benches/results}/$machine-$(date -u +%Y-%m-%d)"
  mkdir -p "$dest"
  ts="$here/torch_suite.py"
  [ -f "$ts" ] || ts="$repo/scripts/torch_suite.py"
  {
    echo "== machine"; date -u; uname -a; nproc; free -g | head -2
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory,clocks.max.sm --format=csv
    echo "== gpu_bench --suite $*"
    TORCH_SUITE="$ts" "$bin/gpu_bench" --suite "$@"
    echo "== exit $? after $(( $(date +%s) - t0 )) s"
  } 2>&1 | tee "$dest/suite.log"
  echo "raw log: $dest/suite.log"
  exit 0
fi
quick="${QUICK:-}"
tmp="$(mktemp -d)"
t0=$(date +%s)

if [ "$mode" = run ]; then
{
  echo "== machine"; date -u; uname -a; nproc; free -g | head -2
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory,clocks.max.sm --format=csv
  "$bin/trmask" devices
} 2>&1 | tee "$out/machine.txt"

echo "== GPU and cpu-fast vs the f64 CPU on the real sample (the accuracy tolerance of docs/FORMAT.md)" | tee "$out/check.txt"
for s in data/sample/real-small.safetensors data/causal-sample/logits.safetensors; do
  [ -f "$s" ] || continue
  for b in gpu cpu cpu-fast; do
    "$bin/trmask" analyze "$s" --all-valid --backend "$b" --output "$tmp/$b.json" >/dev/null 2>"$tmp/$b.err" \
      || "$bin/trmask" analyze "$s" --backend "$b" --output "$tmp/$b.json" >/dev/null 2>"$tmp/$b.err" \
      || { echo "$s $b: $(tail -1 "$tmp/$b.err")" | tee -a "$out/check.txt"; }
  done
  for other in gpu cpu-fast; do
  "$py" - "$tmp/$other.json" "$tmp/cpu.json" "$s ($other)" "$other" <<'EOF' 2>&1 | tee -a "$out/check.txt"
import json, math, sys
g, c = (json.load(open(p)) for p in sys.argv[1:3])
def flat(x):
    if isinstance(x, list):
        for y in x: yield from flat(y)
    elif isinstance(x, (int, float)): yield float(x)
# the accuracy rule (docs/FORMAT.md) names kl, kl_rev and tv; the entropies are reported beside them
for keys in (("kl", "kl_rev", "tv"), ("rollout_entropy", "training_entropy")):
    worst, n, at = 0.0, 0, ""
    for k in keys:
        if k not in g or k not in c: continue
        for i, (a, b) in enumerate(zip(flat(g[k]), flat(c[k]))):
            n += 1
            r = abs(a - b) / (2e-3 * abs(b) + 1e-7)
            if r > worst:
                worst, at = r, f"{k}[{i}] {sys.argv[4]} {a:.9g} cpu {b:.9g}"
    print(f"{sys.argv[3]} {'/'.join(keys)}: {n} values, worst |x-cpu|/(2e-3|cpu|+1e-7) = "
          f"{worst:.3f} at {at}", "PASS" if n and worst <= 1 else "FAIL")
EOF
  done
done

echo "== bench (gpu_bench)"
"$bin/gpu_bench" ${quick:+--quick} 2>&1 | tee "$out/bench.md"

echo "== PyTorch in the same run" | tee "$out/torch.md"
if "$py" -c "import torch" 2>/dev/null; then
  if "$py" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    if [ -n "$quick" ]; then r=64; v=32000; else r=2048; v=151936; fi
    "$py" "$torch_ref" vocab $r $v --device cuda --reps 10 2>&1 | tee -a "$out/torch.md"
  fi
  if [ -n "$quick" ]; then r=16; v=32000; else r=256; v=151936; fi
  "$py" "$torch_ref" vocab $r $v --device cpu --reps 3 2>&1 | tee -a "$out/torch.md"
else
  echo "no torch for $py" | tee -a "$out/torch.md"
fi

echo "== the Python drop-in on CUDA tensors vs verl's function (the host round trip)" | tee "$out/cuda-dropin.md"
if "$py" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  pyd="$tmp/py"
  whl=$(ls "$here"/trmask*.whl 2>/dev/null | head -1)
  vwhl=$(ls "$here"/verl-*.whl 2>/dev/null | head -1)
  if [ -n "$whl" ] && [ -n "$vwhl" ]; then
    "$py" -m pip install --quiet --no-deps --no-index --target "$pyd" "$whl" "$vwhl" 2>&1 | tail -2
    bd="$here"
  else  # here: the extension built by maturin develop, verl installed
    pyd=""
    bd="$repo/python/bench"
  fi
  if [ -n "$quick" ]; then shapes="64x1024"; else shapes="64x1024,256x8192,1024x4096"; fi
  PYTHONPATH="$pyd${PYTHONPATH:+:$PYTHONPATH}" "$py" "$bd/verl_cuda.py" --repeat 7 --shapes "$shapes" \
    2>&1 | tee -a "$out/cuda-dropin.md"
else
  echo "no CUDA for $py: skipped" | tee -a "$out/cuda-dropin.md"
fi
fi # run only

# ---- whole (also `gpu-bench.sh whole`): whole-process comparison and peak RSS ----

echo "== whole process: trmask analyze vs PyTorch CPU on the same file" | tee "$out/whole.md"
if [ -n "$quick" ]; then rows=128; else rows=1024; fi
f="$tmp/whole.safetensors"
"$bin/synth_batch" "$f" $rows 65536 bf16 2>&1 | tail -1
sz=$(stat -c %s "$f")
now() { date +%s.%N; }
for i in 1 2 3; do
  for b in gpu cpu cpu-fast; do
    s=$(now); "$bin/trmask" analyze "$f" --backend "$b" --output "$tmp/w.safetensors" >/dev/null 2>&1 || echo "analyze $b failed"
    e=$(now); echo "trmask_$b $(awk "BEGIN{print $e - $s}")" >>"$tmp/whole.txt"
  done
  if "$py" -c "import torch" 2>/dev/null; then
    "$py" "$torch_ref" file "$f" --reps 1 | sed 's/torch_file_seconds/torch_cpu/' | cut -d' ' -f1,2 >>"$tmp/whole.txt"
  fi
done
"$py" - "$tmp/whole.txt" "$sz" "$rows" <<'EOF' 2>&1 | tee -a "$out/whole.md"
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    k, v = line.split()[:2]
    t.setdefault(k, []).append(float(v))
size = 2 * int(sys.argv[3]) * 65536 * 2
print(f"\n| {sys.argv[3]} x 65536 BF16 pair ({size/1e9:.3f} GB of logits) | median of 3 | logits GB/s | vs PyTorch CPU |")
print("|---|---|---|---|")
base = statistics.median(t["torch_cpu"]) if "torch_cpu" in t else None
for k, v in t.items():
    m = statistics.median(v)
    rel = f"{base / m:.2f}x" if base else ""
    print(f"| {k} | {m:.3f} s ({', '.join(f'{x:.3f}' for x in v)}) | {size/m/1e9:.2f} | {rel} |")
EOF
rm -f "$f"

echo "== peak RSS on a 1 GiB logits file" | tee -a "$out/whole.md"
if [ -n "$quick" ]; then rows=64; else rows=1766; fi
"$bin/synth_batch" "$f" $rows 151936 bf16 2>&1 | tail -1
sz=$(stat -c %s "$f")
for b in cpu cpu-fast gpu; do
  "$py" - "$b" "$sz" "$bin/trmask" analyze "$f" --backend "$b" --output "$tmp/r.safetensors" <<'EOF' 2>&1 | tee -a "$out/whole.md"
import resource, subprocess, sys
b, sz = sys.argv[1], int(sys.argv[2])
rc = subprocess.run(sys.argv[3:], stdout=subprocess.DEVNULL).returncode
kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(f"| {b} | file {sz/2**20:.1f} MiB | max RSS {kib/1024:.1f} MiB | over the file {kib/1024 - sz/2**20:+.1f} MiB | rc {rc} |")
EOF
done
rm -rf "$tmp"
echo "== done in $(( $(date +%s) - t0 )) s; results in $out/"
