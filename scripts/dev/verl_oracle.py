#!/usr/bin/env python3
"""Independent numpy float64 transcription of verl HEAD's rollout correction.

`compute_rollout_correction_and_rejection_mask` (IS weights, RS masks) and its
metric helpers (`compute_is_metrics`, `compute_rs_metrics`,
`compute_offpolicy_metrics`), written from data/verl-golden/README.md and
checked against data/verl-golden/head/rollout_corr__*.json. Quirks kept:
masked means divide by (sum m + 1e-8); clamps at +-20; `bool.float().mean()`
fractions are float32; the IS metric log-thresholds are float32.

Usage:
  verl_oracle.py validate                       # oracle vs every golden case
  verl_oracle.py run INPUT.json CONFIG.json OUT.json
"""

import glob
import json
import math
import os
import sys

import numpy as np

SAFETY = 20.0
RS_OPTIONS = {
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
}
TOKEN_OPTIONS = {"token_k1", "token_k2", "token_k3"}


class VerlError(Exception):
    pass


def mmean(x, m, axis=None):
    v = np.where(m > 0, x, 0.0) * m
    if axis is None:
        return float(v.sum() / (m.sum() + 1e-8))
    return v.sum(axis=axis) / (m.sum(axis=axis) + 1e-8)


def msum(x, m, axis=-1):
    return (np.where(m > 0, x, 0.0) * m).sum(axis=axis)


def f32_mean(b):
    """torch `bool.float().mean()` under the float32 default dtype."""
    b = np.asarray(b, dtype=np.float32)
    return float(np.float32(b.sum(dtype=np.float32)) / np.float32(b.size))


_EXP = np.frompyfunc(math.exp, 1, 1)


def exp(x):
    """Elementwise libm exp. torch's float64 exp agrees with it on all 149 captured raw token
    weights of the goldens, numpy's SIMD exp differs by 1 ulp on 6 of them; that ulp shows in
    the cancellation-dominated k3 = exp(x) - 1 - x of near-identical rows (rel ~1e-8)."""
    x = np.asarray(x, dtype=np.float64)
    return np.asarray(_EXP(x), dtype=np.float64).reshape(x.shape)


def exp_scalar(x):
    return math.exp(x)


def clamp20(x):
    return np.clip(x, -SAFETY, SAFETY)


def parse_is_threshold(spec):
    if isinstance(spec, bool):
        raise VerlError("bool threshold")
    if isinstance(spec, (int, float)):
        upper, lower = float(spec), None
    elif isinstance(spec, str):
        s = spec.strip()
        if not s:
            raise VerlError("empty")
        if "_" in s:
            lo, up = s.split("_", 1)
            try:
                lower, upper = float(lo), float(up)
            except ValueError:
                raise VerlError("invalid")
        else:
            try:
                upper = float(s)
            except ValueError:
                raise VerlError("invalid")
            lower = None
    else:
        raise VerlError("type")
    if upper <= 0:
        raise VerlError("upper <= 0")
    if lower is not None:
        if lower <= 0:
            raise VerlError("lower <= 0")
        if lower > upper:
            raise VerlError("lower > upper")
    return upper, lower


def parse_rs_thresholds(options, spec):
    if spec is None:
        raise VerlError("no threshold")
    if isinstance(spec, bool):
        raw = [str(spec)]
    elif isinstance(spec, (int, float)):
        raw = [repr(float(spec)) if isinstance(spec, float) else str(spec)]
    elif isinstance(spec, str):
        raw = [p.strip() for p in spec.split(",") if p.strip()]
    else:
        raise VerlError("type")
    if not raw:
        raise VerlError("empty")
    if len(raw) not in (1, len(options)):
        raise VerlError("count")
    if len(raw) == 1 and len(options) > 1:
        raw = raw * len(options)
    out = {}
    for opt, s in zip(options, raw):
        if opt.endswith("k1"):
            if "_" in s:
                lo, up = s.split("_", 1)
            else:
                up = s
                try:
                    lo = repr(1.0 / float(up))
                except (ValueError, ZeroDivisionError):
                    raise VerlError("invalid")
            try:
                lower, upper = float(lo), float(up)
            except ValueError:
                raise VerlError("invalid")
            if lower <= 0 or upper <= 0:
                raise VerlError("non-positive")
            out[opt] = (lower, upper)
        else:
            if "_" in s:
                raise VerlError("underscore")
            try:
                upper = float(s)
            except ValueError:
                raise VerlError("invalid")
            if upper <= 0:
                raise VerlError("non-positive")
            out[opt] = (None, upper)
    return out


