"""Inputs in, outputs out: NumPy arrays and CPU torch tensors, without copies where the layout
allows and without importing torch unless the caller passed a tensor."""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _native

# What the native module borrows as is; anything else is converted (a copy).
_VALUE_DTYPES = {np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16)}
_MASK_DTYPES = {
    np.dtype(np.bool_),
    np.dtype(np.uint8),
    np.dtype(np.int64),
    np.dtype(np.float32),
    np.dtype(np.float64),
}
_LOGIT_DTYPES = {np.dtype(np.float32), np.dtype(np.float16)}


def _bad(name: str, problem: str) -> ValueError:
    return ValueError(f"invalid input `{name}`: {problem}")


def is_torch(x: Any) -> bool:
    """A torch.Tensor, recognised without importing torch."""
    return type(x).__module__.startswith("torch") and hasattr(x, "__dlpack__")


class Kind:
    """Where an input came from, so outputs go back the same way."""

    def __init__(self, torch: bool, dtype: Any, device: Any = None):
        self.torch = torch
        self.dtype = dtype
        self.device = device

    def out(self, a: Optional[np.ndarray], dtype: Any = None) -> Any:
        """`a` (a NumPy array) as this kind: a torch tensor for torch inputs (on the input's
        CPU device), else NumPy; cast to `dtype` (default: this input's dtype)."""
        if a is None:
            return None
        dtype = self.dtype if dtype is None else dtype
        if self.torch:
            torch = sys.modules["torch"]
            t = torch.from_numpy(np.ascontiguousarray(a))
            if dtype is not None and t.dtype != dtype:
                t = t.to(dtype)
            if self.device is None or self.device.type == "cpu":
                return t
            return t.to(self.device)
        return a if dtype is None else a.astype(dtype, copy=False)


def float_out_dtype(kind: Kind) -> Any:
    """The dtype of weights and per-token statistics for inputs of `kind`: float64 and float32
    stay; float16 and bfloat16 give float32 (a weight near 2.0 has 3 significant digits in
    bfloat16)."""
    if kind.torch:
        torch = sys.modules["torch"]
        return kind.dtype if kind.dtype in (torch.float64, torch.float32) else torch.float32
    d = np.dtype(kind.dtype)
    return d if d in (np.dtype(np.float64), np.dtype(np.float32)) else np.dtype(np.float32)


# The tensor types (torch.Tensor and its subclasses) seen so far, and per (NumPy dtype of
# `Tensor.numpy()`, role) the kind of a CPU tensor the native module reads as it is (no check
# or copy): both learnt from the full path below, which a first call of each takes. The fast
# path makes one torch call per tensor (`Tensor.numpy()`, which refuses tensors on other
# devices, that need grad, or carry a conjugate / negative bit): right after other torch work
# (verl's own call, a trainer's step) each torch call costs 3-24 µs instead of 0.3-0.9
# (medians measured here).
_TENSOR_TYPES: set = set()
_AS_IS: Dict[Tuple[Any, str], "Kind"] = {}


def borrow(x: Any, name: str, role: str) -> Tuple[Any, Kind]:
    """`x` as what the native module reads: a C-contiguous NumPy array of a supported dtype,
    or `("bfloat16", uint16 bits)`. `role` is `values`, `mask`, `ids`, `experts` (MoE routed
    experts: int32 or int64 as they are) or `logits`. A view of
    the caller's memory whenever its dtype and layout allow (no copy); otherwise a converted
    copy."""
    if type(x) in _TENSOR_TYPES:
        # the trainer's every-step case first: a CPU tensor read in place
        try:
            a = x.numpy()
        except (RuntimeError, TypeError):
            a = None  # another device, grad, a conjugate or negative view: the full path
        if a is not None and a.flags.c_contiguous:
            kind = _AS_IS.get((a.dtype, role))
            if kind is not None:
                return a, kind
    if is_torch(x):
        _TENSOR_TYPES.add(type(x))
        torch = sys.modules["torch"]
        kind = Kind(True, x.dtype, x.device)
        t = x.detach() if x.requires_grad else x
        if t.device.type != "cpu":
            t = _to_host(t, name)
        if not t.is_contiguous():
            t = t.contiguous()
        if t.dtype == torch.bfloat16:
            if role in ("values", "logits"):
                bits = _host_array(t.view(torch.int16)).view(np.uint16)
                return ("bfloat16", bits), kind
            t = t.float()
        elif t.is_complex() or t.dtype in (torch.uint16, torch.uint32, torch.uint64):
            raise _bad(name, f"has unsupported dtype {t.dtype}")
        a = _numpy(_host_array(t), name, role)
        if t is x and kind.device.type == "cpu" and a.ctypes.data == x.data_ptr():
            # read in place, as it is: the same array and kind for every such tensor
            _AS_IS.setdefault((a.dtype, role), Kind(True, x.dtype, None))
        return a, kind
    if isinstance(x, tuple) and len(x) == 2 and x[0] == "bfloat16":
        return x, Kind(False, np.float32)
    a = np.asarray(x)
    kind = Kind(False, a.dtype)
    if a.dtype.name == "bfloat16":  # ml_dtypes / jax bfloat16 arrays
        a = np.ascontiguousarray(a)
        if role in ("values", "logits"):
            return ("bfloat16", a.view(np.uint16)), Kind(False, np.float32)
        a = a.astype(np.float32)
    return _numpy(a, name, role), kind


