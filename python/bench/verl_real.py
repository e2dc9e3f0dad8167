"""verl's own `compute_rollout_correction_and_rejection_mask` against trmask's, one process,
same tensors, best and median of --repeat runs per cell, Markdown table on stdout.

verl comes from PyPI (`pip install --no-deps verl==0.9.1`); its rollout-correction helper is
loaded from the installed file with the imports it does not use for this function replaced by
empty stand-ins (tensordict, transformers, the device helpers, the config classes); DataProto,
which only wraps the returned weights, is a one-field holder. Nothing of verl is in this
repository.

    RAYON_NUM_THREADS=2 python python/bench/verl_real.py --threads 2 --repeat 5
    RAYON_NUM_THREADS=2 python python/bench/verl_real.py --threads 2 --repeat 5 --diagnostics
"""

import argparse
import importlib.metadata
import pathlib
import sys

import numpy as np
import torch
from verl_signature import best as timed  # best / median of `repeat` calls

# verl_files (loading verl's files under stand-in packages) is shared with python/tests; a copy
# beside this script (scripts/gpu-bench.sh) is found first
sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from verl_files import load_file, stub, verl_root  # noqa: E402


class _DataProto:
    """Holds the weights (verl's DataProto wraps them in a TensorDict)."""

    def __init__(self, batch):
        self.batch = batch

    @classmethod
    def from_dict(cls, tensors):
        return cls(dict(tensors))


def load_verl():
    root = verl_root()
    if root is None:
        sys.exit("verl is not installed: pip install --no-deps verl==0.9.1")
    for pkg in ("verl", "verl.utils", "verl.trainer", "verl.trainer.ppo", "verl.trainer.config", "verl.workers", "verl.workers.config"):
        stub(pkg)
    stub("tensordict", TensorDict=dict)
    stub("transformers", PreTrainedTokenizer=object)
    stub("verl.utils.device", get_device_name=lambda: "cpu", get_torch_device=lambda: torch.cpu)
    stub("verl.protocol", DataProto=_DataProto)
    stub("verl.trainer.config.algorithm", RolloutCorrectionConfig=object)
    stub("verl.workers.config.actor", PolicyLossConfig=object)
    vf = load_file("verl.utils.torch_functional", root / "utils" / "torch_functional.py")
    sys.modules["verl.utils"].torch_functional = vf
    helper = load_file("verl.trainer.ppo.rollout_corr_helper", root / "trainer" / "ppo" / "rollout_corr_helper.py")
    version = getattr(importlib.metadata, "version", lambda _: "?")("verl")
    return helper.compute_rollout_correction_and_rejection_mask, version