def is_metrics(w, raw, lr_metrics, m, level, upper, lower):
    met = {}
    lower_eff = 1.0 / upper if lower is None else lower
    log_up = float(np.log(np.float32(upper)))
    log_lo = float(np.log(np.float32(lower_eff)))
    if level == "sequence":
        met["rollout_is_max"] = exp_scalar(min(float(lr_metrics.max()), SAFETY))
        met["rollout_is_min"] = exp_scalar(float(lr_metrics.min()))
        met["rollout_is_mean"] = mmean(w, m)
        met["rollout_is_ratio_fraction_high"] = f32_mean(lr_metrics > log_up)
        met["rollout_is_ratio_fraction_low"] = f32_mean(lr_metrics < log_lo)
    else:
        met["rollout_is_mean"] = mmean(w, m)
        met["rollout_is_ratio_fraction_high"] = mmean((raw > upper).astype(float), m)
        met["rollout_is_ratio_fraction_low"] = mmean((raw < lower_eff).astype(float), m)
        mb = m > 0
        met["rollout_is_max"] = float(np.where(mb, w, -np.inf).max())
        met["rollout_is_min"] = float(np.where(mb, w, np.inf).min())
    wc = np.clip(w, 0.0, upper)
    if m.sum() > 1:
        mc = mmean(wc, m)
        var = mmean(wc * wc, m) - mc * mc
        met["rollout_is_std"] = math.sqrt(max(var, 0.0))
    else:
        met["rollout_is_std"] = 0.0
    mean_ess = mmean(wc, m)
    wn = wc / (mean_ess + 1e-8)
    denom = mmean(wn * wn, m)
    if denom == 0.0:
        # verl: `1.0 / masked_mean(...).item()` is a Python float division
        raise VerlError("ZeroDivisionError: float division by zero")
    met["rollout_is_eff_sample_size"] = 1.0 / denom
    seq = mmean(w, m, axis=-1)
    met["rollout_is_seq_mean"] = float(seq.mean())
    met["rollout_is_seq_std"] = float(seq.std(ddof=1)) if seq.size > 1 else 0.0
    met["rollout_is_seq_max"] = float(seq.max())
    met["rollout_is_seq_min"] = float(seq.min())
    met["rollout_is_seq_max_deviation"] = float(np.abs(seq - 1.0).max())
    raw_seq = mmean(raw, m, axis=-1)
    met["rollout_is_seq_fraction_high"] = f32_mean(raw_seq > upper)
    met["rollout_is_seq_fraction_low"] = f32_mean(raw_seq < lower_eff)
    return met


def is_weights(lr, m, level, spec, batch_norm):
    if level not in ("token", "sequence"):
        raise VerlError("bad rollout_is")
    upper, lower = parse_is_threshold(spec)
    if level == "token":
        lr_metrics = lr
        raw = exp(clamp20(lr))
    else:
        s = msum(lr, m)[:, None]
        lr_metrics = s
        raw = np.broadcast_to(exp(clamp20(s)), lr.shape)
    raw = raw * m
    if lower is None:
        w = np.minimum(raw, upper)
    else:
        w = np.where((raw >= lower) & (raw <= upper), raw, 0.0)
    met = is_metrics(w, raw, lr_metrics, m, level, upper, lower)
    if lower is not None:
        oob = (raw < lower) | (raw > upper)
        met["rollout_is_oob_ratio"] = mmean(oob.astype(float), m)
    if batch_norm:
        if level == "token":
            mean = mmean(w, m)
        else:
            seqw = mmean(w, m, axis=-1)
            seqm = (m.sum(axis=-1) > 0).astype(float)
            mean = float((seqw * seqm).sum() / max(seqm.sum(), 1e-8))
        if mean > 1e-8:
            w = w / mean
            met["rollout_is_batch_norm_factor"] = mean
        else:
            met["rollout_is_batch_norm_factor"] = 1.0
    return w, met