def _host_array(t: Any) -> np.ndarray:
    """A CPU tensor's memory as a NumPy array, no copy (`Tensor.numpy`, a few times cheaper
    than DLPack; DLPack for what it refuses)."""
    try:
        return t.numpy()
    except (RuntimeError, TypeError):
        return np.from_dlpack(t)


def _to_host(t: Any, name: str) -> Any:
    """A device tensor copied to host memory once (pinned for CUDA, so the copy runs at the
    link's full rate); outputs go back to the input's device (`Kind.out`). A device whose
    tensors cannot be read (`meta`) is an error naming the tensor."""
    torch = sys.modules["torch"]
    try:
        if t.device.type == "cuda":
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t)
            return host
        return t.to("cpu")
    except (NotImplementedError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _bad(name, f"is on {t.device} and cannot be copied to host memory ({first})") from None


def _labels(a: np.ndarray, name: str) -> np.ndarray:
    """verl's ``uid`` (strings, one per prompt) as group ids, equal on every rank: the native
    library's hash of each label, the ids the command line gives them."""
    flat = a.ravel().tolist()
    if all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        return np.asarray(flat, dtype=np.int64).reshape(a.shape)
    texts = []
    for v in flat:
        if isinstance(v, bytes):
            texts.append(v.decode("utf-8", "replace"))
        elif isinstance(v, str):
            texts.append(v)
        else:
            raise _bad(name, f"mixes numbers and string labels ({v!r})")
    return np.asarray(_native.label_ids(texts), dtype=np.int64).reshape(a.shape)


def _numpy(a: np.ndarray, name: str, role: str) -> np.ndarray:
    if name == "uid" and a.dtype.kind in "OUS":
        a = _labels(a, name)
    if a.dtype.kind in "OUSVcMm":
        raise _bad(name, f"has unsupported dtype {a.dtype}")
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if role == "values" and a.dtype not in _VALUE_DTYPES:
        a = a.astype(np.float64)
    elif role == "mask" and a.dtype not in _MASK_DTYPES:
        a = a.astype(np.float64 if a.dtype.kind == "f" else np.int64)
    elif role == "experts" and a.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        # MoE routed experts: int32 and int64 are read as they are, narrower ints widened
        if a.dtype.kind not in "iu":
            raise _bad(name, f"must hold integer expert ids, got dtype {a.dtype}")
        a = a.astype(np.int32 if a.dtype.itemsize < 4 else np.int64)
    elif role == "ids" and a.dtype != np.int64:
        if a.dtype.kind not in "iub":
            raise _bad(name, f"must hold integer ids, got dtype {a.dtype}")
        a = a.astype(np.int64)
    elif role == "logits" and a.dtype not in _LOGIT_DTYPES:
        if a.dtype != np.float64:
            raise _bad(name, f"must be float32, float16 or bfloat16 logits, got {a.dtype}")
        raise _bad(
            name,
            "is float64; logits are read as float32, float16 or bfloat16 (cast them, e.g. "
            "logits.astype(np.float32))",
        )
    return np.ascontiguousarray(a)


def shape_of(x: Any) -> Tuple[int, ...]:
    """The shape of a borrowed input (bfloat16 tuples included)."""
    if isinstance(x, tuple):
        return tuple(x[1].shape)
    return tuple(x.shape)
