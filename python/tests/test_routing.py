"""MoE routing from Python (issue 42): `trmask.analyze` and the verl drop-in accept both sides'
routed experts (NumPy or torch, any integer dtype, vLLM's / slime's names) and reproduce the
sample's reference metrics; bad routing is a ValueError naming the tensor."""

import json
import os
import struct

import numpy as np
import pytest

import trmask
from conftest import DATA

SAMPLE = os.path.join(DATA, "moe-sample")
DTYPES = {"F32": np.float32, "I32": np.int32, "I64": np.int64}


def load():
    """The sample's tensors (safetensors read by hand: header length, JSON header, data)."""
    with open(os.path.join(SAMPLE, "batch.safetensors"), "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a : 8 + n + b], DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def reference():
    with open(os.path.join(SAMPLE, "reference_metrics.json")) as f:
        return json.load(f)


def check(metrics, rtol=1e-9):
    want = reference()
    got = {k: v for k, v in metrics.items() if k.startswith("trmask/routing/")}
    assert set(got) == set(want)
    for k, v in want.items():
        assert abs(got[k] - v) <= rtol * abs(v), (k, got[k], v)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int16])
def test_analyze_reproduces_the_reference(dtype):
    t = load()
    batch = {
        "rollout_log_prob": t["rollout_log_prob"],
        "old_log_prob": t["old_log_prob"],
        "response_mask": t["response_mask"],
        "rollout_routed_experts": t["rollout_routed_experts"].astype(dtype),
        "old_routed_experts": t["old_routed_experts"].astype(dtype),
    }
    out = trmask.analyze(batch, backend="cpu")
    check(out["metrics"])
    flip = out["outputs"]["route_flip"]
    assert flip.shape == (64, 384)
    assert int(flip[t["response_mask"] > 0].sum()) == 251
    assert out["outputs"]["route_first_layer"].shape == (64, 384)


def test_vllm_name_and_torch(torch):
    t = load()
    batch = {k: torch.from_numpy(v.copy()) for k, v in t.items() if k != "uid"}
    batch["routed_experts"] = batch.pop("rollout_routed_experts").to(torch.int16)
    out = trmask.analyze(batch, backend="cpu")
    check(out["metrics"])
    assert isinstance(out["outputs"]["route_overlap"], torch.Tensor)


def test_drop_in_criteria_and_metrics():
    t = load()
    w, mask, metrics = trmask.compute_rollout_correction_and_rejection_mask(
        t["old_log_prob"],
        t["rollout_log_prob"],
        t["response_mask"],
        rollout_rs="seq_mean_route_flip",
        rollout_rs_threshold=0.02,
        rollout_routed_experts=t["rollout_routed_experts"],
        old_routed_experts=t["old_routed_experts"].astype(np.int16),
        backend="cpu",
        trmask_metrics=True,
    )
    assert w is None
    check(metrics)
    # 13 of 64 sequences have more than 2% of their recorded tokens flipped (the CLI's count)
    rows_kept = (mask.sum(axis=1) > 0).sum()
    assert rows_kept == 51
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(13 / 64)


def test_bad_routing_is_a_value_error():
    t = load()
    r = t["rollout_routed_experts"].copy()
    r[0, 0, 0, 1] = r[0, 0, 0, 0]
    base = {
        "rollout_log_prob": t["rollout_log_prob"],
        "old_log_prob": t["old_log_prob"],
        "response_mask": t["response_mask"],
    }
    with pytest.raises(ValueError, match="rollout_routed_experts.*twice"):
        trmask.analyze({**base, "rollout_routed_experts": r, "old_routed_experts": t["old_routed_experts"]})
    with pytest.raises(ValueError, match="old_routed_experts.*missing"):
        trmask.analyze({**base, "rollout_routed_experts": t["rollout_routed_experts"]})
    with pytest.raises(ValueError, match="old_routed_experts"):
        trmask.analyze(
            {**base, "rollout_routed_experts": t["rollout_routed_experts"], "old_routed_experts": t["old_routed_experts"][:, :, :3]}
        )
    with pytest.raises(ValueError, match="old_routed_experts"):
        trmask.compute_rollout_correction_and_rejection_mask(
            t["old_log_prob"],
            t["rollout_log_prob"],
            t["response_mask"],
            rollout_routed_experts=t["rollout_routed_experts"],
            old_routed_experts=t["old_routed_experts"].astype(np.float32),
        )


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_routing_is_borrowed_not_copied(dtype):
    t = load()
    r = np.ascontiguousarray(t["rollout_routed_experts"].astype(dtype))
    o = np.ascontiguousarray(t["old_routed_experts"].astype(dtype))
    w, mask, metrics = trmask.compute_rollout_correction_and_rejection_mask(
        t["old_log_prob"],
        t["rollout_log_prob"],
        t["response_mask"],
        rollout_routed_experts=r,
        old_routed_experts=o,
        backend="cpu",
        trmask_metrics=True,
    )
    check(metrics)
    got = {name: (addr, n) for name, addr, n in trmask._native.last_borrows()}
    for name, a in (("rollout_routed_experts", r), ("old_routed_experts", o)):
        assert got[name] == (a.ctypes.data, a.nbytes), name


def test_monitor_logs_the_routing(tmp_path):
    """The Monitor takes the routing tensors like the drop-in and logs trmask/routing/* in its
    JSONL line, equal to the reference."""
    t = load()
    mon = trmask.Monitor(str(tmp_path), rollout_rs="seq_mean_route_flip", rollout_rs_threshold=0.02, backend="cpu")
    _, mask, metrics = mon.step(
        0,
        t["old_log_prob"],
        t["rollout_log_prob"],
        t["response_mask"],
        rollout_routed_experts=t["rollout_routed_experts"],
        old_routed_experts=t["old_routed_experts"],
    )
    mon.close()
    check(metrics)
    assert (mask.sum(axis=1) > 0).sum() == 51
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1
    logged = json.loads(lines[0])
    flat = logged.get("metrics", logged)
    assert any(k.startswith("trmask/routing/") for k in flat), sorted(flat)[:5]