def rs_metrics(name, stat, m, seq_valid, level, seq_values, upper, lower, apply_lower):
    met = {}
    p = f"rollout_rs_{name}"
    mb = m > 0
    if seq_values is None:
        seq_values = mmean(stat, m, axis=-1)
    sv = seq_values[seq_valid]
    met[p + "_mean"] = mmean(stat, m)
    if level == "sequence" and sv.size > 0:
        met[p + "_max"] = float(sv.max())
        met[p + "_min"] = float(sv.min())
        fh = f32_mean(sv > upper)
        fl = f32_mean(sv < lower) if apply_lower else 0.0
    else:
        met[p + "_max"] = float(np.where(mb, stat, -np.inf).max())
        met[p + "_min"] = float(np.where(mb, stat, np.inf).min())
        fh = mmean((stat > upper).astype(float), m)
        fl = mmean((stat < lower).astype(float), m) if apply_lower else 0.0
    met[p + "_fraction_high"] = fh
    met[p + "_fraction_low"] = fl
    if m.sum() > 1:
        sc = np.clip(stat, lower if apply_lower else 0.0, upper)
        mc = mmean(sc, m)
        var = mmean(sc * sc, m) - mc * mc
        met[p + "_std"] = math.sqrt(max(var, 0.0))
    else:
        met[p + "_std"] = 0.0
    if sv.size > 0:
        met[p + "_seq_mean"] = float(sv.mean())
        met[p + "_seq_std"] = float(sv.std(ddof=1)) if sv.size > 1 else 0.0
        met[p + "_seq_max"] = float(sv.max())
        met[p + "_seq_min"] = float(sv.min())
        met[p + "_seq_max_deviation"] = float(np.abs(sv).max())
        met[p + "_seq_fraction_high"] = f32_mean(sv > upper)
        if apply_lower:
            met[p + "_seq_fraction_low"] = f32_mean(sv < lower)
    else:
        for k in ("seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation",
                  "seq_fraction_high", "seq_fraction_low"):
            met[f"{p}_{k}"] = 0.0
    return met


def rejection(lr, m, rs, spec, per_option=None):
    if rs is None or not isinstance(rs, str):
        raise VerlError("rollout_rs")
    if spec is None:
        raise VerlError("threshold")
    opts = [o.strip() for o in rs.split(",") if o.strip()]
    if not opts:
        raise VerlError("no options")
    norm = []
    for o in opts:
        if o not in RS_OPTIONS:
            raise VerlError(f"invalid option {o}")
        if o not in norm:
            norm.append(o)
    th = parse_rs_thresholds(norm, spec)
    ls = clamp20(lr)
    k = {"k1": -ls, "k2": 0.5 * ls ** 2, "k3": exp(ls) - 1.0 - ls}
    mb = m > 0
    seq_valid = m.sum(axis=-1) > 0
    combined = np.ones_like(m)
    met = {}
    for name in norm:
        lower, upper = th[name]
        is_k1 = name.endswith("k1")
        kind = name[-2:]
        if is_k1:
            lo_log, up_log = math.log(lower), math.log(upper)
        level = "token" if name in TOKEN_OPTIONS else "sequence"
        seq_stat = None
        tok = k[kind]
        if level == "token":
            stat = tok
        else:
            if name.startswith("seq_sum"):
                seq_stat = msum(tok, m)
            elif name.startswith("seq_mean"):
                seq_stat = mmean(tok, m, axis=-1)
            else:
                mx = np.where(mb, tok, -np.inf).max(axis=-1)
                seq_stat = np.where(mx == -np.inf, 0.0, mx)
            stat = np.broadcast_to(seq_stat[:, None], m.shape)
        if is_k1:
            keep = (stat >= lo_log) & (stat <= up_log)
        else:
            keep = stat <= upper
        mu = up_log if is_k1 else upper
        ml = lo_log if is_k1 else 0.0
        km = keep.astype(float)
        combined = combined * km
        seq_keep = ~((~keep) & mb).any(axis=-1)
        met.update(rs_metrics(name, stat, m, seq_valid, level, seq_stat, mu, ml, is_k1))
        tmf = mmean(1.0 - km, m)
        svf = seq_valid.astype(float)
        if svf.sum() > 0:
            smf = float(((1.0 - seq_keep.astype(float)) * svf).sum() / svf.sum())
        else:
            smf = 0.0
        met[f"rollout_rs_{name}_masked_fraction"] = tmf
        met[f"rollout_rs_{name}_seq_masked_fraction"] = smf
        if per_option is not None:
            per_option[name] = m * km
    met["rollout_rs_masked_fraction"] = mmean(1.0 - combined, m)
    final_keep = (combined > 0.5) & mb
    met["rollout_rs_seq_masked_fraction"] = f32_mean((~final_keep & mb).any(axis=-1))
    return m * combined, met


