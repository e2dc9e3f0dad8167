"""The Python snippets of README.md and docs/PYTHON.md run, and the verl / TRL replacement
functions of docs/PYTHON.md give what verl's function gives on a fake verl batch."""

import os
import re

import numpy as np
import pytest

import trmask
from conftest import DATA

ROOT = os.path.join(DATA, "..")


def blocks(path):
    with open(os.path.join(ROOT, path)) as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.S | re.M)


def test_readme_python_snippet_runs(capsys):
    (code,) = blocks("README.md")
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[[True, True, True], [False, False, False]]"
    assert float(out[1]) == pytest.approx(0.4, abs=1e-7)
    assert float(out[2]) == pytest.approx(4.096)


class _Proto:
    """verl's DataProto as the replacement uses it: a dict of tensors under `.batch`."""

    def __init__(self, **tensors):
        self.batch = dict(tensors)


def test_python_md_snippets():
    codes = blocks("docs/PYTHON.md")
    assert len(codes) == 5
    ns = {}
    for c in codes:
        exec(compile(c, "docs/PYTHON.md", "exec"), ns)
    rng = np.random.default_rng(0)
    old = rng.normal(-1, 0.3, (4, 6)).astype(np.float32)
    roll = old + rng.normal(0, 0.3, (4, 6)).astype(np.float32)
    mask = np.ones((4, 6), np.float32)
    mask[3, 2:] = 0
    cfg = {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_max_k2", "rollout_rs_threshold": 0.05}
    batch, metrics = ns["rollout_correction"](_Proto(old_log_probs=old, rollout_log_probs=roll, response_mask=mask), cfg)
    w, m, met = trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, **cfg)
    np.testing.assert_array_equal(batch.batch["response_mask"], m)
    np.testing.assert_array_equal(batch.batch["rollout_is_weights"], w)
    assert metrics == met and batch.batch["response_mask"].dtype == np.float32
    w2, m2, _ = ns["vllm_is_correction"](old, roll, mask, cap=2.0)
    ratio = np.minimum(np.exp(old.astype(np.float64) - roll), 2.0) * mask
    np.testing.assert_allclose(w2, ratio, rtol=1e-6)
