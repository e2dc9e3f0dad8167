"""verl conformance through the Python drop-in: every case of
data/verl-golden/{head,legacy}/rollout_corr__*.json (the same cases tests/conformance/verl_golden.rs runs)
through trmask.compute_rollout_correction_and_rejection_mask, with the Rust test's tolerances:
CPU against verl's float64 outputs at rtol 1e-9, GPU (f32) against verl's float32 outputs at
2e-5·|ref| + 2e-6 with the tie rule of docs/FORMAT.md (Accuracy) for mask flips."""

import glob
import json
import math
import os

import numpy as np
import pytest

import trmask
from conftest import DATA, gpu_available

GOLDEN = os.path.join(DATA, "verl-golden")
EPS_F32 = float(np.finfo(np.float32).eps)


def num(v):
    if isinstance(v, str):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[v]
    return float(v)


def flat(v):
    return np.array([num(x) for row in v for x in (row if isinstance(row, list) else [row])])


class Tol:
    def __init__(self, gpu):
        self.gpu = gpu
        self.rtol, self.atol, self.frac_atol = (2e-5, 2e-6, 2e-6) if gpu else (1e-9, 1e-15, 2e-7)
        self.reference = "float32" if gpu else "float64"

    def close(self, key, got, want):
        if math.isnan(got) or math.isnan(want):
            return math.isnan(got) and math.isnan(want)
        if got == want:
            return True
        if key.endswith("_std") and abs(got * got - want * want) <= 1e-14:
            return True
        atol = self.frac_atol if "fraction" in key else self.atol
        return abs(got - want) <= atol + self.rtol * abs(want)

    def close_std(self, key, got, want, metrics):
        if self.close(key, got, want):
            return True
        if not self.gpu:
            return False
        stem = key[: -len("_std")]
        m = 0.0
        for s in ("_max", "_min"):
            if stem + s in metrics and math.isfinite(num(metrics[stem + s])):
                m = max(m, abs(num(metrics[stem + s])))
        return abs(got * got - want * want) <= 16 * EPS_F32 * m * m


def near(x, thr):
    return abs(x - thr) <= 2e-5 * abs(thr) + 2e-6


def tied_options(got, want_mask, captured):
    t = len(want_mask[0]) if isinstance(want_mask[0], list) else 1
    want = flat(want_mask)
    tied = []
    for i, (g, w) in enumerate(zip(got, want)):
        if g == w:
            continue
        b, tt = divmod(i, t)
        explained = False
        for o in (captured or {}).get("rs", []):
            if "per_token_statistic" in o:
                stat = num(o["per_token_statistic"][b][tt])
            elif "per_sequence_statistic" in o:
                stat = num(o["per_sequence_statistic"][b])
            else:
                continue
            upper = num(o["metric_threshold_upper"])
            lower_on = bool(o.get("apply_lower_threshold"))
            lower = num(o["metric_threshold_lower"]) if lower_on else 0.0
            if near(stat, upper) or (lower_on and near(stat, lower)):
                explained = True
                if o["option"] not in tied:
                    tied.append(o["option"])
        if not explained:
            return None
    return tied


def compare(weights, mask, metrics, want, captured, tol):
    errs = []
    want_mask = flat(want["modified_response_mask"])
    skip = []
    got_mask = np.asarray(mask, dtype=np.float64).ravel()
    if not np.array_equal(got_mask, want_mask):
        opts = tied_options(got_mask, want["modified_response_mask"], captured) if tol.gpu else None
        if opts:
            skip += ["rollout_corr/rollout_rs_masked_fraction", "rollout_corr/rollout_rs_seq_masked_fraction"]
            skip += [f"rollout_corr/rollout_rs_{o}_" for o in opts]
        else:
            errs.append(f"modified_response_mask differs: got {got_mask}, want {want_mask}")
    wm = want["metrics"]
    if sorted(metrics) != sorted(wm):
        errs.append(f"metric keys differ: extra {set(metrics) - set(wm)}, missing {set(wm) - set(metrics)}")
    for k, v in wm.items():
        if any(k == s or (s.endswith("_") and k.startswith(s)) for s in skip) or k not in metrics:
            continue
        w = num(v)
        ok = tol.close_std(k, metrics[k], w, wm) if k.endswith("_std") else tol.close(k, metrics[k], w)
        if not ok:
            errs.append(f"{k}: got {metrics[k]!r}, want {w!r}")
    if want["rollout_is_weights"] is None:
        if weights is not None:
            errs.append("weights given, verl has none")
    elif weights is None:
        errs.append("no weights, verl has them")
    else:
        w = flat(want["rollout_is_weights"])
        g = np.asarray(weights, dtype=np.float64).ravel()
        for i, (a, b) in enumerate(zip(g, w)):
            if not tol.close("w", float(a), float(b)):
                errs.append(f"rollout_is_weights[{i}]: got {a!r}, want {b!r}")
                break
    return errs


