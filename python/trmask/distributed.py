"""trmask over ``torch.distributed``: each data-parallel rank corrects its own shard of the
batch and gets the whole batch's metrics.

Every rank calls :func:`compute_rollout_correction_and_rejection_mask` with its shard (the
same arguments as :func:`trmask.compute_rollout_correction_and_rejection_mask`, same config on
every rank) plus the process group. The weights and mask are those of the shard's rows, equal
to the rows of a single-process call on the whole batch; the metrics are the whole batch's,
identical on every rank. One small all-gather (a few KiB of partial sums, not tokens) runs over
the group: sizes first, then uint8 tensors padded to the largest (CPU tensors for gloo, CUDA
tensors for NCCL). It is a collective: every rank of the group must call it, in the same order
relative to the group's other collectives; a shard may be empty.

torch is imported on the first call, not by ``import trmask``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["compute_rollout_correction_and_rejection_mask", "torch_all_gather"]


def torch_all_gather(group: Any = None) -> Tuple[int, int, Callable[[bytes], List[bytes]]]:
    """``(rank, world_size, all_gather)`` for ``group`` (``None``: the default group), where
    ``all_gather(bytes) -> list[bytes]`` returns every rank's buffer in rank order."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "trmask.distributed: torch.distributed is not initialized "
            "(call torch.distributed.init_process_group first)"
        )
    rank = dist.get_rank(group)
    size = dist.get_world_size(group)
    if rank < 0:
        raise ValueError("invalid input `group`: this process is not a member of it")
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend:
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")

    def all_gather(local: bytes) -> List[bytes]:
        n = torch.tensor([len(local)], dtype=torch.int64, device=device)
        sizes = [torch.zeros_like(n) for _ in range(size)]
        dist.all_gather(sizes, n, group=group)
        lens = [int(s.item()) for s in sizes]
        width = max(lens)
        buf = torch.zeros(width, dtype=torch.uint8, device=device)
        if local:
            buf[: len(local)] = torch.frombuffer(bytearray(local), dtype=torch.uint8).to(device)
        bufs = [torch.empty_like(buf) for _ in range(size)]
        dist.all_gather(bufs, buf, group=group)
        return [b[:k].cpu().numpy().tobytes() for b, k in zip(bufs, lens)]

    return rank, size, all_gather


def compute_rollout_correction_and_rejection_mask(
    *args: Any, group: Any = None, **kwargs: Any
) -> Tuple[Any, Any, Dict[str, float]]:
    """:func:`trmask.compute_rollout_correction_and_rejection_mask` on this rank's shard of a
    data-parallel batch, over the ``torch.distributed`` process group ``group`` (``None``: the
    default group). Returns ``(weights, mask, metrics)`` (or the 4-tuple with
    ``return_details=True``) for the shard's rows, with the whole batch's metrics.

    Batch-wide quantities are exact across ranks: ``rollout_is_batch_normalize`` divides by the
    whole batch's mean weight, and GRPO groups (``uid``) are whole-batch groups. A one-rank group
    is the plain single-process call. Raises what the single-process call raises, and
    ``RuntimeError`` when torch.distributed is not initialized."""
    import trmask

    rank, size, all_gather = torch_all_gather(group)
    return trmask.compute_rollout_correction_and_rejection_mask(
        *args, _exchange=(rank, size, all_gather), **kwargs
    )
