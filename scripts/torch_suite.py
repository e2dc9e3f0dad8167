#!/usr/bin/env python3
"""PyTorch CUDA peer for `gpu_bench --suite` (called by the suite; also by hand).

  torch_suite.py ROWS VOCAB DTYPE [--reps N]

Random logits of DTYPE (bf16 / f16 / f32) made on the GPU, trainer = rollout + 0.05 noise,
then everything the vocabulary kernel returns (log_softmax of both rows in f32, KL, KL_rev,
both entropies, TV, the sampled-token log-probs: scripts/torch_ref.py's `everything`) timed
with CUDA events, eager and fused by `torch.compile` (Inductor; its compile time is not
timed). Prints one JSON line: {"device", "torch", "rows", "vocab", "dtype", "eager_ms",
"compiled_ms" (null with "compile_error" when compiling fails), "gb_per_s_eager"}.
Exits 3 without torch or CUDA.
"""
import json
import os
import statistics
import sys

try:
    import torch
except ImportError:
    print("no torch", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ref import everything  # noqa: E402


def timed(fn, args, reps):
    for _ in range(2):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*args)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def main():
    args = sys.argv[1:]
    reps = 10
    if "--reps" in args:
        i = args.index("--reps")
        reps = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    rows, vocab, name = int(args[0]), int(args[1]), args[2]
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]
    if not torch.cuda.is_available():
        print("no CUDA", file=sys.stderr)
        sys.exit(3)
    g = torch.Generator(device="cuda").manual_seed(1)
    a = (3 * torch.randn(rows, vocab, device="cuda", generator=g)).to(dtype)
    b = (a.float() + 0.05 * torch.randn(rows, vocab, device="cuda", generator=g)).to(dtype)
    ids = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": rows,
        "vocab": vocab,
        "dtype": name,
    }
    eager = timed(everything, (a, b, ids), reps)
    out["eager_ms"] = eager
    out["gb_per_s_eager"] = 2 * a.numel() * a.element_size() / (eager * 1e-3) / 1e9
    try:
        fused = torch.compile(everything)
        out["compiled_ms"] = timed(fused, (a, b, ids), reps)
    except Exception as e:  # noqa: BLE001 (Inductor needs a compiler toolchain; report why not)
        out["compiled_ms"] = None
        out["compile_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
