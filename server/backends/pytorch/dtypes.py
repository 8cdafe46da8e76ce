"""Config data types ↔ torch dtypes, and numpy ↔ torch without copies where the layout allows.

BF16 travels as ``ml_dtypes.bfloat16`` numpy arrays (what tritonclient sends and reads); torch has no
numpy bfloat16, so those arrays cross as int16 views. ``TYPE_STRING`` is not a tensor type: TorchScript
models take and return ``List[str]`` for it (one dimension, as in Triton).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

STRING = "TYPE_STRING"
_NAMES = {
    "TYPE_BOOL": "bool",
    "TYPE_UINT8": "uint8",
    "TYPE_UINT16": "uint16",
    "TYPE_UINT32": "uint32",
    "TYPE_UINT64": "uint64",
    "TYPE_INT8": "int8",
    "TYPE_INT16": "int16",
    "TYPE_INT32": "int32",
    "TYPE_INT64": "int64",
    "TYPE_FP16": "float16",
    "TYPE_BF16": "bfloat16",
    "TYPE_FP32": "float32",
    "TYPE_FP64": "float64",
}


def supported(config_type: str) -> bool:
    return config_type == STRING or config_type in _NAMES


def torch_dtype(config_type: str) -> Any:
    import torch

    return getattr(torch, _NAMES[config_type])


def config_type(dtype: Any) -> str:
    """``TYPE_*`` name of a torch dtype (``TYPE_INVALID`` when the config has none)."""
    name = str(dtype).removeprefix("torch.")
    for config_name, torch_name in _NAMES.items():
        if torch_name == name:
            return config_name
    return "TYPE_INVALID"


def to_tensor(array: np.ndarray) -> Any:
    """A CPU tensor sharing ``array``'s memory (copied once when numpy marks it read-only)."""
    import torch

    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, order="C")
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def to_numpy(tensor: Any) -> np.ndarray:
    """A numpy array of a tensor (moved to the CPU first)."""
    import torch

    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    array: np.ndarray = (
        tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if tensor.dtype == torch.bfloat16 else tensor.numpy()
    )
    return array
