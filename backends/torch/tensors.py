"""numpy <-> torch: element types and conversions (bfloat16 travels as its 16-bit pattern)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

# The element types torch computes with. uint16/32/64 exist in torch but have almost no
# kernels (``add_cpu`` is "not implemented for 'UInt32'"), float8/float4/int4 none.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16, "float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "bool": torch.bool,
}
NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}



def torch_dtype(name: str | None) -> torch.dtype | None:
    return TORCH_DTYPES.get(name) if name else None


def to_torch(array: np.ndarray | np.generic) -> torch.Tensor:
    """A CPU tensor sharing ``array``'s memory where numpy's layout allows."""
    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    if array.dtype.name not in TORCH_DTYPES:
        raise TypeError(f"element type {array.dtype.name} has no torch equivalent")
    if not array.flags.c_contiguous or array.dtype.byteorder == ">":
        array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
    if not array.flags.writeable:
        # memory-mapped weights, read-only feeds: lowerings never write into their inputs, so
        # sharing the buffer is safe, and torch's warning about it is noise
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(array)
    return torch.from_numpy(array)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()
