"""Routing statistics throughput: trmask against a vectorised NumPy implementation of the same
definitions (docs/FORMAT.md, MoE routing), on one synthetic batch, in one run.

    python python/bench/routing.py                      # 64 x 4096 tokens, L = 48, K = 8
    python python/bench/routing.py --batch 8 --seq 512  # a quick check

The batch: B responses of T slots (lengths uniform in [T/2, T], garbage at padding), L MoE
layers routing each token to K distinct experts of E (default 128: Qwen3-30B-A3B's 48 x 8 of
128); the trainer's sets equal the rollout's (in reversed order) except on ~1% of (token,
layer) rows where one expert differs; ~1% of rows unrecorded (-1). Both sides int32.

Timed (wall clock, best of --repeat, the three alternating): trmask — `trmask.analyze` on the
batch with both log-probs and both routing tensors (everything it computes: validation, the
per-token outputs, the statistics table, the `trmask/routing/*` metrics, the outputs returned
to Python), and the same call without the routing tensors (the difference is what routing
adds); NumPy — validation (ids >= -1, no duplicate in a row), the per-token
`route_overlap`, `route_flip`, `route_first_layer` and every `trmask/routing/*` metric, in
chunks of tokens. Both results are checked against each other before any timing counts.
"""

import argparse
import json
import time

import numpy as np

import trmask


