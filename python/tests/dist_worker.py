"""One rank of test_distributed.py: `python dist_worker.py RANK WORLD INIT_FILE DIR`. Reads
DIR/in-RANK.npz (its shard), calls trmask.distributed over a gloo group, writes DIR/out-RANK.npz
(weights, mask) and DIR/metrics-RANK.json."""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import trmask.distributed

rank, world, init_file, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
try:
    shard = dict(np.load(os.path.join(d, f"in-{rank}.npz")))
    kw = json.loads(open(os.path.join(d, "kwargs.json")).read())
    # torch tensors on even ranks, NumPy on odd ones: the caller's kind comes back
    conv = torch.from_numpy if rank % 2 == 0 else (lambda a: a)
    if os.environ.get("TRMASK_TEST_MONITOR"):
        # trmask.Monitor over the group: each rank its own log_dir, only rank 0 writes
        kw.pop("trmask_metrics")
        mon = trmask.Monitor(os.path.join(d, f"mon-{rank}"), report_every=0, **kw)
        w, m, metrics = mon.step(
            7, conv(shard["old"]), conv(shard["roll"]), conv(shard["mask"]), advantages=conv(shard["adv"]), uid=conv(shard["uid"])
        )
        mon.close()
    else:
        w, m, metrics = trmask.distributed.compute_rollout_correction_and_rejection_mask(
            conv(shard["old"]),
            conv(shard["roll"]),
            conv(shard["mask"]),
            advantages=conv(shard["adv"]),
            uid=conv(shard["uid"]),
            **kw,
        )
    if rank % 2 == 0:
        assert isinstance(m, torch.Tensor), type(m)
        w, m = w.numpy(), m.numpy()
    np.savez(os.path.join(d, f"out-{rank}.npz"), weights=w, mask=m)
    with open(os.path.join(d, f"metrics-{rank}.json"), "w") as f:
        json.dump(metrics, f)
finally:
    dist.destroy_process_group()
