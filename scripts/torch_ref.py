#!/usr/bin/env python3
"""PyTorch baselines for BENCHMARKS.md (used by scripts/gpu-bench.sh and by hand).

  torch_ref.py file FILE [--device cpu|cuda] [--reps N]
      Reads rollout_logits / old_logits from a safetensors FILE (as `trmask analyze` does) and
      computes per-row log_softmax (f32) + KL(p||q), timed from opening the file to the result
      (after `import torch`); prints one line `torch_file_seconds S` per repetition.
  torch_ref.py vocab ROWS VOCAB [--device cpu|cuda] [--reps N]
      The same computation (plus reverse KL, both entropies, TV and the sampled-token gather:
      everything the vocab kernel returns) on random bf16 logits already in memory / on the
      device; CUDA timed with events. Prints the median and GB/s of logits read.
"""
import json
import statistics
import sys
import time

import torch


def read_pair(path, device):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    base = 8 + n
    out = []
    for name in ("rollout_logits", "old_logits"):
        e = header[name]
        assert e["dtype"] == "BF16", e["dtype"]
        lo, hi = e["data_offsets"]
        # memory-mapped, like trmask: torch.from_file maps the whole file, slice the tensor
        total = (base + hi + 1) // 2
        t = torch.from_file(path, shared=False, size=total, dtype=torch.bfloat16)
        assert (base + lo) % 2 == 0
        t = t[(base + lo) // 2:(base + hi) // 2].view(*e["shape"])
        out.append(t.to(device))
    return out


def kl_rows(a, b):
    la = torch.log_softmax(a.float(), dim=-1)
    lb = torch.log_softmax(b.float(), dim=-1)
    return (la.exp() * (la - lb)).sum(-1)


def everything(a, b, ids):
    la = torch.log_softmax(a.float(), dim=-1)
    lb = torch.log_softmax(b.float(), dim=-1)
    p, q = la.exp(), lb.exp()
    kl = (p * (la - lb)).sum(-1)
    klr = (q * (lb - la)).sum(-1)
    ha = -(p * la).sum(-1)
    hb = -(q * lb).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    lp = la.gather(-1, ids[:, None])
    lq = lb.gather(-1, ids[:, None])
    return kl, klr, ha, hb, tv, lp, lq


def main():
    args = sys.argv[1:]
    device = "cpu"
    reps = 3
    if "--device" in args:
        i = args.index("--device")
        device = args[i + 1]
        del args[i:i + 2]
    if "--reps" in args:
        i = args.index("--reps")
        reps = int(args[i + 1])
        del args[i:i + 2]
    if args[0] == "file":
        for _ in range(reps):
            t = time.perf_counter()
            a, b = read_pair(args[1], device)
            kl = kl_rows(a, b)
            if device == "cuda":
                torch.cuda.synchronize()
            s = float(kl.sum())
            print(f"torch_file_seconds {time.perf_counter() - t:.4f} (sum kl {s:.6g})", flush=True)
        return
    rows, vocab = int(args[1]), int(args[2])
    g = torch.Generator(device=device).manual_seed(1)
    a = (3 * torch.randn(rows, vocab, device=device, generator=g)).to(torch.bfloat16)
    b = (a.float() + 0.05 * torch.randn(rows, vocab, device=device, generator=g)).to(torch.bfloat16)
    ids = torch.randint(0, vocab, (rows,), device=device, generator=g)
    nbytes = 2 * rows * vocab * 2
    times = []
    for k in range(reps + 1):
        if device == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            everything(a, b, ids)
            e.record()
            torch.cuda.synchronize()
            dt = s.elapsed_time(e) / 1e3
        else:
            t = time.perf_counter()
            everything(a, b, ids)
            dt = time.perf_counter() - t
        if k > 0:
            times.append(dt)
    m = statistics.median(times)
    print(f"| PyTorch {device} ({torch.get_num_threads()} threads), log_softmax + KL, KL_rev, "
          f"entropies, TV, gather, {rows} x {vocab} BF16 | {m * 1e3:.2f} ms | "
          f"{nbytes / m / 1e9:.2f} GB/s |", flush=True)


if __name__ == "__main__":
    main()
