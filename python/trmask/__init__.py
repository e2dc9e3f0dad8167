"""trmask: rollout/trainer mismatch correction for LLM reinforcement learning.

The Python face of the trmask Rust library (the same code the ``trmask`` command line runs,
conformance-tested against verl's own outputs):

* :func:`compute_rollout_correction_and_rejection_mask` — verl's function, same signature,
  same metric names, as a drop-in; plus trmask's criteria (exact ``seq_max_kl`` from logits,
  LN-TRM, token veto, DPPO / PDM masks) as keyword arguments and presets by name.
* :func:`vocab_divergence` and :func:`topk_divergence` — exact per-token divergences from full
  logits, or from the rollout's top-K.
* :func:`analyze` — every output ``trmask analyze`` writes, for a dict of arrays or a file.
* :func:`bounds` — the TRM paper's surrogate-error bounds; :func:`preset` — verl's presets.
* :class:`Monitor` — the drop-in inside a training loop, logging each step (JSONL,
  TensorBoard, wandb, the trend and report pages).
* :class:`DataWarning` — the command line's ``warning:`` lines about the data, as warnings.

Inputs are NumPy arrays or CPU ``torch.Tensor``s (float64/float32/float16/bfloat16 values,
bool or 0/1 masks, integer ids). They are read in place when C-contiguous and of a dtype the
library reads (see docs/PYTHON.md); outputs come back as the caller's kind: torch in, torch
out. The GIL is released while computing. Bad input raises ``ValueError`` with the command
line's one-line message; torch is never imported unless a tensor is passed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._convert import Kind, borrow, float_out_dtype, is_torch, shape_of

__all__ = [
    "compute_rollout_correction_and_rejection_mask",
    "vocab_divergence",
    "topk_divergence",
    "analyze",
    "bounds",
    "preset",
    "preset_names",
    "backend_name",
    "VerlZeroDivisionError",
    "VerlTypeError",
    "DataWarning",
    "Monitor",
    "__version__",
]

__version__: str = _native.__version__

_log = logging.getLogger("trmask")


class DataWarning(UserWarning):
    """Something about the data makes the numbers mean less than they seem: the command
    line's ``warning:`` lines about the data (a constant log-ratio offset from top-p
    renormalisation, positive log-probs, bf16 rounding under k3, a threshold below that noise
    floor, …), with the same text. ``kind`` is the short name also used in the metric
    ``trmask/warn/<kind>``. Raised once per kind per corrector (config and backend)."""

    def __init__(self, message: str, kind: str = "other"):
        super().__init__(message)
        self.kind = kind

# backends opened so far (a GPU-capable one is opened by `_open` first)
_OPENED: set = set()


def _open(backend: str) -> None:
    """Opens `backend`'s engine the first time, quietly and in place.

    Quietly: without ``XDG_RUNTIME_DIR`` (headless containers) the Vulkan loader prints
    ``error: XDG_RUNTIME_DIR is invalid or not set`` on stderr; the probe runs with a private
    runtime directory (mode 0700, removed at exit) and the variable is unset again afterwards.
    In place: under torch with CUDA, ``TRMASK_PCI_BUS_ID`` is set to the current CUDA device's
    PCI address, so the engine opens that GPU (else the ``LOCAL_RANK``-th discrete adapter).
    What ``auto`` chose goes to the ``trmask`` logger (INFO), never to stderr."""
    if backend in _OPENED:
        return
    if backend != "cpu" and backend != "cpu-fast":
        _pci_hint()
    private = None
    if backend != "cpu" and backend != "cpu-fast" and not os.environ.get("XDG_RUNTIME_DIR"):
        import atexit
        import shutil
        import tempfile

        private = tempfile.mkdtemp(prefix="trmask-xdg-")
        atexit.register(shutil.rmtree, private, True)
        os.environ["XDG_RUNTIME_DIR"] = private
    try:
        notes = _native.engine_name(backend)[1]
    finally:
        if private is not None and os.environ.get("XDG_RUNTIME_DIR") == private:
            del os.environ["XDG_RUNTIME_DIR"]
    _OPENED.add(backend)
    for n in notes:
        _log.info("%s", n)


def _pci_hint() -> None:
    torch = sys.modules.get("torch")
    if torch is None or os.environ.get("TRMASK_PCI_BUS_ID"):
        return
    try:
        if not torch.cuda.is_available():
            return
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        os.environ["TRMASK_PCI_BUS_ID"] = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except Exception:  # no CUDA runtime: no hint
        return


# verl's defaults for the signature's configuration arguments.
_VERL_DEFAULTS = {
    "rollout_is": None,
    "rollout_is_threshold": 2.0,
    "rollout_is_batch_normalize": False,
    "rollout_rs": None,
    "rollout_rs_threshold": None,
}


def _plain(v: Any) -> Any:
    """A config value as JSON-able Python: nested mappings (OmegaConf's DictConfig, verl's
    BaseConfig) as dicts, sequences (ListConfig) as lists."""
    if isinstance(v, Mapping):
        return _plain_config(v)
    if isinstance(v, (list, tuple)) or type(v).__name__ == "ListConfig":
        return [_plain(x) for x in v]
    return v


def _plain_config(config: Any) -> Dict[str, Any]:
    """Any Mapping of config keys (a dict, verl's ``RolloutCorrectionConfig`` / ``BaseConfig``,
    an OmegaConf ``DictConfig``) as a dict, without the config machinery's keys (``_target_``,
    ``extra``, names starting with ``_``)."""
    if not isinstance(config, Mapping):
        raise ValueError(
            f"invalid config `config`: must be a mapping of config keys (a dict, verl's "
            f"RolloutCorrectionConfig, an OmegaConf DictConfig), got {type(config).__name__}"
        )
    out: Dict[str, Any] = {}
    for k in config:
        if not isinstance(k, str) or k.startswith("_") or k == "extra":
            continue
        out[k] = _plain(config[k])
    return out


def _json(config: Mapping[str, Any]) -> str:
    def default(o: Any) -> Any:
        if isinstance(o, np.generic):
            return o.item()
        raise ValueError(f"invalid config: {o!r} is not a number, string, bool or None")

    clean = {k: v for k, v in config.items()}
    for k, v in clean.items():
        # the temperature has the library's own rule (the CLI's message for NaN and inf too)
        if isinstance(v, float) and not math.isfinite(v) and k != "temperature":
            raise ValueError(f"invalid config `{k}`: must be finite, got {v}")
        try:
            json.dumps(v, default=default)
        except (ValueError, TypeError):
            raise ValueError(
                f"invalid config `{k}`: a {type(v).__name__} is not a number, string, bool, "
                f"list or dict"
            ) from None
    return json.dumps(clean, default=default)


# config key -> whether the library knows it (asked once per name)
_KEYS: Dict[str, bool] = {}


def _is_config_key(key: str) -> bool:
    known = _KEYS.get(key)
    if known is None:
        try:
            _native.config_warnings(json.dumps({key: None}))
            known = True
        except ValueError as e:
            known = "unknown config key" not in str(e)
        _KEYS[key] = known
    return known


def _split_options(options: Dict[str, Any], fn: str) -> Dict[str, Any]:
    """Takes the tensors (any name of the tensor table or a framework alias) out of `options`
    and returns them; a keyword that is neither a tensor nor a config key is a TypeError
    naming it."""
    tensors = {}
    for k in list(options):
        role = _ROLES.get(k)
        if role is not None:
            v = options.pop(k)
            if role != "skip":
                tensors[k] = v
        elif not _is_config_key(k):
            raise TypeError(
                f"{fn}() got an unexpected keyword argument '{k}' (neither a tensor of "
                f"docs/FORMAT.md nor a config key)"
            )
    return tensors


class VerlZeroDivisionError(ValueError, ZeroDivisionError):
    """Where verl raises ``ZeroDivisionError`` (sequence IS whose every weight is zero, so the
    effective sample size is 1/0); also a ``ValueError``, like every trmask input error."""


class VerlTypeError(ValueError, TypeError):
    """Where verl raises ``TypeError`` (a boolean threshold); also a ``ValueError``."""


def _verl_exception(e: ValueError) -> ValueError:
    # the native message names the exception verl raises for the same input
    text = str(e)
    if "verl raises ZeroDivisionError" in text:
        return VerlZeroDivisionError(text)
    if "threshold specification, not a boolean" in text:
        return VerlTypeError(text)
    return e


def _warn_config(config_json: str) -> None:
    # what the CLI prints as `warning:` lines (e.g. rollout_is with a null threshold)
    for w in _native.config_warnings(config_json):
        text = w[len("warning: ") :] if w.startswith("warning: ") else w
        warnings.warn(text, UserWarning, stacklevel=3)


def preset(name: str) -> Dict[str, Any]:
    """The configuration of a verl preset (``"decoupled_k3_rs"``, ``"bypass_pg_geo_rs"``, …,
    19 of them) or a TRM paper alias (``"trm_max"``, ``"trm_avg"``, ``"geo_mask"``,
    ``"seq_mis"``), as a dict of config keys. Pass it as ``config=`` (or ``preset=name``) to
    :func:`compute_rollout_correction_and_rejection_mask` or :func:`analyze`.

    Raises ``ValueError`` naming the known presets for an unknown name."""
    return json.loads(_native.preset(name))


def preset_names() -> List[str]:
    """Every preset name and alias :func:`preset` accepts."""
    return list(_native.preset_names())


def backend_name(backend: str = "auto") -> str:
    """The engine ``backend`` (``"auto"``, ``"gpu"``, ``"cpu"``, ``"cpu-fast"``) runs on, e.g.
    ``"cpu (2 threads, f64)"``; opening a GPU the first time takes a moment. Raises
    ``RuntimeError`` for ``"gpu"`` without an adapter, ``ValueError`` for an unknown name."""
    _open(backend)
    return _native.engine_name(backend)[0]


# (verl arguments, backend, verl metrics only) -> (config JSON, has weights, warnings), for
# calls that pass no config=, preset= or trmask option: no JSON per call
_CONFIGS: Dict[Any, Tuple[str, bool, List[str]]] = {}
# (config JSON, backend, verl metrics only) -> the data warnings' kinds raised so far; a
# corrector's first step is checked (the CLI's checks, on the step analysed as the CLI does)
_WARNED: Dict[Any, set] = {}


def _data_warnings(tensors: Mapping[str, Any], config_json: str, backend: str, key: Any, metrics: Optional[Dict[str, float]]) -> None:
    seen = _WARNED.get(key)
    if seen is not None:
        return
    if len(_WARNED) >= 64:
        _WARNED.clear()
    seen = _WARNED[key] = set()
    try:
        found = _native.data_warnings(dict(tensors), config_json, backend)
    except ValueError:
        # the step was corrected, so its input is valid; what analyze refuses is a rank's
        # shard without a valid token, which has nothing to warn about
        return
    for kind, line in found:
        if metrics is not None:
            metrics[f"trmask/warn/{kind}"] = 1.0
        if kind in seen:
            continue
        seen.add(kind)
        text = line[len("warning: ") :] if line.startswith("warning: ") else line
        warnings.warn(DataWarning(text, kind), stacklevel=4)


def _resolved_config(
    config: Optional[Mapping[str, Any]],
    preset_name: Optional[str],
    verl: Tuple[Any, ...],
    options: Mapping[str, Any],
    backend: str,
    verl_only: bool,
) -> Tuple[str, bool]:
    key = None
    if config is None and preset_name is None and not options:
        key = (verl, backend, verl_only)
        try:
            hit = _CONFIGS.get(key)
        except TypeError:  # an unhashable threshold: the native side names the problem
            key, hit = None, None
        if hit is not None:
            for w in hit[2]:
                warnings.warn(w, UserWarning, stacklevel=3)
            return hit[0], hit[1]
    names = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs", "rollout_rs_threshold")
    cfg = _config(config, preset_name, dict(zip(names, verl)), options)
    config_json = _json(cfg)
    _open(backend)
    try:
        has_weights, notes = _native.config_info(config_json, backend, verl_only)
    except ValueError as e:
        verl_e = _verl_exception(e)
        if verl_e is e:
            raise
        raise verl_e from None
    texts = [w[len("warning: ") :] if w.startswith("warning: ") else w for w in notes]
    for w in texts:
        warnings.warn(w, UserWarning, stacklevel=3)
    if key is not None:
        if len(_CONFIGS) >= 64:
            _CONFIGS.clear()
        _CONFIGS[key] = (config_json, has_weights, texts)
    return config_json, has_weights


class _OutPool:
    """Output buffers reused across calls once the caller has let go of them.

    A fresh ``np.empty`` of more than a few hundred KiB is a new memory mapping, so the first
    write to each of its pages faults (about 75 µs for the two 256 KiB outputs of a 64 × 1024
    step here, a quarter of the call). The pool keeps a reference to the last few buffers it
    handed out and gives one back only when nothing else refers to it any more: no array,
    view or torch tensor of it survives (torch.from_numpy keeps the array alive), so a buffer
    still in use is never written. A buffer serves any request of the same dtype between half
    its size and its size (a view of its first elements); at most ``max_items`` buffers and
    ``max_bytes`` are kept.
    """

    def __init__(self, max_items: int = 6, max_bytes: int = 256 << 20) -> None:
        self.items: List[np.ndarray] = []
        self.max_items = max_items
        self.max_bytes = max_bytes

    def take(self, n: int, dtype: Any) -> np.ndarray:
        dt = np.dtype(dtype)
        items = self.items
        for i in range(len(items)):
            a = items[i]
            # references: the list's, `a`'s and getrefcount's argument: nobody else holds it
            if a.dtype == dt and n <= a.size <= 2 * n + 1024 and sys.getrefcount(a) == 3:
                items.append(items.pop(i))  # most recently used last
                return a[:n]
            del a
        a = np.empty(max(n, 1), dt)
        items.append(a)
        while len(items) > self.max_items or (
            len(items) > 1 and sum(x.nbytes for x in items) > self.max_bytes
        ):
            items.pop(0)  # forgotten, not freed: a buffer in use stays its user's
        return a[:n]


_OUT = _OutPool()


# the mask dtypes the library writes (others are written as float64 and converted)
_MASK_OUT = {np.dtype(t) for t in (np.bool_, np.uint8, np.int64, np.float32, np.float64)}


def _np_dtype(dtype: Any) -> Any:
    """The NumPy dtype of an output of `dtype` (a torch dtype without a NumPy twin, bfloat16,
    is written as float32 and converted once)."""
    if isinstance(dtype, np.dtype) or isinstance(dtype, type):
        return np.dtype(dtype)
    name = str(dtype).replace("torch.", "")
    return np.dtype({"bool": np.bool_, "uint8": np.uint8, "int64": np.int64, "float64": np.float64}.get(name, np.float32))


def _slots(tensors: Mapping[str, Any]) -> int:
    """Token slots of the step: the mask's size, or the packed layout's last offset."""
    m = tensors.get("response_mask")
    if m is not None:
        return int(m.size)
    cu = tensors.get("cu_seqlens")
    if cu is not None and cu.size > 0:
        return max(int(cu.ravel()[-1]), 0)
    lp = tensors.get("old_log_prob", tensors.get("rollout_log_prob"))
    if isinstance(lp, tuple):
        return int(lp[1].size)
    return 0 if lp is None else int(lp.size)


def _config(
    config: Optional[Mapping[str, Any]],
    preset_name: Optional[str],
    verl_args: Mapping[str, Any],
    options: Mapping[str, Any],
) -> Dict[str, Any]:
    if config is not None and preset_name is not None:
        raise ValueError("invalid config `preset`: give either config= or preset=, not both")
    cfg: Dict[str, Any] = {}
    if preset_name is not None:
        cfg.update(preset(preset_name))
    if config is not None:
        cfg.update(_plain_config(config))
    for k, v in verl_args.items():
        if k not in cfg or v != _VERL_DEFAULTS[k]:
            cfg[k] = v
    cfg.update({k: v for k, v in options.items() if v is not None})
    return cfg


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: Any,
    rollout_log_prob: Any,
    response_mask: Any,
    rollout_is: Optional[str] = None,
    rollout_is_threshold: Union[float, str, None] = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: Optional[str] = None,
    rollout_rs_threshold: Union[float, str, None] = None,
    *,
    backend: str = "auto",
    preset: Optional[str] = None,
    config: Optional[Mapping[str, Any]] = None,
    log_prob: Any = None,
    advantages: Any = None,
    responses: Any = None,
    rollout_logits: Any = None,
    old_logits: Any = None,
    uid: Any = None,
    cu_seqlens: Any = None,
    rollout_sampling_mask_ids: Any = None,
    rollout_sampling_mask_offsets: Any = None,
    rollout_routed_experts: Any = None,
    old_routed_experts: Any = None,
    trmask_metrics: bool = False,
    return_details: bool = False,
    _exchange: Optional[Tuple[int, int, Any]] = None,
    **options: Any,
) -> Tuple[Any, Any, Dict[str, float]]:
    """verl's ``compute_rollout_correction_and_rejection_mask`` (verl 1dda039b), computed by
    trmask.

    Returns ``(rollout_is_weights or None, modified_response_mask, metrics)``: IS weights
    (``None`` when ``rollout_is`` is off; 0 at padding), the response mask with rejected
    tokens / sequences zeroed, and exactly verl's ``rollout_corr/*`` metric dict (plus
    trmask's ``trmask/*`` with ``trmask_metrics=True``). The arguments before ``*`` are
    verl's, with verl's meaning and threshold grammar (``"0.5_2.0"``, comma-separated
    criteria such as ``"seq_max_k2,seq_mean_k3"``).

    Inputs: ``[B, T]`` log-probs (float64/32/16 or bfloat16) and a bool or 0/1 mask, NumPy or
    CPU torch; with ``cu_seqlens`` (packed ``[N]`` tensors) ``response_mask`` is ``None``.
    Outputs are the caller's kind: weights in the log-probs' dtype (float32 for 16-bit
    inputs), the mask in the mask's dtype.

    Keyword-only extras:

    * ``backend``: ``"auto"`` (a hardware GPU if any, else the f64 CPU reference), ``"gpu"``,
      ``"cpu"``, ``"cpu-fast"`` (the CPU with f32 vocabulary divergences, the GPU's tolerance).
    * ``preset``: a preset name (:func:`preset_names`); ``config``: a dict of config keys. The
      verl arguments above override them where they differ from verl's defaults.
    * ``log_prob``, ``advantages``, ``responses``, ``rollout_logits``, ``old_logits``
      (``[B, T, V]``), ``uid`` (per sequence): what the trmask criteria need — exact
      ``seq_max_kl`` / ``seq_mean_tv`` … from logits, DPPO / PDM from advantages, GRPO group
      metrics from ``uid``.
    * ``rollout_sampling_mask_ids``, ``rollout_sampling_mask_offsets``: a truncated sampler's
      kept sets in CSR form (vLLM's ``SamplingMask``, slime's ``rollout_top_p_token_ids`` /
      ``_offsets``: the kept ids of every valid token concatenated, and ``valid tokens + 1``
      offsets, or ``slots + 1``). With ``rollout_logits`` they give the exact kept mass
      ``log S_t``; with ``sampling_replay=True`` every weight and mask uses the trainer's
      log-prob renormalised over them.
    * ``rollout_routed_experts``, ``old_routed_experts``: MoE routing, ``[B, T, L, K]`` (or
      ``[N, L, K]`` packed), any integer dtype, ``-1`` where a (token, layer) was not
      recorded: the experts the rollout engine used and the trainer's own choice without
      replay. They give the ``route_flip`` criteria (``seq_mean_route_flip`` …) and, with
      ``trmask_metrics=True``, the ``trmask/routing/*`` metrics.
    * ``**options``: trmask's config keys, e.g. ``ln_trm={"eps": 5e-3, "delta": 1e-4}``,
      ``token_veto=1e-4``, ``dppo={"delta": 1e-4, "direction": "predictive_aggregated"}``,
      ``temperature=1.0``, ``bypass_mode=True``.
    * ``return_details=True`` adds a 4th element: a dict with ``seq_accept``, ``seq_len``,
      ``seq_reject_bits`` and each criterion's per-sequence statistic.

    Raises ``ValueError`` (the CLI's one-line message naming the tensor or key) on bad input.

    For one shard per data-parallel rank see :mod:`trmask.distributed`.
    """
    verl_only = not trmask_metrics
    extra = _split_options(options, "compute_rollout_correction_and_rejection_mask")
    config_json, has_weights = _resolved_config(
        config,
        preset,
        (rollout_is, rollout_is_threshold, rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold),
        options,
        backend,
        verl_only,
    )
    given = dict(
        old_log_prob=old_log_prob,
        rollout_log_prob=rollout_log_prob,
        response_mask=response_mask,
        log_prob=log_prob,
        advantages=advantages,
        responses=responses,
        uid=uid,
        cu_seqlens=cu_seqlens,
        rollout_logits=rollout_logits,
        old_logits=old_logits,
        rollout_sampling_mask_ids=rollout_sampling_mask_ids,
        rollout_sampling_mask_offsets=rollout_sampling_mask_offsets,
        rollout_routed_experts=rollout_routed_experts,
        old_routed_experts=old_routed_experts,
    )
    for name, x in extra.items():
        if given.get(name) is not None:
            raise TypeError(
                f"compute_rollout_correction_and_rejection_mask() got multiple values for "
                f"argument '{name}'"
            )
        given[name] = x
    tensors: Dict[str, Any] = {}
    kinds: Dict[str, Kind] = {}
    for name, x in given.items():
        if x is not None:
            tensors[name], kinds[name] = borrow(x, name, _ROLES[name])
    shape = next((shape_of(tensors[n]) for n in _TOKEN_SHAPE if n in tensors), None)
    # verl's weights have old_log_prob's dtype (rollout_log_prob's when it is alone)
    values_kind = kinds.get("old_log_prob")
    values_kind = values_kind or kinds.get("rollout_log_prob")
    if values_kind is None:  # log-probs from logits: float64 of the inputs' kind
        first = next(iter(kinds.values()), Kind(False, np.float64))
        values_kind = Kind(first.torch, _float64(first.torch), first.device)
    mask_kind = kinds.get("response_mask") or values_kind
    # the outputs, allocated once in verl's dtypes; the library writes them in place
    slots = _slots(tensors)
    w_np = _OUT.take(slots, _np_dtype(float_out_dtype(values_kind))) if has_weights else None
    m_src = tensors.get("response_mask")
    m_dtype = m_src.dtype if isinstance(m_src, np.ndarray) else _np_dtype(mask_kind.dtype)
    m_np = _OUT.take(slots, m_dtype if m_dtype in _MASK_OUT else np.float64)
    try:
        out = _native.correct_into(
            tensors, config_json, backend, verl_only, w_np, m_np, _exchange, return_details
        )
    except ValueError as e:
        verl = _verl_exception(e)
        if verl is e:
            raise
        raise verl from None

    def tok(a: np.ndarray) -> np.ndarray:
        return a.reshape(shape) if shape is not None else a

    weights = None if w_np is None else values_kind.out(tok(w_np), float_out_dtype(values_kind))
    mask = mask_kind.out(tok(m_np))
    # floats, verl's keys only unless trmask_metrics (filtered natively)
    metrics = out["metrics"]
    if (config_json, backend, verl_only) not in _WARNED:
        # each rank checks its own shard; the metric flags only a single process's step (the
        # metrics are identical on every rank)
        flags = None if verl_only or _exchange is not None else metrics
        _data_warnings(tensors, config_json, backend, (config_json, backend, verl_only), flags)
    if not return_details:
        return weights, mask, metrics
    details = {
        "seq_accept": out["seq_accept"],
        "seq_len": out["seq_len"],
        "seq_reject_bits": out["seq_reject_bits"],
        "criteria": dict(out["criteria"]),
        "histograms": dict(out.get("histograms", {})),
    }
    return weights, mask, metrics, details  # type: ignore[return-value]


def vocab_divergence(
    rollout_logits: Any,
    trainer_logits: Any,
    responses: Any = None,
    mask: Any = None,
    temperature: float = 1.0,
    backend: str = "auto",
) -> Dict[str, Any]:
    """Exact per-token divergences between the rollout's and the trainer's full logits
    (``[..., V]``, float32 / float16 / bfloat16, NumPy or CPU torch, read in place) after
    dividing both by ``temperature``.

    Returns a dict of ``[...]``-shaped float64 arrays (float32 tensors for torch inputs of
    16-bit logits stay float64 too, since these are the reference values): ``kl``
    (KL(π_roll‖π_train)), ``kl_rev``, ``tv``, ``rollout_entropy``, ``training_entropy``, and
    with ``responses`` (``[...]`` ids) also ``rollout_log_prob`` and ``training_log_prob`` of
    the sampled tokens. ``mask`` (``[...]``, bool or 0/1) marks the slots to compute; others
    are 0. Rows are streamed (bounded memory whatever the vocabulary). Raises ``ValueError``
    on bad input (shapes, NaN logits, a sampled token the rollout gives probability 0)."""
    r, rk = borrow(rollout_logits, "rollout_logits", "logits")
    t, _ = borrow(trainer_logits, "trainer_logits", "logits")
    lead = shape_of(r)[:-1]
    if shape_of(t) != shape_of(r):
        raise ValueError(
            f"invalid input `trainer_logits`: shape {list(shape_of(t))} differs from "
            f"rollout_logits {list(shape_of(r))}"
        )
    ids = None
    if responses is not None:
        ids, _ = borrow(responses, "responses", "ids")
        if shape_of(ids) != lead:
            raise ValueError(
                f"invalid input `responses`: shape {list(shape_of(ids))} does not match the "
                f"logits' {list(lead)}"
            )
    m = None
    if mask is not None:
        m, _ = borrow(mask, "mask", "mask")
        if shape_of(m) != lead:
            raise ValueError(
                f"invalid input `mask`: shape {list(shape_of(m))} does not match the "
                f"logits' {list(lead)}"
            )
        if m.dtype != np.bool_:
            if not np.isin(m, (0, 1)).all():
                raise ValueError("invalid input `mask`: must hold 0 or 1")
            m = m.astype(bool)
    _open(backend)
    out = _native.vocab_divergence(r, t, ids, m, float(temperature), backend)
    kind = Kind(rk.torch, None, rk.device)
    return {k: kind.out(v.reshape(lead)) for k, v in out.items()}


def topk_divergence(
    rollout_topk_ids: Any,
    rollout_topk_log_prob: Any,
    responses: Any,
    trainer_logits: Any,
    rollout_log_prob: Any = None,
    mask: Any = None,
    top_k_support: str = "union",
    temperature: float = 1.0,
    backend: str = "auto",
) -> Dict[str, Any]:
    """Top-K divergences (docs/FORMAT.md, DPPO) between the rollout engine's top-K
    (``rollout_topk_ids`` / ``rollout_topk_log_prob``, ``[..., K]``, vLLM's ``logprobs=K``)
    and the trainer's full logits (``[..., V]``) on the support top-K ∪ {y}
    (``top_k_support="union"``) or DPPO's "y replaces the K-th" (``"replace_kth"``).

    ``responses`` are the sampled ids; ``rollout_log_prob`` is needed where a sampled token is
    not in the top-K. ``mask`` (``[B, T]``) marks valid slots (default: all). Returns a dict
    of ``[...]`` arrays: ``topk_kl``, ``topk_tv``, ``ddot_aggregated``, ``ddot_uniform``,
    ``prob_diff`` (π_y − μ_y), ``rollout_tail``, ``train_tail``."""
    tensors: Dict[str, Any] = {}
    kinds: Dict[str, Kind] = {}
    given = dict(
        rollout_topk_ids=rollout_topk_ids,
        rollout_topk_log_prob=rollout_topk_log_prob,
        responses=responses,
        trainer_logits=trainer_logits,
        rollout_log_prob=rollout_log_prob,
        response_mask=mask,
    )
    for name, x in given.items():
        if x is not None:
            tensors[name], kinds[name] = borrow(x, name, _ROLES[name])
    lead = shape_of(tensors["responses"])
    _open(backend)
    out = _native.topk_divergence(tensors, top_k_support, float(temperature), backend)
    kind = kinds["trainer_logits"]
    kind = Kind(kind.torch, None, kind.device)
    return {k: kind.out(v.reshape(lead)) for k, v in out.items()}


def analyze(
    batch: Union[Mapping[str, Any], str, "os.PathLike[str]"],
    config: Optional[Mapping[str, Any]] = None,
    *,
    preset: Optional[str] = None,
    backend: str = "auto",
    all_valid: bool = False,
) -> Dict[str, Any]:
    """Everything ``trmask analyze`` computes, for a batch given as a dict of arrays (trmask's
    tensor names or a framework's: verl, TRL, prime-rl, SkyRL, slime) or as the path of a
    safetensors / JSON file (docs/FORMAT.md).

    Returns ``{"outputs": {name: array}, "metrics": {name: float}, "notes": [str]}``:
    ``outputs`` holds every per-token tensor (``log_ratio``, ``k1``…``k3``, ``kl``… from
    logits, ``rollout_is_weights``, ``modified_response_mask``) in the batch's layout and
    every per-sequence one (``seq_len``, ``seq_<agg>_<stat>``, ``seq_accept``,
    ``seq_reject_bits``); ``metrics`` verl's ``rollout_corr/*`` and trmask's ``trmask/*``
    (including the bound certificate ``trmask/bound_*``); ``notes`` what the CLI would say on
    stderr (framework renames, the backend ``auto`` chose). Outputs are float64 NumPy arrays,
    or torch tensors when the batch held torch tensors.

    ``config`` is a dict of config keys (verl's plus trmask's), or use ``preset=``;
    ``all_valid=True`` states that a batch without ``response_mask`` / ``cu_seqlens`` has no
    padding (the CLI's ``--all-valid``)."""
    config_json = _json(_config(config, preset, {}, {}))
    _warn_config(config_json)
    _open(backend)
    if isinstance(batch, Mapping):
        tensors: Dict[str, Any] = {}
        torch_in = False
        for name, x in batch.items():
            if x is None:
                continue
            role = _ROLES.get(name, "values")
            if role == "skip":
                continue
            torch_in = torch_in or is_torch(x)
            tensors[name], _ = borrow(x, name, role)
        out = _native.analyze(tensors, config_json, backend, all_valid, None)
    else:
        torch_in = False
        out = _native.analyze({}, config_json, backend, all_valid, str(batch))
    kind = Kind(torch_in, None)
    return {
        "outputs": {k: kind.out(v) for k, v in out["outputs"].items()},
        "metrics": {k: float(v) for k, v in out["metrics"].items()},
        "notes": list(out["notes"]),
    }


# Roles of the tensors a batch dict may hold (framework aliases included, by their target's
# role), from the library's tensor table; other keys are ignored, as the CLI ignores them
# (`attention_mask`, the prompt-and-response mask of a trainer's batch, explicitly).
_ROLES = dict(_native.tensor_roles())
_ROLES["attention_mask"] = "skip"
# The per-token tensors that fix the token shape, in the order they are consulted.
_TOKEN_SHAPE = tuple(_native.token_shape_sources())


def bounds(
    horizon: int,
    delta: Optional[float] = None,
    eps: Optional[float] = None,
    kl_seq: Optional[float] = None,
    tv_seq: Optional[float] = None,
    dbar: Optional[Sequence[float]] = None,
    target_error: Optional[float] = None,
) -> Dict[str, Any]:
    """The TRM paper's surrogate-error bounds for a horizon ``T`` and per-token KL bound
    ``delta`` (``trmask bounds --json``): ``classical_kl``, ``classical_tv``, ``pm_kl``,
    ``pm_tv``, ``mix_kl``, ``mix_tv``, ``coupling``, ``adaptive_kl``, ``adaptive_tv``,
    ``adaptive``, the unified ``unified`` (B*) and the bound attaining it (``argmin``);
    ``filled`` lists the inputs filled by the paper's relaxations, ``inputs`` all of them.

    With ``target_error=E`` instead of ``delta`` (``trmask bounds --target-error E``): the
    largest ``delta`` whose B* is at most ``E`` (``eps`` fixed when given, else √(δ/2)), as
    ``{"target_error", "delta", "eps", "eps_from", "bounds"}``, ``bounds`` the bounds at it.

    >>> round(bounds(horizon=4096, delta=1e-4, eps=5e-3, kl_seq=0.01, tv_seq=0.05)["unified"], 3)
    4.096
    >>> r = bounds(horizon=4096, target_error=4.096, eps=5e-3)
    >>> round(r["bounds"]["unified"], 9), r["bounds"]["argmin"]
    (4.096, 'pm_kl')
    """
    if target_error is not None:
        if delta is not None or kl_seq is not None or tv_seq is not None or dbar is not None:
            raise ValueError("invalid config `target_error`: give it with horizon and eps only")
        return json.loads(_native.bounds_inverse(int(horizon), float(target_error), _opt(eps)))
    if delta is None:
        raise ValueError("invalid config `delta`: required unless target_error is given")
    d = None if dbar is None else [float(x) for x in np.asarray(dbar, dtype=np.float64).ravel()]
    return json.loads(
        _native.bounds(int(horizon), float(delta), _opt(eps), _opt(kl_seq), _opt(tv_seq), d)
    )


def _float64(torch_kind: bool) -> Any:
    if torch_kind:
        import sys

        return sys.modules["torch"].float64
    return np.dtype(np.float64)


def _opt(x: Optional[float]) -> Optional[float]:
    return None if x is None else float(x)


import os  # noqa: E402  (for the annotation above)

from .monitor import Monitor  # noqa: E402
