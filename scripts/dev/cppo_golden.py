#!/usr/bin/env python3
"""Golden vectors for `rollout_rs: "cppo"` from the CPPO authors' own `_cppo_mask`.

The function is read at generation time from Tencent-Hunyuan/UniRL's
`unirl/algorithms/cppo.py` (`--unirl`: a checkout or git directory, with `--commit`, or the
file itself), extracted with `ast` and run with torch: nothing of UniRL is vendored. Its
arguments map to trmask's tensors as `new_logp` = the trainer's log-probs (pi),
`old_logp` = the rollout's (mu, UniRL's `old_logp_source="rollout"`), `ratio` =
exp(clamp(new - old, +-20)) as its `_cppo_loss` builds it, `lengths` = the packed lengths.

`_cppo_mask` computes in float32 (`.float()`); trmask in float64. The generator asserts that
no outward token's weighted divergence lies within 1e-5 of its threshold (from a float64
transcription) and that no log-ratio is below 1e-6, so both precisions decide alike.

Writes data/cppo/golden.json: packed lengths (one empty sequence), both log-probs,
per-token advantages (one value per sequence, one sequence with advantage 0), and per
parameter set (delta, w_min, delta_b) UniRL's per-token keep mask.

Usage: python3 scripts/dev/cppo_golden.py --unirl /path/to/UniRL [--commit REV] [--out data/cppo/golden.json]
       python3 scripts/dev/cppo_golden.py --unirl cppo.py --commit REV   (the file as of REV)
"""
import argparse
import ast
import json
import subprocess
from pathlib import Path
from typing import List

import numpy as np
import torch

SRC = "unirl/algorithms/cppo.py"


def source(root: str, commit: str) -> tuple[str, str]:
    p = Path(root)
    if p.is_file():
        # the file as stored at `commit` (e.g. `git show REV:unirl/algorithms/cppo.py > cppo.py`)
        return p.read_text(), commit
    git = ["git", "--git-dir", str(p)] if not (p / ".git").exists() else ["git", "-C", str(p)]
    rev = subprocess.check_output(git + ["rev-parse", commit], text=True).strip()
    return subprocess.check_output(git + ["show", f"{rev}:{SRC}"], text=True), rev


def load(src: str):
    tree = ast.parse(src)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_cppo_mask")
    ns = {"torch": torch, "List": List}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), SRC, "exec"), ns)
    return ns["_cppo_mask"]


def reference64(d, outward, delta, w_min, delta_b):
    """float64 Z_t - c_t of one sequence (for the margin check only)."""
    n = len(d)
    w = 1.0 - (1.0 - w_min) * np.arange(n) / max(n - 1, 1)
    z = w * d
    s = np.concatenate([[0.0], np.cumsum(z)[:-1]])
    ws = np.concatenate([[0.0], np.cumsum(w)[:-1]])
    b = np.clip(np.quantile(d, 0.9), delta_b, 2 * delta_b)
    c = np.minimum(delta, delta + b * ws - s)
    return z - c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--unirl", required=True)
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--out", default="data/cppo/golden.json")
    a = ap.parse_args()
    src, rev = source(a.unirl, a.commit)
    cppo_mask = load(src)

    rng = np.random.default_rng(20261206)
    lengths = [0, 1, 2, 5, 30, 64, 17, 128, 9, 48, 3, 80]
    b, n = len(lengths), sum(lengths)
    cuts = np.cumsum([0] + lengths)
    rollout = np.log(rng.uniform(0.03, 0.99, n))
    scale = np.array([0.0, 0.4, 0.2, 0.3, 0.15, 0.25, 0.5, 0.1, 0.35, 0.2, 0.3, 0.3])
    drift = np.concatenate([s * rng.standard_t(3.0, l) for s, l in zip(scale, lengths)])
    old = np.minimum(rollout + drift, -1e-4)  # trainer log-probs stay below 0
    lr = old - rollout
    assert np.all(np.abs(lr) > 1e-6), "a log-ratio too small for float32"
    seq_adv = rng.normal(0.0, 1.0, b)
    seq_adv[9] = 0.0
    adv = np.concatenate([np.full(l, s) for s, l in zip(seq_adv, lengths)])
    outward = adv * lr > 0
    d = np.abs(np.exp(old) - np.exp(rollout))

    params = [(0.15, 0.8, 0.02), (0.2, 0.8, 0.02), (0.05, 0.5, 0.01), (0.3, 1.0, 0.05), (0.1, 0.8, 0.1)]
    t64 = lambda x: torch.tensor(x, dtype=torch.float64)
    ratio = torch.exp(torch.clamp(t64(old) - t64(rollout), min=-20.0, max=20.0))
    cases = {}
    for delta, w_min, delta_b in params:
        for i in range(b):
            sl = slice(cuts[i], cuts[i + 1])
            if lengths[i] == 0:
                continue
            gap = reference64(d[sl], outward[sl], delta, w_min, delta_b)
            assert np.all(np.abs(gap[outward[sl]]) > 1e-5), f"seq {i} sits on its threshold at {delta, w_min, delta_b}"
        keep = cppo_mask(
            new_logp=t64(old),
            old_logp=t64(rollout),
            advantages=t64(adv),
            ratio=ratio,
            lengths=torch.tensor(lengths),
            delta=delta,
            w_min=w_min,
            delta_b=delta_b,
        )
        cases[f"{delta}/{w_min}/{delta_b}"] = {
            "delta": delta,
            "w_min": w_min,
            "delta_b": delta_b,
            "keep": keep.tolist(),
        }
    out = {
        "source": f"Tencent-Hunyuan/UniRL {SRC} _cppo_mask @ {rev}",
        "generator": "scripts/dev/cppo_golden.py",
        "torch": torch.__version__,
        "lengths": lengths,
        "rollout_log_prob": rollout.tolist(),
        "old_log_prob": old.tolist(),
        "advantages": adv.tolist(),
        "outward": int(outward.sum()),
        "cases": list(cases.values()),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out) + "\n")
    print(f"wrote {a.out}: {n} tokens, {b} sequences, {int(outward.sum())} outward, source {rev}")
    for k, c in cases.items():
        print(f"  {k}: {len(c['keep']) - int(sum(c['keep']))} dropped")


if __name__ == "__main__":
    main()
