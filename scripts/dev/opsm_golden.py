#!/usr/bin/env python3
"""Golden vectors for `rollout_rs: "opsm"` from slime's own `compute_opsm_mask`.

The function is read at generation time from a slime checkout or git directory
(`--slime`, e.g. a clone of https://github.com/THUDM/slime; the file
`slime/utils/ppo_utils.py`), extracted with `ast` and run with torch: nothing of slime is
vendored. slime's arguments map to trmask's tensors as `full_old_log_probs` = the rollout's
log-probs (slime's `--use-rollout-logprobs`), `full_log_probs` = the trainer's, so its
`seq_kl` is the mean of log(pi_roll / pi_train) over a sequence's valid tokens.

Writes data/opsm/golden.json: packed lengths, both log-probs, per-token advantages (one value
per sequence, GRPO-style, in `cases`), and per threshold slime's per-token keep mask; plus one
case with per-token advantages that change sign inside a sequence, where slime masks single
tokens (its per-token sign test) and trmask rejects whole sequences.

Usage: python3 scripts/dev/opsm_golden.py --slime /path/to/slime [--commit REV] [--out data/opsm/golden.json]
"""
import argparse
import ast
import json
import subprocess
from argparse import Namespace
from pathlib import Path

import numpy as np
import torch

SRC = "slime/utils/ppo_utils.py"


def slime_source(root: str, commit: str) -> tuple[str, str]:
    p = Path(root)
    if (p / SRC).exists():
        return (p / SRC).read_text(), "working tree"
    git = ["git", "--git-dir", str(p)] if not (p / ".git").exists() else ["git", "-C", str(p)]
    rev = subprocess.check_output(git + ["rev-parse", commit], text=True).strip()
    return subprocess.check_output(git + ["show", f"{rev}:{SRC}"], text=True), rev


def load_function(src: str, name: str):
    tree = ast.parse(src)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    mod = ast.Module(body=[fn], type_ignores=[])
    ns = {"torch": torch, "Namespace": Namespace}
    exec(compile(mod, SRC, "exec"), ns)
    return ns[name]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slime", required=True)
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--out", default="data/opsm/golden.json")
    a = ap.parse_args()
    src, rev = slime_source(a.slime, a.commit)
    opsm = load_function(src, "compute_opsm_mask")

    rng = np.random.default_rng(20261204)
    lengths = [0, 1, 3, 17, 40, 64, 5, 128, 33, 2, 90, 12]
    n = sum(lengths)
    rollout = rng.uniform(-6.0, -0.01, n)
    # per-sequence drift scale so that sequence means of log(pi_roll/pi_train) straddle the thresholds
    scale = np.array([0.0, 0.3, 1e-3, 0.02, 0.1, 0.3, 0.02, 0.1, 0.3, 1e-3, 0.02, 0.1])
    bias = np.abs(rng.normal(0.0, 1.0, len(lengths))) * scale * np.where(np.arange(len(lengths)) % 4 == 3, -1.0, 1.0)
    drift = np.concatenate([b + s * rng.normal(0.0, 1.0, l) for b, s, l in zip(bias, scale, lengths)])
    old = rollout - drift  # log pi_train; -lr = log pi_roll - log pi_train = drift
    seq_adv = rng.normal(0.0, 1.0, len(lengths))
    seq_adv[3] = -1.5
    seq_adv[5] = 0.0  # zero advantage: never rejected
    thresholds = [1e-4, 1e-3, 0.01, 0.05]

    def run(adv_tok, delta):
        cuts = np.cumsum([0] + lengths)
        t = lambda v: [torch.tensor(v[cuts[i]:cuts[i + 1]], dtype=torch.float64) for i in range(len(lengths))]
        masks = [torch.ones(l, dtype=torch.float64) for l in lengths]
        m, frac = opsm(Namespace(opsm_delta=delta), t(old), t(rollout), t(adv_tok), masks)
        return m.tolist(), float(frac)

    adv = np.concatenate([np.full(l, s) for s, l in zip(seq_adv, lengths)])
    seq_mean = [float(np.mean(drift[c:c + l])) if l else 0.0 for c, l in zip(np.cumsum([0] + lengths), lengths)]
    for d in thresholds:
        for m in seq_mean:
            assert abs(m - d) > 1e-9 * max(1.0, d), "a sequence mean sits on a threshold"
    cases = {}
    for d in thresholds:
        keep, frac = run(adv, d)
        cases[repr(d)] = {"keep": keep, "clipfrac": frac}
    # per-token advantages changing sign inside sequence 8 (33 tokens, mean log-ratio 0.25 > delta;
    # the advantages' mean is negative)
    adv_tok = adv.copy()
    c8 = sum(lengths[:8])
    adv_tok[c8:c8 + lengths[8]] = np.where(np.arange(lengths[8]) % 3 == 0, 1.0, -1.0)
    keep_tok, _ = run(adv_tok, 1e-4)
    out = {
        "source": f"THUDM/slime {SRC} compute_opsm_mask @ {rev}",
        "generator": "scripts/dev/opsm_golden.py",
        "torch": torch.__version__,
        "lengths": lengths,
        "rollout_log_prob": rollout.tolist(),
        "old_log_prob": old.tolist(),
        "advantages": adv.tolist(),
        "seq_mean_log_ratio_roll_over_train": seq_mean,
        "thresholds": thresholds,
        "cases": cases,
        "per_token_sign": {"delta": 1e-4, "advantages": adv_tok.tolist(), "slime_keep": keep_tok},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out) + "\n")
    print(f"wrote {a.out}: {n} tokens, {len(lengths)} sequences, source {rev}")
    for d in thresholds:
        k = cases[repr(d)]["keep"]
        print(f"  delta {d}: {len(k) - int(sum(k))} tokens masked")


if __name__ == "__main__":
    main()
