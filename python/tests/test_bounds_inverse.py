"""trmask.bounds(..., target_error=E): the answer plugged back gives E, a δ a millionth larger
exceeds it, and it agrees with the command line's inversion."""

import pytest

import trmask


@pytest.mark.parametrize("eps", [None, 5e-3])
@pytest.mark.parametrize("target", [1e-3, 1.0, 4.096])
def test_target_error_round_trip(eps, target):
    r = trmask.bounds(horizon=4096, target_error=target, eps=eps)
    assert r["target_error"] == target
    d = r["delta"]
    assert trmask.bounds(horizon=4096, delta=d, eps=eps)["unified"] == pytest.approx(target, rel=1e-9)
    assert trmask.bounds(horizon=4096, delta=d * (1 + 1e-6), eps=eps)["unified"] > target
    assert r["bounds"]["unified"] <= target
    assert r["eps_from"] == ("given" if eps is not None else "pinsker")


def test_target_error_bad_input():
    with pytest.raises(ValueError, match="target-error"):
        trmask.bounds(horizon=10, target_error=-1.0)
    with pytest.raises(ValueError, match="never exceeded"):
        trmask.bounds(horizon=1, target_error=1.0)
    with pytest.raises(ValueError, match="target_error"):
        trmask.bounds(horizon=10, delta=1e-3, target_error=1.0)
    with pytest.raises(ValueError, match="delta"):
        trmask.bounds(horizon=10)
