"""What `trmask.Monitor.step` costs over the bare drop-in call, on one [B, T] float32 step (no
report page due): the bare call with verl's metrics only (the fused lean pass), the bare call
with trmask's metrics (`trmask_metrics=True`: what the Monitor computes and logs, histograms
included), and `Monitor.step` (that call, plus the JSONL line, the TensorBoard event and, when
a wandb run is active, `wandb.log`). The three are called in turn, `--repeat` rounds; best and
median per column; Markdown on stdout.

    RAYON_NUM_THREADS=2 python python/bench/monitor_cost.py --batch 256 --seq 4096 --repeat 9
"""

import argparse
import statistics
import tempfile
import time

import numpy as np

import trmask


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--backend", default="cpu")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    b, t = a.batch, a.seq
    old = -np.abs(rng.normal(1.0, 0.5, (b, t))).astype(np.float32)
    roll = np.minimum(old + rng.normal(0, 0.01, (b, t)).astype(np.float32), -1e-6)
    lens = rng.integers(t // 4, t + 1, b)
    mask = (np.arange(t)[None, :] < lens[:, None]).astype(np.float32)
    cfg = dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01)
    f = trmask.compute_rollout_correction_and_rejection_mask
    with tempfile.TemporaryDirectory() as d:
        mon = trmask.Monitor(d, config=cfg, report_every=0, backend=a.backend)
        calls = {
            "bare, verl metrics (lean pass)": lambda i: f(old, roll, mask, backend=a.backend, **cfg),
            "bare, trmask_metrics=True": lambda i: f(old, roll, mask, backend=a.backend, trmask_metrics=True, **cfg),
            "Monitor.step": lambda i: mon.step(i, old, roll, mask),
        }
        times = {k: [] for k in calls}
        for k, c in calls.items():
            c(0)  # warm: engines, correctors, the data-warning check
        for i in range(1, a.repeat + 1):
            for k, c in calls.items():
                t0 = time.perf_counter()
                c(i)
                times[k].append(time.perf_counter() - t0)
        mon.close()
    ref = min(times["bare, trmask_metrics=True"])
    print(f"`{b} × {t}` float32, token TIS 2.0 + `seq_mean_k3` 0.01, backend={trmask.backend_name(a.backend)!r}; best / median of {a.repeat}, alternating")
    print()
    print("| call | best | median | best / bare (trmask_metrics) |")
    print("|---|---|---|---|")
    for k, v in times.items():
        print(f"| {k} | {min(v) * 1e3:.2f} ms | {statistics.median(v) * 1e3:.2f} ms | {min(v) / ref:.2f}× |")


if __name__ == "__main__":
    main()
