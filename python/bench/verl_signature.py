"""The verl-signature call on a B × T batch vs the same computation written in PyTorch (CPU)
the way verl writes it (verl 1dda039b, trainer/ppo/rollout_corr_helper.py: token-level TIS at
2.0, `seq_mean_k3` rejection at 0.01, the IS / RS / off-policy metrics), same process, same
inputs. Prints a Markdown table row per path (best of --repeat runs).

    python python/bench/verl_signature.py --batch 4096 --seq 4096
"""

import argparse
import time

import numpy as np
import torch

import trmask

SAFETY_BOUND = 20.0


def masked_mean(x, mask, axis=None):
    return (x * mask).sum(axis) / (mask.sum(axis) + 1e-8)


def verl_torch(old, roll, mask, thr_is=2.0, thr_rs=0.01):
    """verl's token TIS + seq_mean_k3 RS and their metrics, in verl's torch idiom."""
    metrics = {}
    log_ratio = old - roll
    # rejection: per-sequence mean k3
    lr = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    k3 = torch.exp(lr) - 1 - lr
    seq_k3 = masked_mean(k3, mask, axis=-1)
    keep = (seq_k3 <= thr_rs).float()
    rs_mask = keep.unsqueeze(-1).expand_as(mask)
    modified = mask * rs_mask
    metrics["rollout_corr/rollout_rs_seq_mean_k3_mean"] = masked_mean(seq_k3, torch.ones_like(seq_k3)).item()
    metrics["rollout_corr/rollout_rs_seq_mean_k3_max"] = seq_k3.max().item()
    metrics["rollout_corr/rollout_rs_masked_fraction"] = masked_mean(1 - rs_mask, mask).item()
    metrics["rollout_corr/rollout_rs_seq_masked_fraction"] = (1 - keep).mean().item()
    # token-level truncated IS
    w = torch.exp(lr)
    w = torch.clamp(w, max=thr_is) * modified
    w = w.detach()
    metrics["rollout_corr/rollout_is_mean"] = masked_mean(w, modified).item()
    metrics["rollout_corr/rollout_is_max"] = torch.where(modified.bool(), w, -torch.inf).max().item()
    metrics["rollout_corr/rollout_is_min"] = torch.where(modified.bool(), w, torch.inf).min().item()
    mean = masked_mean(w, modified)
    metrics["rollout_corr/rollout_is_std"] = torch.sqrt(torch.clamp(masked_mean(w * w, modified) - mean * mean, min=0)).item()
    wn = w / (mean + 1e-8)
    metrics["rollout_corr/rollout_is_eff_sample_size"] = (1.0 / masked_mean(wn * wn, modified)).item()
    metrics["rollout_corr/rollout_is_ratio_fraction_high"] = masked_mean((torch.exp(lr) > thr_is).float(), mask).item()
    # off-policy diagnostics
    metrics["rollout_corr/kl"] = masked_mean(-log_ratio, mask).item()
    metrics["rollout_corr/k3_kl"] = masked_mean(k3, mask).item()
    metrics["rollout_corr/log_ppl_diff"] = masked_mean(log_ratio, mask).item()
    seq_lr = (log_ratio * mask).sum(-1)
    metrics["rollout_corr/chi2_seq"] = (torch.exp(torch.clamp(2 * seq_lr, -SAFETY_BOUND, SAFETY_BOUND)).mean() - 1).item()
    return w, modified, metrics


def best(f, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times), float(np.median(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--backends", default="cpu")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(a.batch, a.seq, generator=g) * 3
    roll = old + 0.02 * torch.randn(a.batch, a.seq, generator=g)
    lengths = torch.randint(1, a.seq + 1, (a.batch,), generator=g)
    mask = (torch.arange(a.seq)[None, :] < lengths[:, None]).float()
    cfg = dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01)
    n = a.batch * a.seq
    print(f"| path | {a.batch} × {a.seq} float32 ({n / 1e6:.1f} M tokens): best / median of {a.repeat} | tokens / s |")
    print("|---|---|---|")
    rows = []
    with torch.no_grad():
        t, m = best(lambda: verl_torch(old, roll, mask), a.repeat)
        rows.append((f"PyTorch {torch.__version__} CPU, verl's idiom ({torch.get_num_threads()} threads)", t, m))
        for b in a.backends.split(","):
            name = trmask.backend_name(b)
            trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, **cfg, backend=b)  # warm-up
            t, m = best(lambda: trmask.compute_rollout_correction_and_rejection_mask(old, roll, mask, **cfg, backend=b), a.repeat)
            rows.append((f"trmask `backend=\"{b}\"` ({name})", t, m))
    for label, t, m in rows:
        print(f"| {label} | {t * 1e3:.0f} ms / {m * 1e3:.0f} ms | {n / t / 1e6:.0f} M |")


if __name__ == "__main__":
    main()