def synth(b, t, layers, k, experts, seed=0):
    rng = np.random.default_rng(seed)
    lens = rng.integers(t // 2, t + 1, size=b)
    mask = (np.arange(t)[None, :] < lens[:, None]).astype(np.float32)
    shape = (b, t, layers)
    start = rng.integers(0, experts, size=shape, dtype=np.int32)
    step = (2 * rng.integers(0, experts // 2, size=shape, dtype=np.int32) + 1).astype(np.int32)
    j = np.arange(k + 1, dtype=np.int32)
    ids = (start[..., None] + j * step[..., None]) % experts  # k + 1 distinct ids per row
    roll = np.ascontiguousarray(ids[..., :k])
    old = roll[..., ::-1].copy()  # the same sets, another order
    flip = rng.random(shape) < 0.01
    old[..., 0] = np.where(flip, ids[..., k], old[..., 0])
    roll[rng.random(shape) < 0.005] = -1
    old[rng.random(shape) < 0.005] = -1
    pad = mask == 0
    roll[pad] = rng.integers(-3, experts, size=(int(pad.sum()), layers, k), dtype=np.int32)
    lr = rng.normal(-1.0, 0.5, size=(b, t)).astype(np.float32)
    return {
        "rollout_log_prob": lr,
        "old_log_prob": (lr + rng.normal(0, 0.01, size=(b, t))).astype(np.float32),
        "response_mask": mask,
        "rollout_routed_experts": roll,
        "old_routed_experts": old,
    }


def numpy_routing(batch, chunk=4096):
    """The definitions, vectorised: per-token outputs (valid tokens, in order) and metrics."""
    valid = batch["response_mask"].astype(bool)
    roll = batch["rollout_routed_experts"][valid]
    old = batch["old_routed_experts"][valid]
    lr = (batch["old_log_prob"].astype(np.float64) - batch["rollout_log_prob"])[valid]
    n, layers, k = roll.shape
    overlap = np.empty(n)
    flip = np.empty(n, dtype=bool)
    first = np.empty(n, dtype=np.int64)
    recorded = np.empty(n, dtype=bool)
    inter_l = np.zeros(layers, dtype=np.int64)
    pairs_l = np.zeros(layers, dtype=np.int64)
    for a in range(0, n, chunk):
        r, o = roll[a : a + chunk], old[a : a + chunk]
        for side, name in ((r, "rollout_routed_experts"), (o, "old_routed_experts")):
            if (side < -1).any():
                raise ValueError(f"{name}: id below -1")
            s = np.sort(side, axis=-1)
            if ((s[..., 1:] == s[..., :-1]) & (s[..., 1:] >= 0)).any():
                raise ValueError(f"{name}: duplicate id")
        rec = (r >= 0).all(-1) & (o >= 0).all(-1)
        inter = (r[..., :, None] == o[..., None, :]).any(-1).sum(-1)
        n_rec = rec.sum(-1)
        osum = np.where(rec, inter, 0).sum(-1) / k
        overlap[a : a + chunk] = np.where(n_rec > 0, osum / np.maximum(n_rec, 1), 1.0)
        diff = rec & (inter < k)
        flip[a : a + chunk] = diff.any(-1)
        first[a : a + chunk] = np.where(diff.any(-1), diff.argmax(-1), -1)
        recorded[a : a + chunk] = n_rec > 0
        inter_l += np.where(rec, inter, 0).sum(0)
        pairs_l += rec.sum(0)
    k3 = np.expm1(lr) - lr
    fl, uf = recorded & flip, recorded & ~flip
    m = {
        "trmask/routing/overlap_mean": inter_l.sum() / (k * pairs_l.sum()),
        "trmask/routing/token_flip_fraction": fl.sum() / recorded.sum(),
        "trmask/routing/unrecorded_fraction": (n * layers - pairs_l.sum()) / (n * layers),
        "trmask/routing/abs_log_ratio_flipped_mean": np.abs(lr[fl]).mean(),
        "trmask/routing/abs_log_ratio_unflipped_mean": np.abs(lr[uf]).mean(),
        "trmask/routing/k3_share_flipped": k3[fl].sum() / k3[recorded].sum(),
    }
    for li in range(layers):
        m[f"trmask/routing/layer/{li}/overlap_mean"] = inter_l[li] / (k * pairs_l[li])
    return (overlap, flip, first), m


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    batch = synth(a.batch, a.seq, a.layers, a.top_k, a.experts)
    valid = batch["response_mask"].astype(bool)
    tokens = int(valid.sum())
    # one untimed run of each, checked against each other
    (ov, fl, first), want = numpy_routing(batch)
    out = trmask.analyze(batch, backend="cpu")
    got = out["metrics"]
    for key, v in want.items():
        assert abs(got[key] - v) <= 1e-9 * abs(v), (key, got[key], v)
    assert np.array_equal(out["outputs"]["route_overlap"][valid], ov)
    assert np.array_equal(out["outputs"]["route_flip"][valid], fl.astype(np.float64))
    assert np.array_equal(out["outputs"]["route_first_layer"][valid], first.astype(np.float64))
    # the same analysis without the routing tensors: what routing adds is the difference
    base = {k: v for k, v in batch.items() if "routed" not in k}
    times = {"trmask": [], "trmask_without_routing": [], "numpy": []}
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        trmask.analyze(batch, backend="cpu")
        times["trmask"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        numpy_routing(batch)
        times["numpy"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        trmask.analyze(base, backend="cpu")
        times["trmask_without_routing"].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    routing = best["trmask"] - best["trmask_without_routing"]
    res = {
        "shape": [a.batch, a.seq, a.layers, a.top_k],
        "experts": a.experts,
        "valid_tokens": tokens,
        "best_s": best,
        "all_s": times,
        "tokens_per_s": {k: tokens / v for k, v in best.items()},
        "speedup": best["numpy"] / best["trmask"],
        "speedup_routing_share": best["numpy"] / routing,
        "flipped_fraction": float(want["trmask/routing/token_flip_fraction"]),
    }
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(
            f"{tokens} valid tokens, L = {a.layers}, K = {a.top_k}, {a.experts} experts, best of "
            f"{a.repeat}: trmask {best['trmask']:.3f} s ({res['tokens_per_s']['trmask']:.3e} "
            f"tokens/s), NumPy {best['numpy']:.3f} s ({res['tokens_per_s']['numpy']:.3e} "
            f"tokens/s): {res['speedup']:.1f}x the whole analysis, {res['speedup_routing_share']:.1f}x "
            f"its routing share (analysis without the routing tensors "
            f"{best['trmask_without_routing']:.3f} s)"
        )


if __name__ == "__main__":
    main()
