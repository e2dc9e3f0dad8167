#!/usr/bin/env bash
# One prepared run for a machine with a real GPU (e.g. an H200 lent for a few minutes):
# builds, checks GPU against the CPU reference, then runs the benchmarks at LLM sizes.
# Everything it prints goes to ${OUT:-bench-out}/ as well.
#   scripts/gpu-bench.sh            # full run
#   QUICK=1 scripts/gpu-bench.sh    # skip the full-size vocab bench
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench-out}"
mkdir -p "$out"
export TRMASK_REQUIRE_GPU=1
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then XDG_RUNTIME_DIR="$(mktemp -d)"; chmod 700 "$XDG_RUNTIME_DIR"; export XDG_RUNTIME_DIR; fi
{
  echo "== machine"; date -u; uname -a; nproc; free -g | head -2
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
} 2>&1 | tee "$out/machine.txt"

cargo build --release --quiet 2>&1 | tail -20
./target/release/trmask devices 2>&1 | tee "$out/devices.txt"

echo "== GPU vs CPU checks" | tee "$out/tests.txt"
cargo test --release --test gpu_vs_cpu --test vocab_divergence --test topk 2>&1 | grep -E "test result|FAILED|panicked" | tee -a "$out/tests.txt"

echo "== analyze on the embedded sample, both backends" | tee "$out/analyze.txt"
for b in gpu cpu; do
  ./target/release/trmask analyze data/sample/real-small.safetensors --backend "$b" --metrics "$out/metrics-$b.json" 2>&1 | head -3 | tee -a "$out/analyze.txt"
done

echo "== benches" | tee "$out/bench.txt"
cargo bench --bench estimators 2>&1 | grep -E "^[a-z_0-9/]+|time:|thrpt:" | tee -a "$out/bench.txt"
if [ -z "${QUICK:-}" ]; then
  TRMASK_BENCH_FULL=1 cargo bench --bench vocab 2>&1 | grep -E "^[a-zA-Z_0-9/]+|time:|thrpt:" | tee -a "$out/bench.txt"
else
  cargo bench --bench vocab 2>&1 | grep -E "^[a-zA-Z_0-9/]+|time:|thrpt:" | tee -a "$out/bench.txt"
fi
echo "results in $out/"
