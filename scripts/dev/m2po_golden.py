#!/usr/bin/env python3
"""Golden vectors for `rollout_rs: "m2po"` from the reference implementations' own code.

Two functions are read at generation time from git checkouts or git directories, extracted
with `ast` and run with torch (nothing of either project is vendored):

* the M2PO authors' `_get_trust_region_tokens_delta_sq` (Infini-AI-Lab/M2PO,
  `verl/trainer/ppo/core_algos.py`; `--m2po`): the trust-region tokens of the paper's
  Algorithm 1, the active quadrants (A > 0 and r > 1, or A < 0 and r < 1). It returns their
  (log r)^2 without positions: the generator checks that its multiset equals the slots the
  golden marks active (per-sequence advantages, so the authors' `advantages[:, 0]` is each
  token's advantage).
* AReaL's `_apply_m2po_masking` (inclusionAI/AReaL, `areal/trainer/ppo/actor.py`; `--areal`):
  the paper's Algorithm 1 loop as a sort and suffix means, run with `loss_mask` = the active
  slots, so it drops the active tokens with the largest (log r)^2 until the mean of the rest
  falls below the threshold. Where AReaL differs from Algorithm 1 (strict `<` against the
  threshold; all-but-one kept when every suffix mean exceeds it) the generator asserts that
  no case reaches the difference.

Arguments map to trmask's tensors as: the authors' `old_log_prob` and AReaL's `old_logp` =
the rollout's log-probs (the behaviour policy), the authors' `log_prob` and AReaL's
`prox_logp` = the trainer's (`old_log_prob`), so log r = lr = log pi_train - log pi_roll.

Writes data/m2po/golden.json: packed lengths (one empty sequence), both log-probs, per-token
advantages (one value per sequence, two sequences with advantage 0), and per threshold the
per-token keep mask (0 = dropped by M2PO).

Usage: python3 scripts/dev/m2po_golden.py --m2po /path/to/M2PO --areal /path/to/AReaL
       [--m2po-commit REV] [--areal-commit REV] [--out data/m2po/golden.json]
"""
import argparse
import ast
import json
import subprocess
from pathlib import Path

import numpy as np
import torch

M2PO_SRC = "verl/trainer/ppo/core_algos.py"
AREAL_SRC = "areal/trainer/ppo/actor.py"


def source(root: str, commit: str, path: str) -> tuple[str, str]:
    p = Path(root)
    git = ["git", "--git-dir", str(p)] if not (p / ".git").exists() else ["git", "-C", str(p)]
    rev = subprocess.check_output(git + ["rev-parse", commit], text=True).strip()
    return subprocess.check_output(git + ["show", f"{rev}:{path}"], text=True), rev


