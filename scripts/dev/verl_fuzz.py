#!/usr/bin/env python3
"""Generate held-back-like verl input sets and compare `trmask analyze --backend cpu`
against scripts/dev/verl_oracle.py for every config of the golden catalogue.

  verl_fuzz.py compare [--seeds N] [--bin target/debug/trmask]
  verl_fuzz.py regress OUTDIR      # write small inputs + oracle outputs (data/verl-fuzz)
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import verl_oracle as vo  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def finish(name, desc, lr_rows, lengths, T, rng):
    """Build a verl-schema input: row i valid on t < lengths[i] with log-ratio lr_rows[i]."""
    B = len(lengths)
    rollout = rng.uniform(-40, 5, size=(B, T))
    old = rng.uniform(-40, 5, size=(B, T))
    logp = rng.uniform(-40, 5, size=(B, T))
    adv = rng.uniform(-40, 5, size=(B, T))
    mask = np.zeros((B, T))
    for i, L in enumerate(lengths):
        if L == 0:
            continue
        base = -np.abs(rng.normal(0, 1.5, size=L)) - 1e-3
        lr = np.asarray(lr_rows[i], dtype=float)[:L]
        rollout[i, :L] = base
        old[i, :L] = base + lr
        logp[i, :L] = old[i, :L] + rng.normal(0, 0.02, size=L)
        adv[i, :L] = rng.normal()
        mask[i, :L] = 1.0
    return {
        "name": name, "description": desc, "shape": [B, T], "lengths": [int(x) for x in lengths],
        "padding": "uniform[-40,5]",
        "rollout_log_prob": rollout.tolist(), "old_log_prob": old.tolist(), "log_prob": logp.tolist(),
        "advantages": adv.tolist(), "response_mask": mask.tolist(),
    }


def gen_mixed(seed):
    rng = np.random.default_rng(1000 + seed)
    B, T = 12, 32
    lengths = rng.integers(8, T + 1, size=B)
    rows = [np.zeros(T) for _ in range(B)]
    rows[0] = rng.normal(0, 1e-4, T)                       # near-identical
    lengths[1] = 1
    rows[1][0] = 25.0                                      # past the +-20 clamp
    rows[2] = rng.normal(0, 0.02, T); rows[2][rng.integers(0, lengths[2])] = 30.0
    rows[3] = rng.normal(0, 0.02, T); rows[3][rng.integers(0, lengths[3])] = -30.0
    rows[4] = 0.05 * np.arange(1, T + 1)                   # drift +0.05 / token
    rows[5] = -0.08 * np.arange(1, T + 1)                  # drift -0.08 / token
    lengths[6] = 2
    rows[6][:2] = [5.0, -5.0]                              # sum 0, max large
    rows[7] = rng.normal(0, 1.0, T)                        # sigma = 1
    rows[8] = rng.normal(0, 0.02, T); rows[8][rng.integers(0, lengths[8])] = 12.0
    rows[9] = rng.normal(0, 0.02, T); rows[9][rng.integers(0, lengths[9])] = -12.0
    rows[10] = rng.normal(0, 0.08, T)
    rows[11] = rng.normal(0, 0.01, T)
    perm = rng.permutation(B) if seed % 2 else np.arange(B)
    return finish(f"mixed_s{seed}", "mixed-like", [rows[p] for p in perm], [lengths[p] for p in perm], T, rng)


def gen_large(seed):
    rng = np.random.default_rng(2000 + seed)
    B, T = 16, 64
    lengths = rng.integers(1, T + 1, size=B)
    rows = [0.04 * rng.standard_t(3, size=T) for _ in range(B)]
    if seed % 3 == 2:  # also let a few empty rows into the batch statistics
        lengths[rng.choice(B, size=3, replace=False)] = 0
    return finish(f"large_s{seed}", "0.04*StudentT(3), lengths in [1,64]", rows, lengths, T, rng)


def gen_uniform(seed):
    rng = np.random.default_rng(3000 + seed)
    B, T = 4, 10
    cs = [5e-4, -5e-4, 2e-3, -2e-3]
    lengths = rng.integers(1, T + 1, size=B) if seed else np.full(B, T)
    rows = [np.full(T, c) for c in cs]
    return finish(f"uniform_shift_s{seed}", "row i constant c_i", rows, lengths, T, rng)


def gen_extremes(seed):
    rng = np.random.default_rng(4000 + seed)
    out = []
    # all rows empty but one
    B, T = 6, 16
    lengths = [0] * B
    lengths[seed % B] = int(rng.integers(1, T + 1))
    rows = [rng.normal(0, 0.3, T) for _ in range(B)]
    out.append(finish(f"one_row_s{seed}", "all rows empty but one", rows, lengths, T, rng))
    # B = 1
    T = int(rng.integers(1, 20))
    out.append(finish(f"b1_s{seed}", "B=1", [rng.normal(0, 0.5, T)], [int(rng.integers(1, T + 1))], T, rng))
    # T = 1
    B = 5
    lens = [int(x) for x in rng.integers(0, 2, size=B)]
    lens[0] = 1
    out.append(finish(f"t1_s{seed}", "T=1", [rng.normal(0, 1.0, 1) for _ in range(B)], lens, 1, rng))
    # B = 1, T = 1
    out.append(finish(f"b1t1_s{seed}", "B=1,T=1", [rng.normal(0, 2.0, 1)], [1], 1, rng))
    return out


def all_inputs(seeds):
    sets = []
    for s in range(seeds):
        sets += [gen_mixed(s), gen_large(s), gen_uniform(s)] + gen_extremes(s)
    return sets


def catalogue_configs():
    g = json.load(open(os.path.join(ROOT, "data/verl-golden/head/rollout_corr__mild.json")))
    seen, out = set(), []
    for c in g["cases"]:
        key = json.dumps(c["config"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append((c["id"], c["config"]))
    return out


def oracle(inp, cfg):
    arr = lambda k: np.array(inp[k], dtype=np.float64)
    return vo.run_case((arr("old_log_prob"), arr("rollout_log_prob"), arr("response_mask")), cfg)


def run_cli(binary, inp_path, cfg, tmp):
    cp = os.path.join(tmp, "cfg.json")
    op = os.path.join(tmp, "out.json")
    mp = os.path.join(tmp, "met.json")
    for p in (op, mp):
        if os.path.exists(p):
            os.remove(p)
    json.dump(cfg, open(cp, "w"))
    r = subprocess.run([binary, "analyze", inp_path, "--backend", "cpu", "--config", cp,
                        "--output", op, "--metrics", mp], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": f"exit {r.returncode}: {r.stderr.strip()[-300:]}"}, r.returncode
    o = json.load(open(op))
    return {"rollout_is_weights": o.get("rollout_is_weights"),
            "modified_response_mask": o["modified_response_mask"],
            "metrics": json.load(open(mp))}, 0


def compare(seeds, binary):
    cfgs = catalogue_configs()
    sets = all_inputs(seeds)
    n, bad, nerr = 0, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for inp in sets:
            ip = os.path.join(tmp, inp["name"] + ".json")
            json.dump(inp, open(ip, "w"))
            for cid, cfg in cfgs:
                ref = oracle(inp, cfg)
                got, rc = run_cli(binary, ip, cfg, tmp)
                errs = vo.compare_outputs(got, ref, rtol=1e-9, frac_atol=2e-7, std_var_atol=1e-14,
                                          label=f"{inp['name']}/{cid}", atol=1e-15)
                if "error" in ref and rc not in (2,):
                    errs.append(f"{inp['name']}/{cid}: verl raises, CLI rc={rc}")
                n += 1
                nerr += "error" in ref
                if errs:
                    bad += 1
                    print("\n".join(errs[:6]))
    print(f"{len(sets)} inputs x {len(cfgs)} configs = {n} comparisons ({nerr} where verl raises), "
          f"{bad} with discrepancies")
    return bad == 0


REGRESS_SETS = ["mixed_s0", "mixed_s1", "large_s2", "uniform_shift_s0", "uniform_shift_s1",
                "one_row_s0", "b1_s0", "t1_s0", "b1t1_s0"]


def regress(outdir, seeds=3):
    """Small regression data for tests/conformance/verl_fuzz.rs: per input set, the input and the oracle's
    outputs for every catalogue config (masks as 0/1 strings, weights shared between configs
    with the same IS settings)."""
    os.makedirs(outdir, exist_ok=True)
    cfgs = catalogue_configs()
    for inp in all_inputs(seeds):
        if inp["name"] not in REGRESS_SETS:
            continue
        weights, cases, pool, pool_index = {}, [], [], {}
        for cid, cfg in cfgs:
            ref = oracle(inp, cfg)
            case = {"id": cid, "config": cfg}
            if "error" in ref:
                case["error"] = ref["error"]
            else:
                wkey = None
                if ref["rollout_is_weights"] is not None:
                    wkey = json.dumps({k: cfg.get(k) for k in
                                       ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize")},
                                      sort_keys=True)
                    assert weights.setdefault(wkey, ref["rollout_is_weights"]) == ref["rollout_is_weights"]
                case["weights"] = wkey
                case["mask"] = ["".join("1" if v else "0" for v in row) for row in ref["modified_response_mask"]]
                # metrics: union of pooled parts (off-policy, IS, RS) shared between configs
                parts = {}
                for k, v in ref["metrics"].items():
                    fam = "is" if k.startswith("rollout_corr/rollout_is_") else \
                        "rs" if k.startswith("rollout_corr/rollout_rs_") else "off"
                    parts.setdefault(fam, {})[k] = v
                refs = []
                for fam in sorted(parts):
                    blob = json.dumps(parts[fam], sort_keys=True)
                    if blob not in pool_index:
                        pool_index[blob] = len(pool)
                        pool.append(parts[fam])
                    refs.append(pool_index[blob])
                case["metrics"] = refs
            cases.append(case)
        json.dump({"generator": "scripts/dev/verl_fuzz.py regress (oracle: scripts/dev/verl_oracle.py)",
                   "input": inp, "weights": weights, "metric_pool": pool, "cases": cases},
                  open(os.path.join(outdir, inp["name"] + ".json"), "w"), separators=(",", ":"))


if __name__ == "__main__":
    a = sys.argv[1:]
    if a and a[0] == "compare":
        seeds = int(a[a.index("--seeds") + 1]) if "--seeds" in a else 3
        binary = a[a.index("--bin") + 1] if "--bin" in a else os.path.join(ROOT, "target/debug/trmask")
        sys.exit(0 if compare(seeds, binary) else 1)
    if len(a) == 2 and a[0] == "regress":
        regress(a[1])
        sys.exit(0)
    print(__doc__)
    sys.exit(2)
