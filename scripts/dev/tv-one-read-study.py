#!/usr/bin/env python3
"""How many rows could a one-read vocabulary kernel finish without re-reading them for TV?

Usage: scripts/dev/tv-one-read-study.py FILE.safetensors [FILE …] [--rows N] [--block B]

For each row pair (rollout_logits, old_logits; temperature 1) this computes, in float64 with
numpy, what a one-read kernel would know at the end of the row and whether that bounds TV within
a quarter of the tolerance of docs/FORMAT.md (Accuracy) (5e-4·TV + 2.5e-8), the rest being left for f32 rounding:

* the log-normaliser difference λ0 estimated from the row's first B entries (default 2,048;
  B = 256 threads × 8), against the exact λ known at the end (δ = λ − λ0);
* every one of the 256 threads (entry i goes to thread i mod 256) keeps its largest-p entry
  exact, so those terms are computed with the exact λ at the end;
* the other terms are summed as p_i·|e^{x_i}·s − 1| with x_i = log(q_i/p_i) at λ0 and
  s = e^{δ} unknown during the pass:
  - "first order": the sum at s = 1 and its slope; the error is at most 2(e^{|δ|} − 1) times
    the mass whose |x| lies within |δ| (measured in windows 1e-7, 1e-6, …, 1);
  - "grid h": the sum and its slope at 17 points s_k = e^{±h·4^j} (j = 0..7) and s = 1; the
    sum is convex in s, so between grid points it lies between the chord and the tangents.

It prints, per file and scheme, the rows whose bound passes and the median |δ|. The figures of
BENCHMARKS.md ("Why a one-read TV is hard") come from this script.
"""
import argparse
import json
import struct

import numpy as np

THREADS = 256


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        data = raw[8 + n + start:8 + n + end]
        if info["dtype"] == "BF16":
            a = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F16":
            a = np.frombuffer(data, np.float16)
        elif info["dtype"] == "F32":
            a = np.frombuffer(data, np.float32)
        else:
            continue
        out[name] = a.astype(np.float64).reshape(info["shape"])
    return out


def lse(x):
    x = x[np.isfinite(x)]
    m = x.max()
    return m + np.log(np.exp(x - m).sum())


def row_bounds(a, b, block, grids):
    common = np.isfinite(a) & np.isfinite(b)
    la, lb = lse(a), lse(b)
    p, q = np.exp(a - la), np.exp(b - lb)
    tv = 0.5 * np.abs(p - q).sum()
    lam0 = lse(a[:block]) - lse(b[:block])
    delta = (la - lb) - lam0
    idx = np.arange(len(a))
    exact = np.zeros(len(a), bool)
    pc = np.where(common, p, -1.0)
    for t in range(THREADS):
        mine = idx[idx % THREADS == t]
        if len(mine):
            exact[mine[np.argmax(pc[mine])]] = True
    rest = common & ~exact
    x = (b - a + lam0)[rest]
    pr = p[rest]
    bounds = {}
    taus = 10.0 ** np.arange(-7, 1)
    if abs(delta) <= taus[-1]:
        tau = taus[np.searchsorted(taus, abs(delta))]
        near = pr[np.abs(x) <= tau].sum()
        bounds["first order"] = np.expm1(abs(delta)) * near
    else:
        bounds["first order"] = np.inf
    ex = np.exp(x)
    for h in grids:
        ks = np.concatenate([-h * 4.0 ** np.arange(8)[::-1], [0.0], h * 4.0 ** np.arange(8)])
        s = np.exp(ks)
        vals = np.array([(pr * np.abs(ex * sk - 1)).sum() for sk in s])
        slopes = np.array([(pr * np.sign(ex * sk - 1) * ex).sum() for sk in s])
        st = np.exp(delta)
        k = np.searchsorted(s, st) - 1
        if k < 0 or k >= len(s) - 1:
            bounds[f"grid {h:g}"] = np.inf
            continue
        upper = vals[k] + (vals[k + 1] - vals[k]) * (st - s[k]) / (s[k + 1] - s[k])
        lower = max(vals[k] + slopes[k] * (st - s[k]), vals[k + 1] - slopes[k + 1] * (s[k + 1] - st))
        bounds[f"grid {h:g}"] = 0.5 * (upper - lower)
    return tv, delta, bounds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--rows", type=int, default=200, help="rows per file (default 200)")
    ap.add_argument("--block", type=int, default=THREADS * 8)
    args = ap.parse_args()
    grids = [3e-5, 1e-4, 3e-4]
    for path in args.files:
        d = load(path)
        a_all, b_all = d["rollout_logits"], d["old_logits"]
        n = min(len(a_all), args.rows)
        passed, deltas = {}, []
        for r in range(n):
            tv, delta, bounds = row_bounds(a_all[r], b_all[r], args.block, grids)
            deltas.append(abs(delta))
            for name, bound in bounds.items():
                passed[name] = passed.get(name, 0) + (bound <= 5e-4 * tv + 2.5e-8)
        print(f"{path}: {n} rows of {a_all.shape[1]}, median |delta| {np.median(deltas):.2e}")
        for name, k in passed.items():
            print(f"  {name:>12}: {k}/{n} rows bounded ({100 * k / n:.0f} %)")


if __name__ == "__main__":
    main()