def offpolicy(old, rollout, m):
    met = {}
    mt = mmean(old, m, axis=-1)
    met["training_ppl"] = float(exp(-mt).mean())
    met["training_log_ppl"] = float((-mt).mean())
    if rollout is None:
        return met
    met["kl"] = mmean(rollout - old, m)
    lr = old - rollout
    met["k3_kl"] = mmean(exp(np.where(m > 0, lr, 0.0)) - lr - 1, m)
    mr = mmean(rollout, m, axis=-1)
    met["rollout_ppl"] = float(exp(-mr).mean())
    met["rollout_log_ppl"] = float((-mr).mean())
    d = mr - mt
    met["log_ppl_diff"] = float(d.mean())
    met["log_ppl_abs_diff"] = float(np.abs(d).mean())
    met["log_ppl_diff_max"] = float(d.max())
    met["log_ppl_diff_min"] = float(d.min())
    met["ppl_ratio"] = float(exp(d).mean())
    rho = exp(clamp20(lr))
    met["chi2_token"] = mmean(rho * rho, m) - 1.0
    s = msum(lr, m)
    met["chi2_seq"] = float(exp(2.0 * clamp20(s)).mean() - 1.0)
    return met


def compute(old, rollout, m, rollout_is=None, rollout_is_threshold=2.0,
            rollout_is_batch_normalize=False, rollout_rs=None, rollout_rs_threshold=None,
            per_option=None):
    if not (m > 0).any():
        raise VerlError("response_mask must contain at least one valid token (1).")
    lr = old - rollout
    met = {}
    w = None
    if rollout_is is not None and rollout_is_threshold is not None:
        w, im = is_weights(lr, m, rollout_is, rollout_is_threshold, rollout_is_batch_normalize)
        met.update(im)
    mask = m.copy()
    if rollout_rs is not None:
        if rollout_rs_threshold is None:
            raise VerlError("rollout_rs_threshold must be explicitly provided")
        mask, rm = rejection(lr, m, rollout_rs, rollout_rs_threshold, per_option)
        met.update(rm)
    met.update(offpolicy(old, rollout, m))
    return w, mask, {"rollout_corr/" + k: v for k, v in met.items()}


def load_input(path):
    d = json.load(open(path))
    f = lambda k: np.array(d[k], dtype=np.float64)
    return f("old_log_prob"), f("rollout_log_prob"), f("response_mask"), d


def run_case(inp, config):
    old, rollout, m = inp
    try:
        w, mask, met = compute(old, rollout, m, **config)
    except VerlError as e:
        return {"error": str(e)}
    return {
        "rollout_is_weights": None if w is None else w.tolist(),
        "modified_response_mask": mask.tolist(),
        "metrics": met,
    }


# ---------------------------------------------------------------- validation

F32_RE = ("seq_masked_fraction", "seq_fraction_high", "seq_fraction_low")


def is_f32_fraction(key):
    return key.endswith(F32_RE) or key.endswith("ratio_fraction_high") or key.endswith("ratio_fraction_low") \
        or key.endswith("_fraction_high") or key.endswith("_fraction_low")


def dec(v):
    if isinstance(v, str):
        return float(v.replace("Infinity", "inf"))
    return v


def close(a, b, rtol=1e-12, atol=0.0):
    a, b = dec(a), dec(b)
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(b)


def std_var_tol(key, metrics, atol):
    """verl's std is sqrt(E[x^2] - E[x]^2): each term carries a few eps*E[x^2] of rounding, so the
    variance is compared at atol + 64 eps E[x^2], E[x^2] estimated from the case's own metrics
    (IS: mean of the weights; RS: the largest of |mean|, |max|, |min| of the statistic)."""
    p = key[: -len("_std")]
    sq = dec(metrics[key]) ** 2
    if p.endswith("rollout_is"):
        sq += dec(metrics.get(p + "_mean", 0.0)) ** 2
    else:
        sq += max(dec(metrics.get(p + s, 0.0)) ** 2 for s in ("_mean", "_max", "_min"))
    return atol + 64 * 2.220446049250313e-16 * sq


