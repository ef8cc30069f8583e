"""Element types of IR values.

A tensor's dtype is held as a numpy dtype name (``"float32"``, ``"int64"``, ``"bool"``, ...).
Non-tensor ONNX types used by sequence and optional ops are spelled ``"sequence(float32)"``
and ``"optional(sequence(int64))"``. The mapping to ONNX ``TensorProto`` codes is taken from
``onnx.helper`` so the two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgeinfer.errors import ModelFormatError

# dtypes that a numpy array and an .eim file can hold (the .eim loader's whitelist).
NUMERIC_DTYPES: tuple[str, ...] = (
    "float16",
    "float32",
    "float64",
    "bfloat16",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "bool",
)

_ONNX_TO_NAME: dict[int, str] = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.DOUBLE: "float64",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.INT16: "int16",
    TensorProto.UINT16: "uint16",
    TensorProto.INT32: "int32",
    TensorProto.UINT32: "uint32",
    TensorProto.INT64: "int64",
    TensorProto.UINT64: "uint64",
    TensorProto.BOOL: "bool",
    TensorProto.STRING: "str",
    TensorProto.COMPLEX64: "complex64",
    TensorProto.COMPLEX128: "complex128",
}
# Newer element types (float8, int4, ...) are named by onnx itself.
for _code in helper.get_all_tensor_dtypes():
    if _code not in _ONNX_TO_NAME and _code != TensorProto.UNDEFINED:
        _ONNX_TO_NAME[_code] = helper.tensor_dtype_to_string(_code).removeprefix("TensorProto.").lower()
_NAME_TO_ONNX = {name: code for code, name in _ONNX_TO_NAME.items()}


def from_onnx(code: int) -> str:
    """ONNX ``TensorProto`` element type code -> dtype name."""
    try:
        return _ONNX_TO_NAME[code]
    except KeyError:
        raise ModelFormatError(f"unknown ONNX element type code {code}") from None


def to_onnx(name: str) -> int:
    """dtype name -> ONNX ``TensorProto`` element type code."""
    try:
        return _NAME_TO_ONNX[name]
    except KeyError:
        raise ModelFormatError(f"dtype {name!r} has no ONNX element type") from None


def numpy_dtype(name: str) -> np.dtype:
    """dtype name -> numpy dtype (``str`` maps to object arrays, ``bfloat16`` to ml_dtypes)."""
    if name == "str":
        return np.dtype(object)
    if name in ("float32", "float16", "float64", "int8", "uint8", "int16", "uint16", "int32",
                "uint32", "int64", "uint64", "bool", "complex64", "complex128"):
        return np.dtype(name)
    code = _NAME_TO_ONNX.get(name)
    if code is None:
        raise ModelFormatError(f"unknown dtype {name!r}")
    return helper.tensor_dtype_to_np_dtype(code)


def name_of(dtype: np.dtype | type | str) -> str:
    """numpy dtype (or array dtype) -> dtype name."""
    dt = np.dtype(dtype)
    if dt == np.dtype(object) or dt.kind in "US":
        return "str"
    if dt.name in _NAME_TO_ONNX:
        return dt.name
    try:
        return from_onnx(helper.np_dtype_to_tensor_dtype(dt))
    except (KeyError, ValueError) as exc:
        raise ModelFormatError(f"numpy dtype {dt} has no edgeinfer dtype") from exc


def is_tensor_type(name: str | None) -> bool:
    return name is not None and "(" not in name


def type_to_onnx(name: str | None, shape) -> onnx.TypeProto:
    """dtype name (tensor, sequence or optional) and shape -> ``onnx.TypeProto``."""
    tp = onnx.TypeProto()
    if name is not None and name.startswith("sequence("):
        tp.sequence_type.elem_type.CopyFrom(type_to_onnx(name[9:-1], None))
    elif name is not None and name.startswith("optional("):
        tp.optional_type.elem_type.CopyFrom(type_to_onnx(name[9:-1], None))
    else:
        tensor = tp.tensor_type
        tensor.elem_type = to_onnx(name) if name is not None else TensorProto.UNDEFINED
        if shape is not None:
            tensor.shape.SetInParent()
            for dim in shape:
                d = tensor.shape.dim.add()
                if isinstance(dim, int):
                    d.dim_value = dim
                elif isinstance(dim, str):
                    d.dim_param = dim
    return tp


def type_from_onnx(tp: onnx.TypeProto) -> tuple[str | None, tuple | None]:
    """``onnx.TypeProto`` -> (dtype name or None, shape or None)."""
    kind = tp.WhichOneof("value")
    if kind == "sequence_type":
        inner, _ = type_from_onnx(tp.sequence_type.elem_type)
        return f"sequence({inner})", None
    if kind == "optional_type":
        inner, _ = type_from_onnx(tp.optional_type.elem_type)
        return f"optional({inner})", None
    if kind != "tensor_type":
        return None, None
    tensor = tp.tensor_type
    dtype = from_onnx(tensor.elem_type) if tensor.elem_type else None
    if not tensor.HasField("shape"):
        return dtype, None
    dims = []
    for d in tensor.shape.dim:
        which = d.WhichOneof("value")
        dims.append(d.dim_value if which == "dim_value" else d.dim_param if which == "dim_param" else None)
    return dtype, tuple(dims)


@dataclass(frozen=True)
class TypeSpec:
    """A type held as an attribute value (ONNX ``TYPE_PROTO`` attributes, e.g. ``Optional``)."""

    dtype: str | None
    shape: tuple | None = None
