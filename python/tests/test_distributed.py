"""trmask.distributed over real gloo process groups: 2 and 4 ranks on this machine, each with a
shard of one random batch (an empty shard and a one-sequence shard included). Each rank's
weights and mask must equal its rows of the single-process call on the whole batch, and every
rank's metrics the whole batch's (1e-12 relative; counts, maxima and fractions exactly)."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import trmask

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_worker.py")

KWARGS = {
    "preset": "decoupled_k3_rs_token_tis",
    "rollout_is_batch_normalize": True,
    "backend": "cpu",
    "trmask_metrics": True,
}


def batch(b=13, t=17, seed=7):
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.0, 0.4, (b, t))
    roll = old + rng.normal(0.0, 0.15, (b, t))
    roll[3] += 0.8  # a sequence far off, for the rejection sampler
    lens = rng.integers(1, t + 1, b)
    mask = (np.arange(t)[None, :] < lens[:, None]).astype(np.float32)
    adv = np.repeat(rng.normal(0, 1, b)[:, None], t, axis=1)
    uid = np.arange(b) // 3  # GRPO groups that straddle the shards
    return old, roll, mask, adv, uid


def run_ranks(tmp_path, cuts, env_extra=None):
    old, roll, mask, adv, uid = batch()
    bounds = [0] + list(np.cumsum(cuts))
    assert bounds[-1] == old.shape[0]
    world = len(cuts)
    for r in range(world):
        s = slice(bounds[r], bounds[r + 1])
        np.savez(tmp_path / f"in-{r}.npz", old=old[s], roll=roll[s], mask=mask[s], adv=adv[s], uid=uid[s])
    (tmp_path / "kwargs.json").write_text(json.dumps(KWARGS))
    init = tmp_path / "init"
    env = dict(os.environ, OMP_NUM_THREADS="1", TRMASK_THREADS="1", **(env_extra or {}))
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, str(r), str(world), str(init), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    logs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        logs.append(out.decode(errors="replace"))
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r]}"
    whole_w, whole_m, whole_metrics = trmask.compute_rollout_correction_and_rejection_mask(
        old, roll, mask, advantages=adv, uid=uid, **KWARGS
    )
    # a single process's first step flags the data warnings; ranks do not
    whole_metrics = {k: v for k, v in whole_metrics.items() if not k.startswith("trmask/warn/")}
    return bounds, whole_w, whole_m, whole_metrics, mask


def exact(key):
    """Counts, extrema and fractions merge exactly; sums and moments to rounding."""
    return any(s in key for s in ("count", "max", "min", "frac"))


@pytest.mark.parametrize("cuts", [[6, 7], [0, 1, 5, 7]], ids=["2-ranks", "4-ranks-empty-and-one"])
def test_shards_match_the_whole_batch(tmp_path, cuts):
    bounds, whole_w, whole_m, whole_metrics, mask = run_ranks(tmp_path, cuts)
    assert any(k.startswith("trmask/") for k in whole_metrics)
    assert 0 < whole_m.sum() < mask.sum()  # something is rejected, not everything
    for r in range(len(cuts)):
        s = slice(bounds[r], bounds[r + 1])
        out = np.load(tmp_path / f"out-{r}.npz")
        assert out["weights"].shape == whole_w[s].shape
        np.testing.assert_allclose(out["weights"], whole_w[s], rtol=1e-12, atol=0)
        np.testing.assert_array_equal(out["mask"], whole_m[s])
        metrics = json.loads((tmp_path / f"metrics-{r}.json").read_text())
        assert sorted(metrics) == sorted(whole_metrics)
        for k, v in whole_metrics.items():
            got = metrics[k]
            if isinstance(v, float) and math.isnan(v):
                assert math.isnan(got), k
            elif exact(k):
                assert got == v, (k, got, v)
            else:
                assert got == pytest.approx(v, rel=1e-12, abs=1e-300), (k, got, v)


def test_needs_an_initialized_group():
    import trmask.distributed

    if dist.is_initialized():
        pytest.skip("a default group exists in this process")
    with pytest.raises(RuntimeError, match="not initialized"):
        trmask.distributed.compute_rollout_correction_and_rejection_mask(
            np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2))
        )


def test_all_gather_errors_reach_the_caller():
    from trmask import _native

    old, roll, mask, _, _ = batch(b=5, t=4)
    tensors = {"old_log_prob": old, "rollout_log_prob": roll, "response_mask": mask}
    cfg = json.dumps({"rollout_is": "token", "rollout_rs": None})

    class Boom(Exception):
        pass

    def boom(local):
        raise Boom("transport down")

    with pytest.raises(Boom, match="transport down"):
        _native.correct_shard(tensors, cfg, "cpu", 0, 2, boom)
    with pytest.raises(ValueError, match="all_gather.*1 buffers for 2 ranks"):
        _native.correct_shard(tensors, cfg, "cpu", 0, 2, lambda b: [b])
    with pytest.raises(ValueError, match="rank"):
        _native.correct_shard(tensors, cfg, "cpu", 2, 2, lambda b: [b, b])
    # a one-rank world: nothing is exchanged, the single-process call
    one = _native.correct_shard(tensors, cfg, "cpu", 0, 1, boom)
    whole = _native.correct(tensors, cfg, "cpu")
    np.testing.assert_array_equal(one["weights"], whole["weights"])
    assert one["metrics"] == whole["metrics"]


def test_monitor_merges_ranks_and_only_rank_0_writes(tmp_path):
    bounds, whole_w, whole_m, whole_metrics, mask = run_ranks(tmp_path, [5, 8], {"TRMASK_TEST_MONITOR": "1"})
    assert sorted(os.listdir(tmp_path / "mon-0")) == ["metrics.jsonl", "report.html", "tensorboard", "trend.html"]
    assert not (tmp_path / "mon-1").exists()
    (line,) = (tmp_path / "mon-0" / "metrics.jsonl").read_text().splitlines()
    logged = json.loads(line)
    assert logged["step"] == 7
    for k, v in whole_metrics.items():
        assert logged[k] == pytest.approx(v, rel=1e-12, abs=1e-300), k
    for r in range(2):
        out = np.load(tmp_path / f"out-{r}.npz")
        s = slice(bounds[r], bounds[r + 1])
        np.testing.assert_allclose(out["weights"], whole_w[s], rtol=1e-12, atol=0)
    # the histogram of log rho counts every valid token of the whole batch (merged bins)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tmp_path / "mon-0" / "tensorboard"), size_guidance={"histograms": 0})
    ea.Reload()
    (h,) = ea.Histograms("trmask/hist/log_ratio")
    assert h.step == 7 and h.histogram_value.num == int(mask.sum())
