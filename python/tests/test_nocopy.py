"""A 1-million-token batch round-trips without a copy of its inputs: the native module reads
the caller's own memory (the address it borrowed is the array's / tensor's data pointer), for
NumPy and torch, log-probs, masks and bfloat16 logits."""

import numpy as np
import pytest

import trmask
from trmask import _native

B, T = 1024, 1024  # 1,048,576 tokens


def borrowed():
    return {name: (addr, nbytes) for name, addr, nbytes in _native.last_borrows()}


def batch(dtype):
    rng = np.random.default_rng(0)
    old = rng.normal(-1.0, 0.2, (B, T)).astype(dtype)
    roll = (old + rng.normal(0, 0.01, (B, T))).astype(dtype)
    mask = np.arange(T)[None, :] < rng.integers(1, T + 1, B)[:, None]
    return old, roll, mask


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_million_tokens_no_copy(dtype):
    old, roll, mask = batch(dtype)
    w, m, met = trmask.compute_rollout_correction_and_rejection_mask(
        old, roll, mask, rollout_is="token", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01, backend="cpu"
    )
    b = borrowed()
    assert b["old_log_prob"] == (old.ctypes.data, old.nbytes)
    assert b["rollout_log_prob"] == (roll.ctypes.data, roll.nbytes)
    assert b["response_mask"] == (mask.ctypes.data, mask.nbytes)
    assert w.shape == (B, T) and w.dtype == dtype and m.dtype == np.bool_
    assert met["rollout_corr/rollout_is_mean"] > 0


def test_torch_million_tokens_no_copy():
    torch = pytest.importorskip("torch")
    old, roll, mask = batch(np.float32)
    old_t, roll_t, mask_t = torch.from_numpy(old).bfloat16(), torch.from_numpy(roll).bfloat16(), torch.from_numpy(mask)
    w, m, _ = trmask.compute_rollout_correction_and_rejection_mask(old_t, roll_t, mask_t, rollout_is="token", backend="cpu")
    b = borrowed()
    assert b["old_log_prob"] == (old_t.data_ptr(), old_t.numel() * 2)
    assert b["rollout_log_prob"] == (roll_t.data_ptr(), roll_t.numel() * 2)
    assert b["response_mask"] == (mask_t.data_ptr(), mask_t.numel())
    assert isinstance(w, torch.Tensor) and w.shape == (B, T) and m.dtype == torch.bool


def test_logits_are_read_in_place():
    torch = pytest.importorskip("torch")
    r = torch.randn(64, 1000).bfloat16()
    o = (r.float() + 0.01).bfloat16()
    trmask.vocab_divergence(r, o, backend="cpu")
    b = borrowed()
    assert b["rollout_logits"] == (r.data_ptr(), r.numel() * 2)
    assert b["trainer_logits"] == (o.data_ptr(), o.numel() * 2)
    a = np.random.default_rng(1).normal(size=(64, 1000)).astype(np.float32)
    trmask.vocab_divergence(a, a, backend="cpu")
    assert borrowed()["rollout_logits"] == (a.ctypes.data, a.nbytes)
