"""torch inputs (CPU; skipped cleanly without torch): every dtype gives the same result as
NumPy, torch in → torch out, and the exact KL from bfloat16 logits equals the Rust CPU
reference (the `trmask` CLI on the same bf16 bytes) bit for bit."""

import json
import os
import struct
import subprocess

import numpy as np
import pytest

import trmask
from conftest import DATA
from test_api import MASK, OLD, ROLLOUT, _trmask_bin

torch = pytest.importorskip("torch")

CFG = dict(rollout_is="sequence", rollout_is_threshold=5.0, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.5)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mdtype", ["bool", "int64", "int32", "float32", "bfloat16"])
def test_torch_matches_numpy(dtype, mdtype):
    td = getattr(torch, dtype)
    old = torch.tensor(np.nan_to_num(OLD)).to(td)
    roll = torch.tensor(np.nan_to_num(ROLLOUT)).to(td)
    mask = torch.tensor(MASK).to(getattr(torch, mdtype))
    w, m, met = trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, **CFG, backend="cpu")
    # NumPy reference on the same (rounded) values
    w64, m64, met64 = trmask.compute_rollout_correction_and_rejection_mask(
        old.double().numpy(), roll.double().numpy(), mask.double().numpy(), **CFG, backend="cpu"
    )
    assert isinstance(w, torch.Tensor) and isinstance(m, torch.Tensor)
    assert m.dtype == mask.dtype
    assert w.dtype == (td if dtype in ("float64", "float32") else torch.float32)
    assert w.device == old.device
    np.testing.assert_array_equal(m.double().numpy(), m64)
    np.testing.assert_array_equal(w.numpy(), w64.astype(w.numpy().dtype))
    assert met == met64


def test_requires_grad_and_non_contiguous():
    old = torch.tensor(OLD, requires_grad=True)
    roll = torch.tensor(np.nan_to_num(ROLLOUT)).t().contiguous().t()  # a transposed view
    assert not roll.is_contiguous()
    w, m, _ = trmask.compute_rollout_correction_and_rejection_mask(old, roll, torch.tensor(MASK), rollout_is="token", backend="cpu")
    w2, _, _ = trmask.compute_rollout_correction_and_rejection_mask(OLD, np.nan_to_num(ROLLOUT), MASK, rollout_is="token", backend="cpu")
    np.testing.assert_array_equal(w.numpy(), w2)
    assert not w.requires_grad


def test_vocab_divergence_torch_dtypes():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 40, generator=g) * 2
    b = a + 0.1 * torch.randn(2, 3, 40, generator=g)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        d = trmask.vocab_divergence(a.to(dt), b.to(dt), backend="cpu")
        ref = trmask.vocab_divergence(a.to(dt).float().numpy(), b.to(dt).float().numpy(), backend="cpu")
        assert isinstance(d["kl"], torch.Tensor) and d["kl"].shape == (2, 3)
        np.testing.assert_array_equal(d["kl"].numpy(), ref["kl"])


def test_vocab_divergence_cpu_fast_is_within_the_gpu_tolerance():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 5, 32000, generator=g) * 3
    b = a + 0.05 * torch.randn(3, 5, 32000, generator=g)
    for dt in (torch.float32, torch.bfloat16):
        fast = trmask.vocab_divergence(a.to(dt), b.to(dt), backend="cpu-fast")
        ref = trmask.vocab_divergence(a.to(dt), b.to(dt), backend="cpu")
        for k, (rtol, atol) in {"kl": (2e-3, 1e-7), "kl_rev": (2e-3, 1e-7), "tv": (2e-3, 1e-7)}.items():
            np.testing.assert_allclose(fast[k].numpy(), ref[k].numpy(), rtol=rtol, atol=atol)
        assert not np.array_equal(fast["kl"].numpy(), ref["kl"].numpy()), "the f32 path ran"
    assert "f32" in trmask.backend_name("cpu-fast")


def test_a_device_tensor_that_cannot_reach_the_host_is_a_value_error_naming_it():
    # `meta` tensors have no data: the copy-to-host path refuses them cleanly
    old = torch.zeros(2, 3, device="meta")
    roll = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="`old_log_prob`.*meta"):
        trmask.compute_rollout_correction_and_rejection_mask(old, roll, torch.ones(2, 3), rollout_is="token")


def test_cuda_tensors_round_trip_through_host_memory():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 16, generator=g)
    roll = old + 0.1 * torch.randn(4, 16, generator=g)
    mask = torch.ones(4, 16)
    cfg = dict(rollout_is="token", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01)
    w, m, met = trmask.compute_rollout_correction_and_rejection_mask(old.cuda(), roll.cuda(), mask.cuda(), **cfg)
    w0, m0, met0 = trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, **cfg)
    assert w.device.type == "cuda" and m.device.type == "cuda" and w.dtype == old.dtype
    assert torch.equal(w.cpu(), w0) and torch.equal(m.cpu(), m0) and met == met0


def _safetensors(path, tensors):
    """A minimal safetensors writer (header + raw little-endian bytes)."""
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_bf16_exact_kl_bit_for_bit_with_the_rust_cpu_reference(tmp_path):
    exe = _trmask_bin()
    if exe is None:
        pytest.skip("the trmask CLI is not built (cargo build)")
    g = torch.Generator().manual_seed(7)
    b, t, v = 3, 5, 1003
    rl = (torch.randn(b, t, v, generator=g) * 3).to(torch.bfloat16)
    ol = (rl.float() + 0.05 * torch.randn(b, t, v, generator=g)).to(torch.bfloat16)
    ids = torch.randint(0, v, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, 3:] = False
    py = trmask.vocab_divergence(rl, ol, responses=ids, mask=mask, backend="cpu")
    bits = lambda x: x.contiguous().view(torch.int16).numpy().tobytes()  # noqa: E731
    path = tmp_path / "bf16.safetensors"
    _safetensors(path, {
        "rollout_logits": ("BF16", rl.shape, bits(rl)),
        "old_logits": ("BF16", ol.shape, bits(ol)),
        "responses": ("I64", ids.shape, ids.numpy().astype("<i8").tobytes()),
        "response_mask": ("F32", mask.shape, mask.float().numpy().astype("<f4").tobytes()),
    })
    out = tmp_path / "out.json"
    subprocess.run([exe, "analyze", str(path), "--backend", "cpu", "--output", str(out)], check=True, capture_output=True)
    cli = json.loads(out.read_text())
    for k in ("kl", "kl_rev", "tv", "rollout_entropy", "training_entropy"):
        ref = np.array(cli[k], dtype=np.float64)
        got = py[k].numpy()
        assert got.dtype == np.float64
        assert np.array_equal(got, np.where(mask.numpy(), ref, 0.0)), k
    assert (py["kl"].numpy()[mask.numpy()] > 0).all()


def test_analyze_torch_dict_returns_torch():
    a = trmask.analyze({"old_log_prob": torch.tensor(OLD), "rollout_log_prob": torch.tensor(np.nan_to_num(ROLLOUT)),
                        "response_mask": torch.tensor(MASK)}, preset="decoupled_k3_rs", backend="cpu")
    assert isinstance(a["outputs"]["k3"], torch.Tensor)
