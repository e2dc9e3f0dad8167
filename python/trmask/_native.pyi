"""Type stubs of the PyO3 extension `trmask._native` (python/src/lib.rs). Use the wrappers in
`trmask` (they convert inputs and outputs); these take C-contiguous NumPy arrays, bfloat16 as
`("bfloat16", uint16 array)`, and return float64 NumPy arrays."""

from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

_Array = Union[npt.NDArray[Any], Tuple[str, npt.NDArray[np.uint16]]]

__version__: str

def correct(tensors: Dict[str, _Array], config_json: str, backend: str, verl_only: bool = ...) -> Dict[str, Any]: ...
def tensor_roles() -> List[Tuple[str, str]]: ...
def token_shape_sources() -> List[str]: ...
def correct_shard(
    tensors: Dict[str, _Array],
    config_json: str,
    backend: str,
    rank: int,
    size: int,
    all_gather: Callable[[bytes], List[bytes]],
    verl_only: bool = ...,
) -> Dict[str, Any]: ...
def analyze(
    tensors: Dict[str, _Array],
    config_json: str,
    backend: str,
    all_valid: bool = False,
    path: Optional[str] = None,
) -> Dict[str, Any]: ...
def vocab_divergence(
    rollout_logits: _Array,
    trainer_logits: _Array,
    responses: Optional[npt.NDArray[np.int64]],
    mask: Optional[npt.NDArray[np.bool_]],
    temperature: float,
    backend: str,
) -> Dict[str, npt.NDArray[np.float64]]: ...
def topk_divergence(
    tensors: Dict[str, _Array], support: str, temperature: float, backend: str
) -> Dict[str, npt.NDArray[np.float64]]: ...
def bounds(
    horizon: int,
    delta: float,
    eps: Optional[float] = None,
    kl_seq: Optional[float] = None,
    tv_seq: Optional[float] = None,
    dbar: Optional[List[float]] = None,
) -> str: ...
def preset(name: str) -> str: ...
def preset_names() -> List[str]: ...
def config_warnings(config_json: str) -> List[str]: ...
def label_ids(labels: List[str]) -> List[int]: ...
def engine_name(backend: str) -> Tuple[str, List[str]]: ...
def last_borrows() -> List[Tuple[str, int, int]]: ...
