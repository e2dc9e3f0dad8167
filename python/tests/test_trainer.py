"""trmask inside a trainer: verl's config objects, the data warnings, the drop-in's whole
toolbox (top-K replay, [B] advantages, kept sets), unknown keywords, trmask.Monitor and a quiet
start."""

import json
import os
import struct
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

import trmask
from conftest import DATA

CAUSAL = os.path.join(DATA, "causal-sample", "batch.safetensors")
DROP_IN = trmask.compute_rollout_correction_and_rejection_mask


def read_safetensors(path):
    """The tensors of a safetensors file (the dtypes of data/causal-sample)."""
    dtypes = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + a : 8 + n + b], dtype=dtypes[v["dtype"]]).reshape(v["shape"])
    return out


@pytest.fixture(scope="module")
def causal():
    return read_safetensors(CAUSAL)


def verl_classes():
    import verl_config

    if verl_config.verl_root() is None:
        if os.environ.get("CI"):
            pytest.fail("verl is not installed (scripts/python-test.sh installs verl==0.9.1 --no-deps)")
        pytest.skip("verl is not installed: pip install --no-deps verl==0.9.1")
    return verl_config.load()


def batch(seed=0, b=8, t=48):
    rng = np.random.default_rng(seed)
    old = -0.2 - np.abs(rng.normal(1.0, 0.4, (b, t)))
    roll = np.minimum(old + rng.normal(0, 0.05, (b, t)), -1e-3)
    mask = np.ones((b, t))
    mask[1, 30:] = 0
    return old, roll, mask


# ---- 1. verl's config as verl passes it ----


