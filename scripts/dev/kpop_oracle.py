#!/usr/bin/env python3
"""Independent high-precision oracle for KPop (bidirectional binary KL), written from AReaL's
`compute_binary_kl_divergence` / `apply_rejection_sampling(metric="binary_kl")`:

    D_B(p||q) = p*ln(p/q) + (1-p)*ln((1-p)/(1-q)),   keep iff max(D_B(p||q), D_B(q||p)) <= phi

evaluated with mpmath at 60 significant digits on the exact float64 log-probs (so the
complements 1-p, 1-q are exact, unlike AReaL's float32 clamp to [1e-8, 1-1e-8]). The one
clamp kept is trmask's documented edge rule: a log-prob >= 0 (p rounds to 1) counts as
p = 1 - 1e-8 (AReaL's upper clamp). Nothing here imports or mirrors trmask's code.

Writes data/kpop/oracle.json: per-token old_log_prob (p side), rollout_log_prob (q side),
the reference value, per-threshold keep masks, and which tokens have p, q in [1-1e-9, 1).

Usage: kpop_oracle.py [OUT.json] [--seed N]
"""

import json
import random
import sys

import mpmath as mp

mp.mp.dps = 60
FLOOR = mp.mpf("1e-8")
THRESHOLDS = [0.1, 1e-10]
N_TOKENS = 480


def prob(lp):
    """p and 1 - p as exact mpmath numbers from a float64 log-prob (edge rule at lp >= 0)."""
    if lp >= 0.0:
        return 1 - FLOOR, FLOOR
    p = mp.exp(mp.mpf(lp))
    return p, 1 - p


def d_b(p, a, q, b):
    """AReaL's D_B(p||q) with complements a = 1 - p, b = 1 - q."""
    return p * mp.log(p / q) + a * mp.log(a / b)


def kpop(lp, lq):
    p, a = prob(lp)
    q, b = prob(lq)
    return max(d_b(p, a, q, b), d_b(q, b, p, a))


def near_one_lp(rng):
    """A float64 log-prob whose probability lies in [1 - 1e-9, 1): ln(1 - c), c log-uniform."""
    c = mp.mpf(10) ** mp.mpf(rng.uniform(-12.0, -9.0))
    return float(mp.log1p(-c))


def token(rng):
    u = rng.random()
    if u < 0.30:  # both within 1e-9 of 1
        return near_one_lp(rng), near_one_lp(rng)
    if u < 0.40:  # one near 1, the other moderate or also near
        a = near_one_lp(rng)
        b = -rng.uniform(0.0, 0.3) if rng.random() < 0.5 else a * rng.uniform(0.5, 2.0)
        return (a, b) if rng.random() < 0.5 else (b, a)
    if u < 0.80:  # moderate mismatch
        lp = -rng.uniform(0.0, 3.0)
        lq = min(lp + rng.gauss(0.0, 0.4), -1e-6)
        return lp, lq
    if u < 0.90:  # small probabilities
        lp = -rng.uniform(5.0, 40.0)
        return lp, lp + rng.gauss(0.0, 2.0)
    if u < 0.95:  # equal log-probs (D_B = 0 exactly)
        lp = -rng.uniform(0.0, 2.0)
        return lp, lp
    # edge rule: a log-prob of exactly 0 on one or both sides
    other = -rng.uniform(0.0, 0.5) if rng.random() < 0.7 else 0.0
    return (0.0, other) if rng.random() < 0.5 else (other, 0.0)


def main():
    out = "data/kpop/oracle.json"
    seed = 20260823
    args = sys.argv[1:]
    if "--seed" in args:
        i = args.index("--seed")
        seed = int(args[i + 1])
        del args[i : i + 2]
    if args:
        out = args[0]
    rng = random.Random(seed)
    lp, lq, val, near = [], [], [], []
    while len(lp) < N_TOKENS:
        a, b = token(rng)
        v = kpop(a, b)
        # no token within 1e-9 (relative) of a threshold: masks are then exact, not ties
        if any(abs(v - t) <= mp.mpf("1e-9") * t for t in THRESHOLDS):
            continue
        lp.append(a)
        lq.append(b)
        val.append(v)
        near.append(all(-1e-9 <= x < 0.0 and 1 - mp.exp(mp.mpf(x)) <= mp.mpf("1e-9") for x in (a, b)))
    # sequences of random lengths (incl. 1) over the tokens, for the packed layout
    lengths, left = [], N_TOKENS
    while left > 0:
        k = min(left, rng.choice([1, 2, 5, 17, 40]))
        lengths.append(k)
        left -= k
    doc = {
        "description": "KPop oracle (scripts/dev/kpop_oracle.py, mpmath 60 digits): "
        "binary_kl = max(D_B(p||q), D_B(q||p)), p = exp(old_log_prob), q = exp(rollout_log_prob); "
        "log-prob >= 0 counts as p = 1 - 1e-8",
        "seed": seed,
        "thresholds": THRESHOLDS,
        "lengths": lengths,
        "old_log_prob": lp,
        "rollout_log_prob": lq,
        "binary_kl": [float(v) for v in val],
        "binary_kl_str": [mp.nstr(v, 25) for v in val],
        "near_one": near,
        "keep": {repr(t): [int(v <= t) for v in val] for t in THRESHOLDS},
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=0)
        f.write("\n")
    kept = {repr(t): sum(doc["keep"][repr(t)]) for t in THRESHOLDS}
    print(f"wrote {out}: {N_TOKENS} tokens, {sum(near)} with p, q in [1-1e-9, 1), kept {kept}")


if __name__ == "__main__":
    main()