CONFIGS = [
    ("token TIS 2.0 + `seq_mean_k3` 0.01", dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01)),
    ("seq IS 2.0 + `seq_max_k2` 2.5 (TRM-max)", dict(rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="seq_max_k2", rollout_rs_threshold=2.5)),
    ('`token_k1` "0.5_2.0"', dict(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")),
]
SHAPES = [(64, 1024), (256, 8192), (1024, 4096)]


def batch(b, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    roll = old + 0.05 * torch.randn(b, t, generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    return old, roll, mask


def diagnostics_inputs(b, t, seed=1):
    """What a GRPO trainer's batch already holds besides the log-probs: per-token advantages
    (one value per response, broadcast over its tokens, as verl's GRPO estimator writes them)
    and each response's prompt group (`uid`, 8 responses per prompt)."""
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(b, 1, generator=g).expand(b, t).contiguous()
    uid = torch.arange(b, dtype=torch.int64) // 8
    return dict(advantages=adv, uid=uid, trmask_metrics=True)


def agree(v, t):
    """verl's and trmask's outputs: same dtypes, masks equal, weights and metrics close (on
    verl's keys: with `trmask_metrics` trmask returns its own `trmask/*` besides)."""
    vw, vm, vmet = v
    tw, tm, tmet = t
    tmet = {k: x for k, x in tmet.items() if not k.startswith("trmask/")}
    vw = None if vw is None else vw.batch["rollout_is_weights"]
    assert (vw is None) == (tw is None)
    if vw is not None:
        assert vw.dtype == tw.dtype, (vw.dtype, tw.dtype)
        assert torch.allclose(vw, tw, rtol=1e-5, atol=1e-6)
    assert vm.dtype == tm.dtype and torch.equal(vm, tm)
    assert set(vmet) == set(tmet), set(vmet) ^ set(tmet)
    for k in vmet:
        assert np.isclose(vmet[k], tmet[k], rtol=1e-3, atol=1e-5, equal_nan=True), (k, vmet[k], tmet[k])


def _status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


def memory(b, t, backend):
    """Peak resident memory of one trmask call on a B × T float32 batch above what was
    resident just before it: the peak is reset first (`/proc/self/clear_refs`, Linux), so
    temporaries freed while the inputs were built do not hide the call's own allocations."""
    import trmask

    old, roll, mask = batch(b, t)
    cfg = CONFIGS[0][1]
    small = batch(2, 8)
    trmask.compute_rollout_correction_and_rejection_mask(*small, **cfg, backend=backend)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status_kib("VmRSS") * 1024
    w, m, _ = trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, **cfg, backend=backend)
    peak = _status_kib("VmHWM") * 1024
    inputs = sum(x.numel() * x.element_size() for x in (old, roll, mask))
    outputs = sum(x.numel() * x.element_size() for x in (w, m))
    mib = 2**20
    print(f"{b} × {t} float32: inputs {inputs / mib:.0f} MiB, outputs {outputs / mib:.0f} MiB, "
          f"peak RSS rise during the call {(peak - before) / mib:.0f} MiB "
          f"(it can be below the outputs: malloc may place them in memory already resident)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memory", action="store_true", help="measure the peak memory of one 1024 × 4096 call instead")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in SHAPES))
    ap.add_argument("--diagnostics", action="store_true",
                    help="trmask also gets the batch's advantages and uid and returns its own "
                         "metrics (trmask_metrics=True); verl's plain call")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.memory:
        memory(1024, 4096, a.backend)
        return
    verl_fn, version = load_verl()
    import trmask

    print(f"verl {version} (PyPI, --no-deps), torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"trmask backend={a.backend!r}: {trmask.backend_name(a.backend)}; best / median of {a.repeat}, float32"
          + ("; trmask with advantages + uid + trmask_metrics=True" if a.diagnostics else ""))
    print()
    print("| batch | config | verl | trmask | speed-up (best) |")
    print("|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        b, t = (int(x) for x in shape.split("x"))
        old, roll, mask = batch(b, t)
        extra = diagnostics_inputs(b, t) if a.diagnostics else {}
        for label, cfg in CONFIGS:
            with torch.no_grad():
                ref = verl_fn(old, roll, mask, **cfg)
                got = trmask.compute_rollout_correction_and_rejection_mask(
                    old, roll, mask, **cfg, **extra, backend=a.backend)
                agree(ref, got)
                if a.diagnostics:
                    assert "trmask/adv_pos/k3_mean" in got[2] and "trmask/num_groups" in got[2]
                # alternate the two so that load from other processes hits both alike
                vt, tt = [], []
                for _ in range(a.repeat):
                    vt.append(timed(lambda: verl_fn(old, roll, mask, **cfg), 1)[0])
                    tt.append(timed(lambda: trmask.compute_rollout_correction_and_rejection_mask(
                        old, roll, mask, **cfg, **extra, backend=a.backend), 1)[0])
            vb, vmed = min(vt), float(np.median(vt))
            tb, tmed = min(tt), float(np.median(tt))
            print(f"| {b} × {t} | {label} | {vb * 1e3:.1f} / {vmed * 1e3:.1f} ms | "
                  f"{tb * 1e3:.2f} / {tmed * 1e3:.2f} ms | {vb / tb:.1f}× |", flush=True)


if __name__ == "__main__":
    main()
