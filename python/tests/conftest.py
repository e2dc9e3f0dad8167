"""Shared helpers: the repository's data directory and whether a GPU adapter exists."""

import os
import sys

import pytest

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_GPU = None


def gpu_available():
    """True when `backend="gpu"` opens an adapter. With TRMASK_REQUIRE_GPU=1 (CI) a missing
    adapter fails the GPU tests instead of skipping them."""
    global _GPU
    if _GPU is None:
        import trmask

        try:
            trmask.backend_name("gpu")
            _GPU = True
        except ValueError:
            _GPU = False
        except RuntimeError:
            _GPU = False
        if not _GPU and os.environ.get("TRMASK_REQUIRE_GPU") == "1":
            _GPU = True  # run the GPU tests so that they fail
    return _GPU


@pytest.fixture
def torch():
    return pytest.importorskip("torch")