def compare_outputs(got, ref, rtol=1e-12, frac_atol=0.0, std_var_atol=None, label="", atol=0.0):
    errs = []
    if "error" in ref or "error" in got:
        if ("error" in ref) != ("error" in got):
            errs.append(f"{label}: error mismatch got={got.get('error')} ref={ref.get('error')}")
        return errs
    rw, gw = ref.get("rollout_is_weights"), got.get("rollout_is_weights")
    if (rw is None) != (gw is None):
        errs.append(f"{label}: weights presence {gw is None} vs {rw is None}")
    elif rw is not None:
        a, b = np.array(gw, float), np.array(rw, float)
        if a.shape != b.shape or not np.allclose(a, b, rtol=rtol, atol=0):
            errs.append(f"{label}: weights differ max {np.abs(a - b).max() if a.shape == b.shape else a.shape}")
    a = np.array(got["modified_response_mask"], float)
    b = np.array(ref["modified_response_mask"], float)
    if a.shape != b.shape or (a != b).any():
        errs.append(f"{label}: mask differs at {np.argwhere(a != b)[:5].tolist() if a.shape == b.shape else a.shape}")
    gk = {k for k in got["metrics"] if k.startswith("rollout_corr/")}
    rk = set(ref["metrics"])
    if gk != rk:
        errs.append(f"{label}: keys extra={sorted(gk - rk)} missing={sorted(rk - gk)}")
    for k in sorted(gk & rk):
        g, r = got["metrics"][k], ref["metrics"][k]
        if k.endswith("_std") and std_var_atol is not None:
            gd, rd = dec(g), dec(r)
            if abs(gd * gd - rd * rd) <= std_var_tol(k, ref["metrics"], std_var_atol) or close(g, r, rtol):
                continue
            errs.append(f"{label}: {k} got {g!r} ref {r!r} (var diff {abs(gd*gd-rd*rd):.3e})")
            continue
        tol = max(atol, frac_atol if is_f32_fraction(k) else 0.0)
        if not close(g, r, rtol, tol):
            errs.append(f"{label}: {k} got {g!r} ref {r!r}")
    return errs


def validate():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "verl-golden")
    total, bad = 0, 0
    for f in sorted(glob.glob(os.path.join(root, "head", "rollout_corr__*.json"))):
        g = json.load(open(f))
        old, rollout, m, _ = load_input(os.path.join(root, "inputs", g["input_set"] + ".json"))
        byid = {c["id"]: c for c in g["cases"]}
        # off-policy helper outputs
        op = g["offpolicy"]["float64"]
        mine = offpolicy(old, rollout, m)
        for k, v in op["compute_offpolicy_metrics(old,rollout)"].items():
            total += 1
            if not close(mine[k], v):
                bad += 1
                print(f"{g['input_set']} offpolicy {k}: {mine[k]!r} vs {v!r}")
        lp = np.array(json.load(open(os.path.join(root, "inputs", g["input_set"] + ".json")))["log_prob"])
        mine = offpolicy(lp, rollout, m)
        for k, v in op["compute_rollout_corr_metrics_from_logprobs(log_prob,rollout)"].items():
            total += 1
            if not close(mine[k.split("/", 1)[1]], v):
                bad += 1
                print(f"{g['input_set']} from_logprobs {k}: {mine[k.split('/',1)[1]]!r} vs {v!r}")
        for c in g["cases"]:
            src = c
            while "outputs" not in src:
                src = byid[src["same_as"]]
            ref = src["outputs"]["float64"]
            po = {}
            try:
                w, mask, met = compute(old, rollout, m, per_option=po, **c["config"])
                got = {"rollout_is_weights": None if w is None else w.tolist(),
                       "modified_response_mask": mask.tolist(), "metrics": met}
            except VerlError as e:
                got = {"error": str(e)}
            errs = compare_outputs(got, ref, 1e-12, 0.0, 1e-16, f"{g['input_set']}/{c['id']}")
            for o, pm in ref.get("per_option_masks", {}).items():
                if (np.array(pm) != po.get(o, np.zeros(0))).any() if o in po else True:
                    errs.append(f"{g['input_set']}/{c['id']}: per-option mask {o}")
            total += 1
            if errs:
                bad += 1
                print("\n".join(errs))
    print(f"oracle vs goldens: {total - bad}/{total} checks pass (rtol 1e-12; *_std via variance, atol 1e-16)")
    return bad == 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "validate":
        sys.exit(0 if validate() else 1)
    if len(sys.argv) == 5 and sys.argv[1] == "run":
        old, rollout, m, _ = load_input(sys.argv[2])
        cfg = json.load(open(sys.argv[3]))
        json.dump(run_case((old, rollout, m), cfg), open(sys.argv[4], "w"))
        return
    print(__doc__)
    sys.exit(2)


if __name__ == "__main__":
    main()
