"""`trmask analyze` of one GRPO step, whole process, against verl's
`compute_rollout_correction_and_rejection_mask` on the same batch in the same run.

Writes a 1024 × 4096 float32 step (response_mask with variable lengths, old_log_prob,
rollout_log_prob a small mismatch away, advantages broadcast per response, uid in groups of 8)
as safetensors, then alternates, --repeat times each:

  (a) `/usr/bin/time -v trmask analyze STEP --preset decoupled_k3_rs_token_tis --backend cpu
      --metrics m.json` (wall clock and peak RSS of the whole process);
  (b) verl's function with the same preset (token TIS 2.0 + `seq_mean_k3` 0.01) on the same
      batch as CPU torch tensors (loaded by verl_real.load_verl, bare call, one thread count).

Each round runs trmask (and --base, another binary, when given) then verl; wall clock and CPU
time (user + system) of each, peak RSS of trmask's process.

    RAYON_NUM_THREADS=2 python python/bench/analyze_cost.py --threads 2 --repeat 7 [--base OLD] [--config 2]
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import types

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
try:
    import trmask  # noqa: F401  (verl_real's helpers import it; this script runs the CLI only)
except ImportError:
    sys.modules["trmask"] = types.ModuleType("trmask")
from verl_real import CONFIGS, load_verl  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def step(b, t, seed=0):
    """A realistic step: most tokens confident, a log-prob mismatch of a few 1e-2 varying by
    response (a few rejected at `seq_mean_k3` 0.01) with a heavy tail on a few tokens,
    responses of varied length, GRPO groups of 8."""
    g = torch.Generator().manual_seed(seed)
    old = torch.rand(b, t, generator=g).clamp_min(1e-12).log() * 0.5  # -Exp(2): mostly near 0
    # per response a mismatch scale around 0.03 (k3 ~ 5e-4), a few well past it
    scale = 0.03 * torch.exp(0.7 * torch.randn(b, 1, generator=g))
    noise = scale * torch.randn(b, t, generator=g)
    tail = torch.rand(b, t, generator=g) < 0.005
    noise = torch.where(tail, 0.5 * torch.randn(b, t, generator=g), noise)
    roll = -(old + noise).abs()
    lengths = torch.randint(16, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    adv = torch.randn(b, 1, generator=g).expand(b, t).contiguous() * mask
    uid = torch.arange(b, dtype=torch.int64) // 8
    return dict(old_log_prob=old.float(), rollout_log_prob=roll.float(),
                response_mask=mask, advantages=adv.float(), uid=uid)


def write(tensors, path):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def timed_analyze(exe, path, metrics, how):
    cmd = ["/usr/bin/time", "-v", str(exe), "analyze", str(path), *how, "--backend", "cpu",
           "--metrics", str(metrics)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", r.stderr).group(1)
    secs = sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall.split(":"))))
    rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    cpu = sum(float(re.search(rf"{k} time \(seconds\): (\S+)", r.stderr).group(1)) for k in ("User", "System"))
    return secs, rss_kib * 1024, cpu, r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trmask", default=str(ROOT / "target" / "release" / "trmask"))
    ap.add_argument("--base", help="another trmask binary timed in the same rounds (a baseline)")
    ap.add_argument("--keep", help="also write the step to this path")
    ap.add_argument("--config", type=int, default=0,
                    help="which of verl_real's configs (0: token TIS 2.0 + seq_mean_k3 0.01, as "
                         "--preset decoupled_k3_rs_token_tis; 1: TRM-max; 2: token_k1), given "
                         "to trmask as --config JSON of verl's arguments")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    verl_fn, version = load_verl()
    label, cfg = CONFIGS[a.config]
    print(f"config: {label}")
    tensors = step(a.batch, a.seq)
    with tempfile.TemporaryDirectory() as d:
        how = ["--preset", "decoupled_k3_rs_token_tis"]
        if a.config != 0:
            cfg_path = pathlib.Path(d) / "config.json"
            cfg_path.write_text(json.dumps(cfg))
            how = ["--config", str(cfg_path)]
        path = pathlib.Path(d) / "step.safetensors"
        write(tensors, path)
        if a.keep:
            write(tensors, a.keep)
        size = path.stat().st_size
        old, roll, mask = tensors["old_log_prob"], tensors["rollout_log_prob"], tensors["response_mask"]
        runs = {b: ([], [], []) for b in [a.trmask] + ([a.base] if a.base else [])}
        vt, vc = [], []
        out = ""
        for _ in range(a.repeat):
            for exe, (tt, rss, cpu) in runs.items():
                s, r, c, o = timed_analyze(exe, path, pathlib.Path(d) / "m.json", how)
                out = out or o
                tt.append(s)
                rss.append(r)
                cpu.append(c)
            with torch.no_grad():
                c0, t0 = os.times(), time.perf_counter()
                verl_fn(old, roll, mask, **cfg)
                vt.append(time.perf_counter() - t0)
                c1 = os.times()
                vc.append(c1.user + c1.system - c0.user - c0.system)
    mib = 2 ** 20
    print(out)
    print(f"verl {version}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS', '-')}; "
          f"{a.batch} × {a.seq} float32 step, {size / mib:.1f} MiB; best / median of {a.repeat}, "
          f"wall and CPU (user + system) time; load average {os.getloadavg()[0]:.1f}")
    ms = lambda v: f"{min(v) * 1e3:.0f} / {np.median(v) * 1e3:.0f} ms"
    for exe, (tt, rss, cpu) in runs.items():
        print(f"trmask analyze ({exe}), whole process: wall {ms(tt)}, CPU {ms(cpu)}, "
              f"peak RSS {min(rss) / mib:.0f} / {np.median(rss) / mib:.0f} MiB "
              f"(input + {(max(rss) - size) / mib:.0f} MiB at most)")
    print(f"verl compute_rollout_correction_and_rejection_mask: wall {ms(vt)}, CPU {ms(vc)}")


if __name__ == "__main__":
    main()
