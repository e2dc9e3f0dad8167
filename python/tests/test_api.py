"""The Python API on NumPy inputs: every dtype gives the same result, errors are exceptions
with the CLI's message, the rest of the library (vocab / top-K divergences, analyze, bounds,
presets), the GIL is released, and the package imports from outside the repository."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import trmask
from conftest import DATA

ROLLOUT = np.array([[-1.0, -0.5, -0.2], [-2.0, -0.1, np.nan]])
OLD = np.array([[-1.0, -0.5, -0.2], [-0.5, -2.6, 0.0]])
MASK = np.array([[1, 1, 1], [1, 1, 0]])


def test_readme_example():
    w, m, metrics = trmask.compute_rollout_correction_and_rejection_mask(
        OLD, ROLLOUT, MASK.astype(bool), preset="decoupled_k3_rs", backend="cpu"
    )
    assert w is None
    assert m.dtype == np.bool_
    assert m.tolist() == [[True, True, True], [False, False, False]]
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.4, abs=1e-7)
    assert all(k.startswith("rollout_corr/") for k in metrics)


@pytest.mark.parametrize("vdtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("mdtype", [np.bool_, np.uint8, np.int64, np.int32, np.float32, np.float64])
def test_dtypes_agree(vdtype, mdtype):
    rng = np.random.default_rng(1)
    old = (rng.normal(-1, 0.3, (6, 9))).astype(vdtype)
    roll = (old.astype(np.float64) + rng.normal(0, 0.2, (6, 9))).astype(vdtype)
    mask = (np.arange(9)[None, :] < np.array([9, 5, 1, 0, 7, 3])[:, None]).astype(mdtype)
    cfg = dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.02)
    w, m, met = trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, **cfg, backend="cpu")
    # the reference: the same values widened to float64, a float64 mask
    w64, m64, met64 = trmask.compute_rollout_correction_and_rejection_mask(
        old.astype(np.float64), roll.astype(np.float64), mask.astype(np.float64), **cfg, backend="cpu"
    )
    assert m.dtype == np.dtype(mdtype)
    assert w.dtype == (np.dtype(vdtype) if vdtype != np.float16 else np.dtype(np.float32))
    np.testing.assert_array_equal(m.astype(np.float64), m64)
    np.testing.assert_array_equal(w, w64.astype(w.dtype))
    assert met == met64


def test_packed_layout_matches_padded():
    cu = np.array([0, 3, 5])
    valid = MASK.astype(bool)
    w, m, met = trmask.compute_rollout_correction_and_rejection_mask(
        OLD[valid], ROLLOUT[valid], None, rollout_is="token", cu_seqlens=cu, backend="cpu"
    )
    wp, mp, metp = trmask.compute_rollout_correction_and_rejection_mask(
        OLD, ROLLOUT, MASK, rollout_is="token", backend="cpu"
    )
    np.testing.assert_array_equal(w, wp[valid])
    np.testing.assert_array_equal(m, mp[valid])
    assert met.keys() == metp.keys()


def test_non_contiguous_input():
    big = np.zeros((2, 6))
    big[:, ::2] = OLD
    w, m, _ = trmask.compute_rollout_correction_and_rejection_mask(
        big[:, ::2], ROLLOUT, MASK, rollout_is="token", backend="cpu"
    )
    w2, _, _ = trmask.compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK, rollout_is="token", backend="cpu")
    np.testing.assert_array_equal(w, w2)


def test_trmask_options_and_details():
    w, m, met, det = trmask.compute_rollout_correction_and_rejection_mask(
        OLD, ROLLOUT, MASK, rollout_rs="seq_max_k2,seq_lntrm", rollout_rs_threshold="2.5,0.5",
        ln_trm={"eps": 5e-3, "delta": 1e-4}, token_veto=1e-4,
        trmask_metrics=True, return_details=True, backend="cpu",
    )
    assert any(k.startswith("trmask/") for k in met)
    assert det["seq_len"].tolist() == [3, 2]
    assert set(det["criteria"]) >= {"seq_max_k2", "seq_lntrm", "token_veto"}


def test_histograms_come_with_the_details_and_change_no_metric():
    """The histograms are counted only for a call that returns the details (the call without
    them skips the per-token count): log ρ of every valid token and each criterion's
    per-sequence statistic, and the same metrics either way."""
    kw = dict(rollout_is="token", rollout_rs="seq_max_k2", rollout_rs_threshold=2.5,
              trmask_metrics=True, backend="cpu")
    _, _, met, det = trmask.compute_rollout_correction_and_rejection_mask(
        OLD, ROLLOUT, MASK, **kw, return_details=True
    )
    _, _, plain = trmask.compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK, **kw)
    assert plain == met
    h = det["histograms"]
    assert set(h) == {"log_ratio", "seq_max_k2"}
    assert int(h["log_ratio"].sum()) == int(np.asarray(MASK).sum())
    assert int(h["seq_max_k2"].sum()) == 2


def test_exact_kl_criterion_from_logits():
    rng = np.random.default_rng(2)
    b, t, v = 3, 4, 11
    rl = rng.normal(0, 1, (b, t, v)).astype(np.float32)
    ol = rl + rng.normal(0, 0.05, (b, t, v)).astype(np.float32)
    ol[2] += rng.normal(0, 2, (t, v)).astype(np.float32)  # sequence 2 drifts
    ids = rng.integers(0, v, (b, t))
    mask = np.ones((b, t), bool)
    _, m, met, det = trmask.compute_rollout_correction_and_rejection_mask(
        None, None, mask, rollout_rs="seq_max_kl", rollout_rs_threshold=0.05,
        responses=ids, rollout_logits=rl, old_logits=ol, return_details=True, backend="cpu",
    )
    kl = trmask.vocab_divergence(rl, ol, backend="cpu")["kl"]
    np.testing.assert_allclose(det["criteria"]["seq_max_kl"], kl.max(axis=1), rtol=1e-12)
    assert det["seq_accept"].tolist() == (kl.max(axis=1) <= 0.05).tolist()
    assert m.shape == (b, t) and m.dtype == np.bool_
    assert m.tolist() == np.repeat(det["seq_accept"][:, None], t, axis=1).tolist()


def test_errors_are_value_errors_with_the_cli_message():
    cases = [
        (dict(old_log_prob=OLD[:1], rollout_log_prob=ROLLOUT, response_mask=MASK), "invalid input `old_log_prob`"),
        (dict(old_log_prob=OLD, rollout_log_prob=ROLLOUT, response_mask=MASK * 2), "invalid input `response_mask`"),
        (dict(old_log_prob=OLD, rollout_log_prob=ROLLOUT, response_mask=MASK, rollout_rs="seq_max_k9", rollout_rs_threshold=1.0), "invalid config `rollout_rs`"),
        (dict(old_log_prob=OLD, rollout_log_prob=ROLLOUT, response_mask=MASK, rollout_is="tokens"), "invalid config `rollout_is`"),
        (dict(old_log_prob=np.where(MASK, np.nan, 0.0), rollout_log_prob=ROLLOUT, response_mask=MASK), "invalid input `old_log_prob`"),
        (dict(old_log_prob=OLD, rollout_log_prob=ROLLOUT, response_mask=MASK, backend="tpu"), "invalid config `backend`"),
        (dict(old_log_prob=np.array(["a"]), rollout_log_prob=ROLLOUT, response_mask=MASK), "invalid input `old_log_prob`"),
    ]
    for kwargs, msg in cases:
        kwargs.setdefault("backend", "cpu")
        with pytest.raises(ValueError) as e:
            trmask.compute_rollout_correction_and_rejection_mask(**kwargs)
        assert str(e.value).startswith(msg), str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown preset"):
        trmask.preset("nope")
    with pytest.raises(ValueError, match="--horizon"):
        trmask.bounds(horizon=0, delta=1e-4)
    with pytest.raises(ValueError, match="rollout_logits"):
        trmask.vocab_divergence(np.zeros((2, 0), np.float32), np.zeros((2, 0), np.float32), backend="cpu")


def test_cli_and_python_give_the_same_message(tmp_path):
    """The CLI prints `trmask: <message>`; Python raises ValueError(<message>)."""
    exe = _trmask_bin()
    if exe is None:
        pytest.skip("the trmask CLI is not built (cargo build)")
    batch = {"old_log_prob": OLD.tolist(), "rollout_log_prob": np.nan_to_num(ROLLOUT).tolist(), "response_mask": (MASK * 2).tolist()}
    p = tmp_path / "b.json"
    p.write_text(json.dumps(batch))
    r = subprocess.run([exe, "analyze", str(p), "--backend", "cpu"], capture_output=True, text=True)
    assert r.returncode == 2
    with pytest.raises(ValueError) as e:
        trmask.analyze(p, backend="cpu")
    assert r.stderr.strip().splitlines()[-1] == f"trmask: {e.value}"


def _trmask_bin():
    root = os.path.join(DATA, "..")
    for sub in ("debug", "release"):
        exe = os.path.join(root, "target", sub, "trmask")
        if os.path.exists(exe):
            return exe
    return None


def test_vocab_divergence_closed_forms():
    v = 7
    uniform = np.zeros((1, v), np.float32)
    one_hot = np.full((1, v), -1e4, np.float32)
    one_hot[0, 3] = 0.0
    d = trmask.vocab_divergence(one_hot, uniform, backend="cpu")
    assert d["kl"][0] == pytest.approx(np.log(v), rel=1e-9)
    assert d["rollout_entropy"][0] == pytest.approx(0.0, abs=1e-9)
    assert d["training_entropy"][0] == pytest.approx(np.log(v), rel=1e-9)
    same = trmask.vocab_divergence(uniform, uniform, responses=np.array([2]), backend="cpu")
    assert same["kl"][0] == 0.0 and same["tv"][0] == 0.0
    assert same["rollout_log_prob"][0] == pytest.approx(-np.log(v), rel=1e-7)


def test_vocab_divergence_dtypes_and_mask():
    rng = np.random.default_rng(3)
    a = rng.normal(0, 2, (2, 3, 50)).astype(np.float32)
    b = a + rng.normal(0, 0.1, a.shape).astype(np.float32)
    d32 = trmask.vocab_divergence(a, b, backend="cpu")
    assert d32["kl"].shape == (2, 3)
    d16 = trmask.vocab_divergence(a.astype(np.float16), b.astype(np.float16), backend="cpu")
    ref16 = trmask.vocab_divergence(a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32), backend="cpu")
    np.testing.assert_array_equal(d16["kl"], ref16["kl"])
    mask = np.array([[True, False, True], [False, False, True]])
    dm = trmask.vocab_divergence(a, b, mask=mask, backend="cpu")
    np.testing.assert_array_equal(dm["kl"], np.where(mask, d32["kl"], 0.0))


def test_topk_divergence_full_support_equals_exact():
    """With K = V the top-K support is the whole vocabulary: topk_kl is the exact KL."""
    rng = np.random.default_rng(4)
    n, v = 5, 8
    rl = rng.normal(0, 1, (n, v))
    ol = (rl + rng.normal(0, 0.3, (n, v))).astype(np.float32)
    logp = rl - np.log(np.exp(rl).sum(-1, keepdims=True))
    ids = np.argsort(-logp, axis=-1)
    top = np.take_along_axis(logp, ids, -1)
    y = ids[:, 0]
    t = trmask.topk_divergence(ids, top, y, ol, backend="cpu")
    exact = trmask.vocab_divergence(rl.astype(np.float32), ol, backend="cpu")["kl"]
    np.testing.assert_allclose(t["topk_kl"], exact, rtol=1e-5, atol=1e-7)


def test_analyze_dict_file_and_framework_names():
    path = os.path.join(DATA, "sample", "real-small.safetensors")
    a = trmask.analyze(path, preset="decoupled_k3_rs", backend="cpu")
    assert {"log_ratio", "k3", "kl", "modified_response_mask", "seq_accept"} <= set(a["outputs"])
    assert "rollout_corr/rollout_rs_masked_fraction" in a["metrics"]
    assert "trmask/bound_unified" in a["metrics"] or any(k.startswith("trmask/bound") for k in a["metrics"])
    # a dict with verl's names
    d = trmask.analyze({"old_log_probs": OLD, "rollout_log_probs": ROLLOUT, "response_mask": MASK},
                       config={"rollout_rs": "seq_max_k2", "rollout_rs_threshold": 2.5}, backend="cpu")
    assert d["outputs"]["k3"].shape == (2, 3)
    assert any("verl" in n for n in d["notes"])
    with pytest.raises(ValueError, match="response_mask"):
        trmask.analyze({"old_log_prob": OLD, "rollout_log_prob": ROLLOUT}, backend="cpu")
    ok = trmask.analyze({"old_log_prob": OLD[:, :2], "rollout_log_prob": ROLLOUT[:, :2]}, all_valid=True, backend="cpu")
    assert ok["outputs"]["seq_len"].tolist() == [2, 2]


def test_analyze_matches_the_cli(tmp_path):
    exe = _trmask_bin()
    if exe is None:
        pytest.skip("the trmask CLI is not built (cargo build)")
    path = os.path.join(DATA, "sample", "real-small.safetensors")
    met = tmp_path / "m.json"
    subprocess.run([exe, "analyze", path, "--preset", "decoupled_k3_rs", "--backend", "cpu", "--metrics", str(met)],
                   check=True, capture_output=True)
    cli = json.loads(met.read_text())
    # the CLI's threshold sweeps (arrays) are not among the Python metrics
    assert "trmask/sweep/seq_mean_k3" in cli
    cli = {k: v for k, v in cli.items() if not k.startswith("trmask/sweep/")}
    py = trmask.analyze(path, preset="decoupled_k3_rs", backend="cpu")["metrics"]
    assert set(cli) == set(py)
    for k, v in cli.items():
        if isinstance(v, str):
            v = float(v.replace("Infinity", "inf"))
        assert py[k] == v or (np.isnan(py[k]) and np.isnan(v)), k


def test_bounds_paper_example():
    b = trmask.bounds(horizon=4096, delta=1e-4, eps=5e-3, kl_seq=0.01, tv_seq=0.05)
    assert b["classical_kl"] == pytest.approx(1677.312, abs=1e-3)
    assert b["unified"] == pytest.approx(4.096, abs=1e-9)
    assert b["argmin"] == "mix_tv"
    assert trmask.bounds(horizon=4096, delta=1e-4)["filled"]


def test_presets():
    names = trmask.preset_names()
    assert len(names) >= 19 + 4
    for n in names:
        cfg = trmask.preset(n)
        trmask.compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK, config=cfg, log_prob=OLD, backend="cpu")
    p = trmask.preset("decoupled_k3_rs")
    assert p["rollout_rs"] == "seq_mean_k3"
    a = trmask.compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK, **p, backend="cpu")
    b = trmask.compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK, preset="decoupled_k3_rs", backend="cpu")
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2] == b[2]


def test_gil_released():
    """Another Python thread keeps running while a large correction is computed."""
    rng = np.random.default_rng(5)
    old = rng.normal(-1, 0.1, (2048, 2048))  # a call of tens of ms, well above the ticks
    roll = old + rng.normal(0, 0.01, old.shape)
    mask = np.ones(old.shape, bool)
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    th = threading.Thread(target=ticker)
    th.start()
    time.sleep(0.01)
    t0 = time.perf_counter()
    trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01, backend="cpu")
    t1 = time.perf_counter()
    done.set()
    th.join()
    during = [t for t in ticks if t0 <= t <= t1]
    # the ticker wakes every ~1 ms: holding the GIL for the call would leave gaps as long as it
    gaps = np.diff([t0] + during + [t1])
    assert gaps.max() < 0.5 * (t1 - t0), (gaps.max(), t1 - t0)


def test_import_outside_the_repo(tmp_path):
    code = "import trmask, os; print(trmask.__version__, os.path.dirname(trmask.__file__))"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert r.stdout.split()[0] == trmask.__version__
    # torch is never imported by trmask
    r = subprocess.run([sys.executable, "-c", "import sys, trmask, numpy as np; "
                        "trmask.compute_rollout_correction_and_rejection_mask(np.zeros((1,2)), np.zeros((1,2)), np.ones((1,2)), backend='cpu'); "
                        "print('torch' in sys.modules)"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_null_is_threshold_skips_is_with_a_warning():
    # docs/FORMAT.md (Config): verl weights only when rollout_is and its threshold are both set
    kw = dict(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.05, backend="cpu")
    with pytest.warns(UserWarning, match="rollout_is_threshold is null"):
        w, m, metrics = trmask.compute_rollout_correction_and_rejection_mask(
            OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold=None, **kw
        )
    w0, m0, metrics0 = trmask.compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, MASK, **kw)
    assert w is None and w0 is None
    assert m.tolist() == m0.tolist()
    assert metrics == metrics0


def test_uid_strings_are_group_labels():
    # verl's uid: one string per prompt; the group metrics see the same groups as integer ids
    rng = np.random.default_rng(3)
    old = rng.normal(-1, 0.3, (6, 5))
    roll = old + rng.normal(0, 0.1, (6, 5))
    mask = np.ones((6, 5))
    labels = np.array(["p0", "p1", "p0", "p2", "p1", "p0"], dtype=object)
    ints = np.array([7, 3, 7, 11, 3, 7])
    runs = [
        trmask.compute_rollout_correction_and_rejection_mask(
            old, roll, mask, backend="cpu", uid=u, trmask_metrics=True
        )[2]
        for u in (labels, labels.astype(str), ints)
    ]
    assert any(k.startswith("trmask/group") for k in runs[0])
    assert runs[0] == runs[1] == runs[2]
    with pytest.raises(ValueError, match="uid"):
        trmask.compute_rollout_correction_and_rejection_mask(
            old, roll, mask, backend="cpu", uid=np.array(["p0", 1, 2, 3, 4, 5], dtype=object)
        )


def test_shapes_must_match_the_layout():
    # equal element counts in another shape are an error naming the tensor (verl: a torch
    # broadcast error), never a silent reshape
    rng = np.random.default_rng(3)
    old = rng.normal(-1, 0.3, (4, 6))
    roll, mask = old + 0.1, np.ones((4, 6))
    f = trmask.compute_rollout_correction_and_rejection_mask
    for args, name in [
        ((old.reshape(6, 4), roll, mask), "old_log_prob"),
        ((old, roll, mask.reshape(6, 4)), "rollout_log_prob"),  # the mask fixes [B, T]
        ((old[None], roll[None], mask), "rollout_log_prob"),
    ]:
        with pytest.raises(ValueError, match=f"`{name}`"):
            f(*args, rollout_is="token", backend="cpu")
    with pytest.raises(ValueError, match="`old_log_prob`"):
        trmask.analyze(
            {"rollout_log_prob": roll, "old_log_prob": old.reshape(6, 4), "response_mask": mask},
            backend="cpu",
        )


def _kept_sets_step():
    """Two padded rows with logits and the sampler's kept sets (one span per valid token)."""
    rng = np.random.default_rng(30)
    logits = rng.normal(0, 1.5, (2, 3, 6)).astype(np.float32)
    old_logits = (logits + rng.normal(0, 0.05, logits.shape)).astype(np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    responses = np.array([[0, 1, 0], [2, 0, 0]])
    kept = [[0, 3, 5], [1, 2], [2, 4, 0, 1]]  # the valid tokens' sets, in token order
    ids = np.concatenate([np.array(k) for k in kept]).astype(np.int32)
    offsets = np.cumsum([0] + [len(k) for k in kept]).astype(np.int64)

    def lsm(x):
        x = x.astype(np.float64)
        m = x.max(-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

    raw = np.take_along_axis(lsm(logits), responses[..., None], -1)[..., 0]
    old = np.take_along_axis(lsm(old_logits), responses[..., None], -1)[..., 0]
    slots = [(0, 0), (0, 1), (1, 0)]
    log_s = np.zeros((2, 3))
    for (b, t), k in zip(slots, kept):
        log_s[b, t] = np.log(np.exp(lsm(logits)[b, t, k]).sum())
    roll = raw - log_s  # the processed log-prob the engine reports
    return dict(
        rollout_log_prob=roll, old_log_prob=old, response_mask=mask, responses=responses,
        rollout_logits=logits, old_logits=old_logits,
        rollout_sampling_mask_ids=ids, rollout_sampling_mask_offsets=offsets,
    ), log_s, old


def test_kept_sets_analyze_and_correct():
    step, log_s, old = _kept_sets_step()
    out = trmask.analyze(step, {"sampling_replay": True}, backend="cpu")
    lkm = out["outputs"]["log_kept_mass"].reshape(2, 3)
    assert np.abs(lkm - log_s).max() < 1e-12
    valid = ([0, 0, 1], [0, 1, 0])
    kept_old = out["outputs"]["old_log_prob_kept"].reshape(2, 3)
    assert np.abs(kept_old[valid] - (old - log_s)[valid]).max() < 1e-12
    assert out["metrics"]["trmask/kept_set_known_fraction"] == 1.0
    # replay removes the offset: the replayed trainer equals the processed rollout up to the
    # logits' own mismatch (small)
    assert out["metrics"]["trmask/k3_mean"] < out["metrics"]["trmask/k3_mean_raw_trainer"]
    # slime's keys through analyze, the verl entry point with keyword tensors
    slime = dict(step)
    slime["rollout_top_p_token_ids"] = slime.pop("rollout_sampling_mask_ids")
    slime["rollout_top_p_token_offsets"] = slime.pop("rollout_sampling_mask_offsets")
    out2 = trmask.analyze(slime, {"sampling_replay": True}, backend="cpu")
    assert any("slime" in n for n in out2["notes"]), out2["notes"]
    assert out2["metrics"] == out["metrics"]
    w, m, metrics = trmask.compute_rollout_correction_and_rejection_mask(
        step["old_log_prob"], step["rollout_log_prob"], step["response_mask"],
        rollout_rs="seq_mean_k3", rollout_rs_threshold=1.0, backend="cpu",
        responses=step["responses"], rollout_logits=step["rollout_logits"],
        old_logits=step["old_logits"],
        rollout_sampling_mask_ids=step["rollout_sampling_mask_ids"],
        rollout_sampling_mask_offsets=step["rollout_sampling_mask_offsets"],
        sampling_replay=True, trmask_metrics=True,
    )
    want = out["metrics"]["trmask/log_kept_mass_mean"]
    assert metrics["trmask/log_kept_mass_mean"] == pytest.approx(want, rel=1e-12)


def test_kept_sets_errors_name_the_tensor():
    step, _, _ = _kept_sets_step()
    bad = dict(step, rollout_sampling_mask_offsets=np.array([0, 3, 2, 9]))
    with pytest.raises(ValueError, match="rollout_sampling_mask_offsets.*decreases"):
        trmask.analyze(bad, {"sampling_replay": True}, backend="cpu")
    bad = dict(step, rollout_sampling_mask_ids=np.array([0, 3, 7, 1, 2, 2, 4, 0, 1]))
    with pytest.raises(ValueError, match="rollout_sampling_mask_ids.*outside the vocabulary"):
        trmask.analyze(bad, backend="cpu")
    half = dict(step)
    del half["rollout_sampling_mask_offsets"]
    with pytest.raises(ValueError, match="rollout_sampling_mask_offsets.*missing"):
        trmask.analyze(half, backend="cpu")
    with pytest.raises(ValueError, match="rollout_sampling_mask_offsets.*missing"):
        trmask.compute_rollout_correction_and_rejection_mask(
            step["old_log_prob"], step["rollout_log_prob"], step["response_mask"],
            backend="cpu", rollout_sampling_mask_ids=step["rollout_sampling_mask_ids"],
        )


@pytest.mark.parametrize("t,shown", [(0.0, "0"), (-1.0, "-1"), (float("nan"), "NaN")])
def test_a_bad_temperature_is_the_cli_and_rust_error(t, shown, tmp_path):
    """One temperature rule: the config key and the keyword of the engine calls give the message
    the CLI prints and the Rust API returns (tests/cli/flags.rs pins the same text)."""
    expected = f"invalid config `temperature`: {shown} is out of range (a finite temperature >= 0.00001)"
    batch = {"old_log_prob": OLD, "rollout_log_prob": np.nan_to_num(ROLLOUT), "response_mask": MASK}
    with pytest.raises(ValueError) as e:
        trmask.analyze(batch, {"temperature": t}, backend="cpu")
    assert str(e.value) == expected
    logits = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError) as e:
        trmask.vocab_divergence(logits, logits, temperature=t, backend="cpu")
    assert str(e.value) == expected
    exe = _trmask_bin()
    if exe is not None:
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps({"temperature": t}))
        p = tmp_path / "b.json"
        p.write_text(json.dumps({k: np.asarray(v).tolist() for k, v in batch.items()}))
        r = subprocess.run([exe, "analyze", str(p), "--backend", "cpu", "--config", str(cfg)], capture_output=True, text=True)
        assert r.returncode == 2
        assert r.stderr.strip() == f"trmask: {expected}"


@pytest.mark.parametrize("backend", ["tpu", "CPU", ""])
def test_a_bad_backend_is_a_value_error_naming_backend(backend):
    """The backend name is parsed once where it enters the extension, before anything runs."""
    expected = f'invalid config `backend`: "{backend}" is not one of auto, gpu, cpu, cpu-fast'
    logits = np.zeros((2, 3), np.float32)
    calls = [
        lambda: trmask.backend_name(backend),
        lambda: trmask.vocab_divergence(logits, logits, backend=backend),
        lambda: trmask.analyze({"old_log_prob": OLD, "rollout_log_prob": np.nan_to_num(ROLLOUT), "response_mask": MASK}, backend=backend),
        lambda: trmask.compute_rollout_correction_and_rejection_mask(OLD, np.nan_to_num(ROLLOUT), MASK, backend=backend),
    ]
    for call in calls:
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == expected
