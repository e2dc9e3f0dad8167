"""``trmask.Monitor``: the drop-in inside a training loop, logging every step.

Each :meth:`Monitor.step` returns the drop-in's ``(weights, mask, metrics)`` and logs the step:
the ``trmask analyze --metrics-jsonl`` line to ``metrics.jsonl``, TensorBoard scalars (one per
metric) and histograms (log ρ over valid tokens, each criterion's per-sequence statistic)
under ``tensorboard/``, and ``wandb.log(..., step=step)`` when a wandb run is active. Every
``report_every`` steps and at :meth:`Monitor.close`, ``trend.html`` (the run's trend page,
``trmask report --jsonl``) and ``report.html`` (the current step, ``trmask report``) are
replaced atomically. The histograms come from the correction's own pass (fixed bins, merged
across ranks). Under ``torch.distributed`` every rank calls ``step`` with its shard, the
metrics and histograms are the whole batch's, and only rank 0 writes.
"""

from __future__ import annotations

import inspect
import os
import sys
import tempfile
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from . import _native
from ._tensorboard import EventWriter, histogram_value, scalar_value

__all__ = ["Monitor"]


def _write_atomic(path: str, text: str) -> None:
    d = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _dist(group: Any) -> Optional[Tuple[int, int, Any]]:
    """(rank, size, all_gather) under an initialised torch.distributed, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    from .distributed import torch_all_gather

    return torch_all_gather(group)


class Monitor:
    """Corrects and logs one training step per :meth:`step`.

    ``log_dir`` receives ``metrics.jsonl``, ``tensorboard/``, ``trend.html`` and
    ``report.html``. ``config`` (any mapping: a dict, verl's ``RolloutCorrectionConfig``, an
    OmegaConf ``DictConfig``) or ``preset`` chooses the correction, ``options`` are trmask's
    config keys as for the drop-in; ``report_every`` is the page period in steps (0: only at
    :meth:`close`); ``backend`` as for the drop-in; ``name`` is the JSONL's ``input`` field;
    ``group`` the torch.distributed process group (``None``: the default one, when
    initialised)."""

    def __init__(
        self,
        log_dir: "str | os.PathLike[str]",
        config: Optional[Mapping[str, Any]] = None,
        *,
        preset: Optional[str] = None,
        report_every: int = 50,
        backend: str = "auto",
        name: str = "train",
        group: Any = None,
        tensorboard: bool = True,
        **options: Any,
    ) -> None:
        import trmask

        if not isinstance(report_every, int) or report_every < 0:
            raise ValueError(f"invalid config `report_every`: must be an integer >= 0, got {report_every!r}")
        self._trmask = trmask
        # the names of the drop-in's positional tensors (verl's signature)
        params = inspect.signature(trmask.compute_rollout_correction_and_rejection_mask).parameters
        self._positional = tuple(params)[:3]
        cfg = trmask._config(config, preset, {}, {})
        cfg_opts = {k: v for k, v in options.items() if k not in trmask._ROLES}
        trmask._split_options(dict(cfg_opts), "Monitor")  # an unknown keyword: TypeError
        cfg.update({k: v for k, v in cfg_opts.items() if v is not None})
        self._fixed = {k: v for k, v in options.items() if k in trmask._ROLES}
        self.config: Dict[str, Any] = cfg
        self._config_json = trmask._json(cfg)
        self.backend = backend
        self.report_every = report_every
        self.name = name
        self.log_dir = os.fspath(log_dir)
        self._group = group
        dist = _dist(group)
        self.rank = 0 if dist is None else dist[0]
        self.writes = self.rank == 0
        self.steps = 0
        self._last: Optional[Tuple[int, Dict[str, Any]]] = None
        self._edges = np.asarray(_native.hist_edges())
        self._tb: Optional[EventWriter] = None
        self.jsonl = os.path.join(self.log_dir, "metrics.jsonl")
        self.trend_html = os.path.join(self.log_dir, "trend.html")
        self.report_html = os.path.join(self.log_dir, "report.html")
        if self.writes:
            os.makedirs(self.log_dir, exist_ok=True)
            if tensorboard:
                self._tb = EventWriter(os.path.join(self.log_dir, "tensorboard"))

    def step(self, step: int, *args: Any, **tensors: Any) -> Tuple[Any, Any, Dict[str, float]]:
        """The drop-in on this step's tensors (verl's positional arguments and keywords:
        ``old_log_prob``, ``rollout_log_prob``, ``response_mask``, top-K, logits, advantages,
        ``uid`` …); returns ``(weights, mask, metrics)`` with trmask's metrics, and logs them.
        A collective under torch.distributed."""
        trmask = self._trmask
        kw = dict(self._fixed)
        kw.update(tensors)
        dist = _dist(self._group)
        w, m, metrics, details = trmask.compute_rollout_correction_and_rejection_mask(
            *args,
            config=self.config,
            backend=self.backend,
            trmask_metrics=True,
            return_details=True,
            _exchange=dist,
            **kw,
        )
        self.steps += 1
        if self.writes:
            self._log(int(step), metrics, details.get("histograms", {}))
            given = dict(zip(self._positional, args))
            given.update(kw)
            self._last = (int(step), given)
            if self.report_every and self.steps % self.report_every == 0:
                self._pages()
        return w, m, metrics

    def _log(self, step: int, metrics: Dict[str, float], hists: Mapping[str, Any]) -> None:
        line = _native.metrics_line(self.name, float(step), metrics)
        with open(self.jsonl, "a", encoding="utf-8") as f:
            f.write(line)
        if self._tb is not None:
            values = [scalar_value(k, v) for k, v in metrics.items()]
            for k, counts in hists.items():
                values.append(histogram_value(f"trmask/hist/{k}", counts, self._tb_limits(), self._stats(counts)))
            self._tb.add(step, values)
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            logged: Dict[str, Any] = dict(metrics)
            for k, counts in hists.items():
                logged[f"trmask/hist/{k}"] = wandb.Histogram(np_histogram=(np.asarray(counts), self._edges))
            wandb.log(logged, step=step)

    def _tb_limits(self) -> np.ndarray:
        e = self._edges.copy()
        e[-1] = sys.float_info.max  # the last bin holds what lies beyond
        return e

    def _stats(self, counts: Any) -> Tuple[float, float, float, float, float]:
        c = np.asarray(counts, dtype=np.float64)
        n = float(c.sum())
        nz = np.nonzero(c)[0]
        if n == 0:
            return (0.0, 0.0, 0.0, 0.0, 0.0)
        mid = (self._edges[:-1] + self._edges[1:]) / 2  # bin midpoints: approximate sums
        return (
            float(self._edges[nz[0]]),
            float(self._edges[nz[-1] + 1]),
            n,
            float((c * mid).sum()),
            float((c * mid * mid).sum()),
        )

    def _pages(self) -> None:
        if os.path.exists(self.jsonl):
            with open(self.jsonl, encoding="utf-8") as f:
                text = f.read()
            if text.strip():
                _write_atomic(self.trend_html, _native.trend_html(text, self.jsonl))
        if self._last is not None:
            step, given = self._last
            from ._convert import borrow

            tensors = {}
            for k, x in given.items():
                role = self._trmask._ROLES.get(k)
                if x is not None and role not in (None, "skip"):
                    tensors[k], _ = borrow(x, k, role)
            html, _ = _native.report_html(tensors, self._config_json, self.backend, f"{self.name} step {step}")
            _write_atomic(self.report_html, html)

    def close(self) -> None:
        """Writes the pages for the last step and closes the TensorBoard file."""
        if self.writes:
            self._pages()
            self._last = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