def load(src: str, names: list[str], path: str) -> dict:
    tree = ast.parse(src)
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {f.name for f in fns} == set(names), f"{path}: missing one of {names}"
    ns = {"torch": torch}
    exec(compile(ast.Module(body=fns, type_ignores=[]), path, "exec"), ns)
    return ns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m2po", required=True)
    ap.add_argument("--m2po-commit", default="HEAD")
    ap.add_argument("--areal", required=True)
    ap.add_argument("--areal-commit", default="HEAD")
    ap.add_argument("--out", default="data/m2po/golden.json")
    a = ap.parse_args()
    src, m2po_rev = source(a.m2po, a.m2po_commit, M2PO_SRC)
    tr_tokens = load(src, ["_get_trust_region_tokens_delta_sq"], M2PO_SRC)["_get_trust_region_tokens_delta_sq"]
    src, areal_rev = source(a.areal, a.areal_commit, AREAL_SRC)
    areal = load(src, ["_apply_m2po_masking", "_get_m2po_loss_mask"], AREAL_SRC)["_apply_m2po_masking"]

    rng = np.random.default_rng(20261205)
    lengths = [0, 1, 3, 17, 40, 64, 5, 128, 33, 2, 90, 12, 57, 21]
    b, t, n = len(lengths), max(lengths), sum(lengths)
    rollout = rng.uniform(-6.0, -0.01, n)
    # per-sequence drift scales, a heavy tail (Student t, 2 degrees of freedom) so that a few
    # tokens dominate the second moment, as stale rollouts do
    scale = np.array([0.0, 0.3, 0.05, 0.1, 0.2, 0.05, 0.4, 0.1, 0.3, 0.05, 0.15, 0.2, 0.1, 0.25])
    drift = np.concatenate([s * rng.standard_t(2.0, l) for s, l in zip(scale, lengths)])
    old = rollout + drift  # lr = old - rollout
    lr = old - rollout
    seq_adv = rng.normal(0.0, 1.0, b)
    seq_adv[4] = 0.0  # zero advantage: no active token
    seq_adv[11] = 0.0
    adv = np.concatenate([np.full(l, s) for s, l in zip(seq_adv, lengths)])
    active = ((adv > 0) & (lr > 0)) | ((adv < 0) & (lr < 0))
    v = lr[active] ** 2
    assert len(np.unique(v)) == len(v), "tied active values"

    # the authors' trust-region tokens (padded, right-aligned responses)
    cuts = np.cumsum([0] + lengths)
    pad = lambda x, fill: torch.tensor(
        np.stack([np.concatenate([x[cuts[i]:cuts[i + 1]], np.full(t - lengths[i], fill)]) for i in range(b)]),
        dtype=torch.float64,
    )
    mask = pad(np.ones(n), 0.0)
    adv_pad = torch.tensor(np.repeat(seq_adv[:, None], t, axis=1), dtype=torch.float64)
    theirs = tr_tokens(pad(rollout, -1.0), pad(old, -1.0), adv_pad, mask).numpy()
    assert np.array_equal(np.sort(theirs), np.sort(v)), "active quadrants differ from the authors'"

    thresholds = [1e-3, 3e-3, 0.01, 0.04, 0.07, 0.1]
    active_pad = pad(active.astype(float), 0.0).bool()
    cases = {}
    for tau in thresholds:
        # Algorithm 1 (<= tau, may drop every active token) against AReaL (< tau, keeps one)
        s = np.sort(v)[::-1]
        suffix = np.cumsum(s[::-1])[::-1] / np.arange(len(s), 0, -1)
        assert np.all(np.abs(suffix - tau) > 1e-12 * tau), f"a suffix mean sits on tau {tau}"
        assert suffix[-1] < tau, f"every active token exceeds tau {tau}: AReaL keeps one"
        kept = areal(pad(rollout, -1.0), pad(old, -1.0), active_pad, tau)
        keep = np.ones(n)
        for i in range(b):
            row = kept[i, : lengths[i]].numpy()
            act = active[cuts[i]:cuts[i + 1]]
            keep[cuts[i]:cuts[i + 1]][act & ~row] = 0.0
        k = int(n - keep.sum())
        cases[repr(tau)] = {
            "keep": keep.tolist(),
            "dropped": k,
            "m2": float(v.mean()),
            "m2_after": float(suffix[k]) if k < len(v) else 0.0,
        }
    out = {
        "source": {
            "trust_region_tokens": f"Infini-AI-Lab/M2PO {M2PO_SRC} _get_trust_region_tokens_delta_sq @ {m2po_rev}",
            "masking": f"inclusionAI/AReaL {AREAL_SRC} _apply_m2po_masking @ {areal_rev}",
        },
        "generator": "scripts/dev/m2po_golden.py",
        "torch": torch.__version__,
        "lengths": lengths,
        "rollout_log_prob": rollout.tolist(),
        "old_log_prob": old.tolist(),
        "advantages": adv.tolist(),
        "active": int(active.sum()),
        "thresholds": thresholds,
        "cases": cases,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out) + "\n")
    print(f"wrote {a.out}: {n} tokens, {b} sequences, {int(active.sum())} active, m2 {v.mean():.6g}")
    print(f"  M2PO {m2po_rev}, AReaL {areal_rev}")
    for tau in thresholds:
        c = cases[repr(tau)]
        print(f"  tau {tau}: {c['dropped']} dropped, m2 after {c['m2_after']:.6g}")


if __name__ == "__main__":
    main()