def test_verl_rollout_correction_config_is_accepted():
    BaseConfig, RCC, _ = verl_classes()
    old, roll, mask = batch()
    cfg = RCC(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_max_k2", rollout_rs_threshold=0.01)
    assert isinstance(cfg, BaseConfig) and "_target_" in list(cfg)
    ref = DROP_IN(old, roll, mask, rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_max_k2", rollout_rs_threshold=0.01)
    for given in (cfg, dict(cfg)):
        w, m, met = DROP_IN(old, roll, mask, config=given)
        np.testing.assert_array_equal(w, ref[0])
        np.testing.assert_array_equal(m, ref[1])
        assert met == ref[2]
    # verl's own presets, verl's values (a "lower_upper" string threshold, None, "sequence")
    for make, name in ((RCC.decoupled_k3_rs, "decoupled_k3_rs"), (RCC.decoupled_seq_is, "decoupled_seq_is"), (RCC.decoupled_geo_rs, "decoupled_geo_rs")):
        got = DROP_IN(old, roll, mask, config=make())
        want = DROP_IN(old, roll, mask, preset=name)
        assert got[2] == want[2], name
        np.testing.assert_array_equal(got[1], want[1])
    w, m, met = DROP_IN(old, roll, mask, config=RCC(rollout_is=None, rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"))
    assert w is None and "rollout_corr/rollout_rs_masked_fraction" in met
    # verl's default object: sequence-level IS at 2.0
    w, _, _ = DROP_IN(old, roll, mask, config=RCC())
    ref = DROP_IN(old, roll, mask, rollout_is="sequence", rollout_is_threshold=2.0)[0]
    np.testing.assert_array_equal(w, ref)


def test_omegaconf_dictconfig_from_verls_yaml():
    omegaconf = pytest.importorskip("omegaconf")
    _, _, yaml = verl_classes()
    algo = omegaconf.OmegaConf.load(yaml).algorithm
    assert "_target_" in algo
    rc = algo.rollout_correction
    # the block as verl's YAML gives it, with Hydra's _target_ and a nested `extra`
    cfg = omegaconf.OmegaConf.merge(
        rc, {"_target_": "verl.trainer.config.RolloutCorrectionConfig", "extra": {"x": 1}, "rollout_is": "token"}
    )
    assert isinstance(cfg, omegaconf.DictConfig) and "_target_" in cfg
    old, roll, mask = batch(1)
    got = DROP_IN(old, roll, mask, config=cfg)
    want = DROP_IN(old, roll, mask, rollout_is="token", rollout_is_threshold=float(rc.rollout_is_threshold))
    np.testing.assert_array_equal(got[0], want[0])
    assert got[2] == want[2]
    # trmask's nested keys from a DictConfig too
    ln = omegaconf.OmegaConf.create({"ln_trm": {"eps": 5e-3, "delta": 1e-4}, "_target_": "x"})
    got = DROP_IN(old, roll, mask, config=ln, trmask_metrics=True)
    want = DROP_IN(old, roll, mask, ln_trm={"eps": 5e-3, "delta": 1e-4}, trmask_metrics=True)
    np.testing.assert_array_equal(got[1], want[1])
    assert got[2] == want[2]


def test_a_config_that_is_not_a_mapping_is_named():
    old, roll, mask = batch()
    with pytest.raises(ValueError, match="invalid config `config`: must be a mapping"):
        DROP_IN(old, roll, mask, config=["rollout_is", "token"])


# ---- 2. the data warnings ----


def test_data_warning_on_causal_sample_once_per_corrector(causal):
    args = (causal["old_log_prob"], causal["rollout_log_prob"], causal["response_mask"])
    kw = dict(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.00131, trmask_metrics=True)
    trmask._WARNED.clear()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        _, m, met = DROP_IN(*args, **kw)
        _, _, met2 = DROP_IN(*args, **kw)  # the same corrector: said once
    data = [w for w in ws if issubclass(w.category, trmask.DataWarning)]
    assert len(data) == 1, [str(w.message) for w in ws]
    text = str(data[0].message)
    assert issubclass(trmask.DataWarning, UserWarning) and data[0].message.kind == "log_ratio_offset"
    # the CLI's text (the same Rust definition), here for the constant top-p offset
    assert text.startswith("log_ratio has mean -0.05056 but spread only 0.01048: a constant offset")
    assert "top_p" in text and "sampling_replay" in text
    assert met["trmask/warn/log_ratio_offset"] == 1.0 and "trmask/warn/log_ratio_offset" not in met2
    # what the warning is about: the offset rejects half the sequences
    assert 0.3 < met["rollout_corr/rollout_rs_seq_masked_fraction"] < 0.7


def test_positive_log_probs_warn_and_verl_metrics_stay_verls():
    old, roll, mask = batch(2)
    trmask._WARNED.clear()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        _, _, met = DROP_IN(old + 3.0, roll, mask, rollout_is="token")
    kinds = [w.message.kind for w in ws if issubclass(w.category, trmask.DataWarning)]
    assert "positive_log_prob" in kinds
    text = str(next(w.message for w in ws if getattr(w.message, "kind", "") == "positive_log_prob"))
    assert text.startswith("old_log_prob has ") and "are these logits" in text
    assert all(k.startswith("rollout_corr/") for k in met)


# ---- 3. the whole toolbox in the drop-in ----


def test_topk_replay_gives_analyzes_weights(causal):
    names = ["old_log_prob", "rollout_log_prob", "response_mask", "rollout_topk_ids", "rollout_topk_log_prob", "responses"]
    cfg = dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.00131, top_p=0.95, sampling_replay=True)
    t = {k: causal[k] for k in names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w, m, met = DROP_IN(t["old_log_prob"], t["rollout_log_prob"], t["response_mask"], rollout_topk_ids=t["rollout_topk_ids"], rollout_topk_log_prob=t["rollout_topk_log_prob"], responses=t["responses"], trmask_metrics=True, **cfg)
        a = trmask.analyze(t, config=cfg)
    # float32 log-probs give float32 weights: the f64 weights of analyze, rounded once
    np.testing.assert_array_equal(w, a["outputs"]["rollout_is_weights"].astype(np.float32))
    np.testing.assert_array_equal(m, a["outputs"]["modified_response_mask"].astype(np.float32))
    for k in ("rollout_corr/rollout_rs_seq_masked_fraction", "trmask/log_kept_mass_mean"):
        assert met[k] == pytest.approx(a["metrics"][k], rel=1e-12), k
    # replayed, the offset no longer rejects half the batch
    assert met["rollout_corr/rollout_rs_seq_masked_fraction"] < 0.2


def test_per_sequence_advantages(causal):
    args = (causal["old_log_prob"], causal["rollout_log_prob"], causal["response_mask"])
    adv = np.ascontiguousarray(causal["advantages"][:, 0])
    kw = dict(rollout_is="token", rollout_rs="seq_max_k2", rollout_rs_threshold=0.05, trmask_metrics=True)
    trmask._WARNED.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        DROP_IN(*args, advantages=adv, **kw)  # the warning's step
        w1, m1, met1 = DROP_IN(*args, advantages=adv, **kw)
        w2, m2, met2 = DROP_IN(*args, advantages=np.repeat(adv[:, None], 512, 1), **kw)
    np.testing.assert_array_equal(w1, w2)
    np.testing.assert_array_equal(m1, m2)
    assert met1 == met2 and any(k.startswith("trmask/adv_") for k in met1)
    with pytest.raises(ValueError, match="advantages"):
        DROP_IN(*args, advantages=adv[:63])


def test_unknown_keyword_is_a_type_error_naming_it(causal):
    old, roll, mask = batch()
    with pytest.raises(TypeError, match="unexpected keyword argument 'rollout_topk_idz'") as e:
        DROP_IN(old, roll, mask, rollout_topk_idz=causal["rollout_topk_ids"])
    assert "[" not in str(e.value)  # never an array repr
    with pytest.raises(ValueError, match=r"^invalid config `top_p`: a ndarray is not a number") as e:
        DROP_IN(old, roll, mask, top_p=np.zeros((3, 3)))


# ---- 4. trmask.Monitor ----


class FakeWandb(types.ModuleType):
    """wandb as the Monitor uses it: `run`, `log(data, step=)`, `Histogram(np_histogram=)`."""

    def __init__(self):
        super().__init__("wandb")
        self.run = object()
        self.logged = []

        class Histogram:
            def __init__(self, np_histogram):
                self.counts, self.edges = np_histogram

        self.Histogram = Histogram

    def log(self, data, step=None):
        self.logged.append((step, data))


def test_monitor_logs_a_12_step_run(tmp_path, causal, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    names = ["old_log_prob", "rollout_log_prob", "response_mask", "responses", "uid"]
    cfg = {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01}
    log_dir = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = trmask.Monitor(log_dir, config=cfg, report_every=5, backend="cpu")
        rng = np.random.default_rng(0)
        for step in range(1, 13):
            t = {k: causal[k] for k in names}
            # a drifting trainer: the mismatch grows with the step
            t["old_log_prob"] = (t["old_log_prob"] + rng.normal(0, 0.002 * step, t["old_log_prob"].shape)).astype(np.float32)
            w, m, met = mon.step(step, **t)
            bare = DROP_IN(t["old_log_prob"], t["rollout_log_prob"], t["response_mask"], responses=t["responses"], uid=t["uid"], trmask_metrics=True, **cfg)
            np.testing.assert_array_equal(w, bare[0])
            np.testing.assert_array_equal(m, bare[1])
            assert met == bare[2]
            if step == 5:
                first_trend = os.path.getmtime(log_dir / "trend.html")
        mon.close()
        whole = trmask.analyze(t, config=cfg, backend="cpu")["metrics"]
    files = sorted(os.listdir(log_dir))
    assert files == ["metrics.jsonl", "report.html", "tensorboard", "trend.html"], files
    lines = (log_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 12
    last = json.loads(lines[-1])
    assert last["input"] == "train" and last["step"] == 12
    # the line --metrics-jsonl writes for these metrics
    assert lines[-1] + "\n" == trmask._native.metrics_line("train", 12.0, {k: v for k, v in met.items()})
    assert last["rollout_corr/rollout_is_mean"] == met["rollout_corr/rollout_is_mean"]
    # the corrector's metrics: those of `trmask analyze` on the step, less its bound
    # certificate and estimator summaries (trmask/bound_*, trmask/k3_mean, ...), equal exactly
    logged = {k: v for k, v in last.items() if k not in ("input", "step")}
    assert set(logged) < set(whole)
    assert all(logged[k] == pytest.approx(whole[k], rel=1e-12, abs=0) for k in logged)
    # TensorBoard: scalars under the metric names, histograms of log ρ and of seq_mean_k3
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(log_dir / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    ea.Reload()
    tags = ea.Tags()
    assert "rollout_corr/rollout_is_mean" in tags["scalars"] and "trmask/reject_rate" in tags["scalars"]
    assert set(tags["histograms"]) == {"trmask/hist/log_ratio", "trmask/hist/seq_mean_k3"}
    sc = ea.Scalars("rollout_corr/rollout_is_mean")
    assert [e.step for e in sc] == list(range(1, 13))
    assert sc[-1].value == pytest.approx(met["rollout_corr/rollout_is_mean"], rel=1e-6)
    h = ea.Histograms("trmask/hist/log_ratio")
    valid = int(causal["response_mask"].sum())
    assert len(h) == 12 and h[-1].histogram_value.num == valid
    assert ea.Histograms("trmask/hist/seq_mean_k3")[0].histogram_value.num == 64
    # wandb: every step, with wandb.Histogram of the same counts
    assert [s for s, _ in fake.logged] == list(range(1, 13))
    step12 = fake.logged[-1][1]
    assert step12["rollout_corr/rollout_is_mean"] == met["rollout_corr/rollout_is_mean"]
    assert int(np.sum(step12["trmask/hist/log_ratio"].counts)) == valid
    assert len(step12["trmask/hist/log_ratio"].edges) == len(step12["trmask/hist/log_ratio"].counts) + 1
    # the pages: the trend of 12 steps, the report of step 12
    trend = (log_dir / "trend.html").read_text()
    assert trend.startswith("<!DOCTYPE html>") and "12 steps" in trend
    assert os.path.getmtime(log_dir / "trend.html") >= first_trend
    report = (log_dir / "report.html").read_text()
    assert report.startswith("<!DOCTYPE html>") and "train step 12" in report
    assert not [f for f in os.listdir(log_dir) if f.startswith(".tmp")]


def test_monitor_rejects_unknown_keywords(tmp_path):
    with pytest.raises(TypeError, match="'bogus'"):
        trmask.Monitor(tmp_path, bogus=1)
    with pytest.raises(ValueError, match="report_every"):
        trmask.Monitor(tmp_path, report_every=-1)


# ---- 6. a quiet start ----


def test_headless_first_call_prints_nothing_on_stderr(tmp_path):
    code = (
        "import logging, numpy as np, trmask\n"
        "logging.basicConfig(level=logging.INFO, stream=open(%r, 'w'))\n"
        "rng = np.random.default_rng(0); m = np.ones((2, 40))\n"
        "lp = -np.abs(rng.normal(1, 0.3, (2, 40))); roll = lp - np.abs(rng.normal(0, 0.01, (2, 40)))\n"
        "trmask.compute_rollout_correction_and_rejection_mask(lp, roll, m, rollout_is='token')\n"
        "print(trmask.backend_name())\n"
    ) % str(tmp_path / "log.txt")
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "TRMASK_REQUIRE_GPU")}
    lvp = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"
    if os.path.exists(lvp) and "VK_DRIVER_FILES" not in env:
        env["VK_DRIVER_FILES"] = lvp  # a Vulkan driver to probe, as on CI
    if "VK_DRIVER_FILES" in env:
        # the control: the engine opened without the package's start-up is what users saw
        raw = subprocess.run([sys.executable, "-c", "import trmask; trmask._native.engine_name('auto')"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert "XDG_RUNTIME_DIR is invalid or not set" in raw.stderr, raw.stderr
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    assert r.stdout.strip()
    # what `auto` chose went to the log (the `trmask` logger), not to stderr
    notes = trmask._native.engine_name("auto")[1]
    log = (tmp_path / "log.txt").read_text()
    assert all(n in log for n in notes), (notes, log)
