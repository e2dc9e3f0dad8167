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


def _step(seed, b=64, t=1024, dtype=np.float32):
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.0, 0.3, (b, t)).astype(dtype)
    roll = (old + rng.normal(0, 0.05, (b, t))).astype(dtype)
    mask = (np.arange(t)[None, :] < rng.integers(1, t + 1, b)[:, None]).astype(dtype)
    return old, roll, mask


def _call(seed, **kw):
    old, roll, mask = _step(seed, **kw)
    return trmask.compute_rollout_correction_and_rejection_mask(
        old, roll, mask, rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.9_1.1", backend="cpu"
    )


def test_outputs_in_use_are_never_reused():
    """Output buffers are recycled only once nothing refers to them: arrays, views and torch
    tensors the caller still holds keep their values through later calls."""
    w1, m1, _ = _call(1)
    view = _call(2)[0][3:, 5:]  # only a view of the second call's weights survives
    keep = (w1.copy(), m1.copy(), view.copy())
    for seed in range(3, 12):
        w, m, _ = _call(seed)
        assert not np.shares_memory(w, w1) and not np.shares_memory(m, m1)
        assert not np.shares_memory(w, view) and not np.shares_memory(m, view)
    assert np.array_equal(w1, keep[0]) and np.array_equal(m1, keep[1])
    assert np.array_equal(view, keep[2])


def test_released_outputs_are_reused_and_rewritten():
    """A released buffer comes back for the next call of that size (no fresh pages to fault
    in), every slot rewritten: the result equals the one computed into fresh memory."""
    want = [x.copy() for x in _call(2)[:2]]
    w, m, _ = _call(1)
    del w, m
    pool = trmask._OUT.items
    before = [id(a) for a in pool]
    w2, m2, _ = _call(2)
    # both outputs are views of buffers the pool already held: nothing new was allocated
    assert sorted(id(a) for a in pool) == sorted(before)
    assert any(np.shares_memory(w2, a) for a in pool) and any(np.shares_memory(m2, a) for a in pool)
    assert np.array_equal(w2, want[0]) and np.array_equal(m2, want[1])
    small = [x.copy() for x in _call(3, b=4, t=100)[:2]]
    del w2, m2
    sw, sm, _ = _call(3, b=4, t=100)  # far smaller: a buffer of its own size
    assert sw.shape == (4, 100) and np.array_equal(sw, small[0]) and np.array_equal(sm, small[1])


def test_torch_outputs_in_use_are_never_reused():
    torch = pytest.importorskip("torch")
    old, roll, mask = (torch.from_numpy(x) for x in _step(5))
    kw = dict(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.9_1.1", backend="cpu")
    w1, m1, _ = trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, **kw)
    keep = (w1.clone(), m1.clone())
    for seed in range(6, 12):
        o, r, k = (torch.from_numpy(x) for x in _step(seed))
        w, m, _ = trmask.compute_rollout_correction_and_rejection_mask(o, r, k, **kw)
        assert w.data_ptr() != w1.data_ptr() and m.data_ptr() != m1.data_ptr()
    assert torch.equal(w1, keep[0]) and torch.equal(m1, keep[1])


def test_torch_inputs_read_as_they_are_after_the_first_call(monkeypatch):
    """After a first call of a (dtype, role) pair, a contiguous CPU tensor is read in place
    without the full conversion: the same borrowed addresses and the same results, and tensors
    that cannot be read as they are (a transposed view, one requiring grad, a bfloat16 one)
    still go through the full conversion."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(8, 64, generator=g) * 3
    roll = old + 0.05 * torch.randn(8, 64, generator=g)
    mask = (torch.arange(64)[None, :] < torch.randint(1, 65, (8, 1), generator=g)).float()
    cfg = dict(rollout_is="token", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01, backend="cpu")
    first = trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, **cfg)
    conv = trmask._convert
    assert conv._AS_IS[(np.dtype(np.float32), "values")].dtype == torch.float32
    # the second call reads each tensor by its one `Tensor.numpy()`: the full conversion, which
    # starts by recognising a tensor, is not entered
    full = []
    is_torch = conv.is_torch
    monkeypatch.setattr(conv, "is_torch", lambda x: full.append(x) or is_torch(x))
    again = trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, **cfg)
    assert full == []
    b = borrowed()
    assert b["old_log_prob"] == (old.data_ptr(), old.numel() * 4)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert first[2] == again[2]
    # the same values column-major (not contiguous): copied by the full conversion
    nc = old.t().contiguous().t()
    assert not nc.is_contiguous()
    got = trmask.compute_rollout_correction_and_rejection_mask(nc, roll, mask, **cfg)
    assert torch.equal(got[0], first[0]) and got[2] == first[2]
    grad = old.clone().requires_grad_(True)
    got = trmask.compute_rollout_correction_and_rejection_mask(grad, roll, mask, **cfg)
    assert torch.equal(got[0], first[0])
    bf = trmask.compute_rollout_correction_and_rejection_mask(
        old.bfloat16(), roll.bfloat16(), mask, **cfg
    )
    assert bf[0].dtype == torch.float32
