"""The host round trip a GPU trainer pays: trmask's drop-in on CUDA tensors (copied to host,
computed, outputs copied back) against verl's own function on the same CUDA tensors, the 9
cells of verl_real.py (3 shapes × 3 configs), timed with CUDA events around each call (the
device synchronised after it, since the outputs must be on the device). Also the drop-in on
the same tensors already on the host, so the round trip's share shows. Markdown on stdout.
Needs torch with CUDA and verl's wheel (`pip install --no-deps verl==0.9.1`); run by
scripts/gpu-bench.sh on a lent GPU machine.

    python python/bench/verl_cuda.py --repeat 7
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from verl_real import CONFIGS, SHAPES, agree, batch, load_verl  # noqa: E402


def cuda_ms(fn, repeat):
    """CUDA-event milliseconds of `fn()` per call (best, median of `repeat`)."""
    out = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return min(out), float(np.median(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in SHAPES))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("verl_cuda.py: no CUDA device")
    verl_fn, version = load_verl()
    import trmask

    f = trmask.compute_rollout_correction_and_rejection_mask
    dev = torch.device("cuda", torch.cuda.current_device())
    print(f"verl {version}, torch {torch.__version__}, {torch.cuda.get_device_name(dev)}; trmask "
          f"backend={a.backend!r}: {trmask.backend_name(a.backend)}; CUDA events, best / median of {a.repeat}")
    print()
    print("| batch | config | verl (CUDA) | trmask on CUDA tensors | trmask on host tensors | round trip (best) | verl / trmask (best) |")
    print("|---|---|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        b, t = (int(x) for x in shape.split("x"))
        host = batch(b, t)
        cuda = tuple(x.to(dev) for x in host)
        for label, cfg in CONFIGS:
            with torch.no_grad():
                ref = verl_fn(*cuda, **cfg)
                got = f(*cuda, **cfg, backend=a.backend)
                assert got[1].device == dev
                agree(ref, got)
                v = cuda_ms(lambda: verl_fn(*cuda, **cfg), a.repeat)
                tc = cuda_ms(lambda: f(*cuda, **cfg, backend=a.backend), a.repeat)
                th = cuda_ms(lambda: f(*host, **cfg, backend=a.backend), a.repeat)
            print(f"| {b} × {t} | {label} | {v[0]:.2f} / {v[1]:.2f} ms | {tc[0]:.2f} / {tc[1]:.2f} ms | "
                  f"{th[0]:.2f} / {th[1]:.2f} ms | {tc[0] - th[0]:.2f} ms | {v[0] / tc[0]:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