def cases(api, reference):
    out = []
    for f in sorted(glob.glob(os.path.join(GOLDEN, api, "rollout_corr__*.json"))):
        with open(f) as fh:
            d = json.load(fh)
        by_id = {c["id"]: c for c in d["cases"]}
        for c in d["cases"]:
            src = by_id[c["same_as"]] if "same_as" in c else c
            o = src["outputs"].get(reference) or src["outputs"].get("float64")
            if o is None:
                continue
            config = dict(c["config"])
            if api == "legacy":
                config["legacy"] = True
            captured = src["outputs"].get("float64", {}).get("captured")
            out.append((d["input_set"], c["id"], config, None if "error" in o else o, captured))
    return out


_INPUTS = {}


def inputs(set_name):
    if set_name not in _INPUTS:
        with open(os.path.join(GOLDEN, "inputs", f"{set_name}.json")) as fh:
            d = json.load(fh)
        _INPUTS[set_name] = {
            k: np.array([[num(x) for x in row] for row in d[k]], dtype=np.float64)
            for k in ("old_log_prob", "rollout_log_prob", "log_prob", "advantages", "response_mask")
        }
    return _INPUTS[set_name]


def run(api, backend, tol):
    all_cases = cases(api, tol.reference)
    fails = []
    for set_name, cid, config, want, captured in all_cases:
        x = inputs(set_name)
        try:
            w, m, metrics = trmask.compute_rollout_correction_and_rejection_mask(
                x["old_log_prob"], x["rollout_log_prob"], x["response_mask"],
                config=config, backend=backend, log_prob=x["log_prob"],
            )
        except ValueError as e:
            if want is not None:
                fails.append(f"{set_name}/{cid}: error: {e}")
            continue
        if want is None:
            fails.append(f"{set_name}/{cid}: verl raises, trmask did not")
            continue
        errs = compare(w, m, metrics, want, captured, tol)
        if errs:
            fails.append(f"{set_name}/{cid}: " + "; ".join(errs))
    print(f"verl {api} golden (python, {backend}): {len(all_cases) - len(fails)}/{len(all_cases)} passed")
    return all_cases, fails


def test_golden_head_cpu():
    all_cases, fails = run("head", "cpu", Tol(False))
    assert len(all_cases) == 342
    assert not fails, "\n".join(fails[:20])


def test_golden_legacy_cpu():
    all_cases, fails = run("legacy", "cpu", Tol(False))
    assert len(all_cases) == 112
    assert not fails, "\n".join(fails[:20])


@pytest.mark.skipif(not gpu_available(), reason="no GPU adapter (set TRMASK_REQUIRE_GPU=1 to fail instead)")
def test_golden_head_gpu():
    all_cases, fails = run("head", "gpu", Tol(True))
    assert len(all_cases) == 342
    assert not fails, "\n".join(fails[:20])


def test_error_cases_are_value_errors():
    errs = [c for c in cases("head", "float64") if c[3] is None]
    assert len(errs) == 2
    for set_name, cid, config, _, _ in errs:
        x = inputs(set_name)
        # verl raises ZeroDivisionError here: the exception is that too, and a ValueError
        with pytest.raises(ZeroDivisionError, match=r"^invalid config `") as info:
            trmask.compute_rollout_correction_and_rejection_mask(
                x["old_log_prob"], x["rollout_log_prob"], x["response_mask"], config=config, backend="cpu"
            )
        assert isinstance(info.value, ValueError)


def test_boolean_threshold_is_verls_type_error():
    x = inputs("mild")
    with pytest.raises(TypeError, match="not a boolean") as info:
        trmask.compute_rollout_correction_and_rejection_mask(
            x["old_log_prob"], x["rollout_log_prob"], x["response_mask"], rollout_is="token",
            rollout_is_threshold=True, backend="cpu",
        )
    assert isinstance(info.value, ValueError)
