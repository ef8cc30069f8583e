"""Element types of IR values.

A tensor's dtype is held as a numpy dtype name (``"float32"``, ``"int64"``, ``"bool"``, ...).
Non-tensor ONNX types used by sequence and optional ops are spelled ``"sequence(float32)"``
and ``"optional(sequence(int64))"``. The common ONNX ``TensorProto`` codes are a fixed table
(a test checks it against onnx), so loading and running a model imports no onnx; the rarer
types (float8, int4, ...) come from ``onnx.helper``, so the two never disagree.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

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

# ONNX ``TensorProto`` element type codes of the common types (fixed by onnx.proto: a test checks
# them against ``onnx.TensorProto``), so that loading a model and running it needs no onnx import.
_COMMON: dict[int, str] = {
    1: "float32",
    10: "float16",
    11: "float64",
    16: "bfloat16",
    3: "int8",
    2: "uint8",
    5: "int16",
    4: "uint16",
    6: "int32",
    12: "uint32",
    7: "int64",
    13: "uint64",
    9: "bool",
    8: "str",
    14: "complex64",
    15: "complex128",
}
_COMMON_CODES = {name: code for code, name in _COMMON.items()}


@functools.cache
def _all_types() -> tuple[dict[int, str], dict[str, int]]:
    """Every element type onnx knows (float8, int4, ...: named by onnx itself), with the common ones."""
    from onnx import TensorProto, helper

    names = dict(_COMMON)
    for code in helper.get_all_tensor_dtypes():
        if code not in names and code != TensorProto.UNDEFINED:
            names[code] = helper.tensor_dtype_to_string(code).removeprefix("TensorProto.").lower()
    return names, {name: code for code, name in names.items()}


def from_onnx(code: int) -> str:
    """ONNX ``TensorProto`` element type code -> dtype name."""
    name = _COMMON.get(code)
    if name is None:
        name = _all_types()[0].get(code)
    if name is None:
        raise ModelFormatError(f"unknown ONNX element type code {code}")
    return name


def to_onnx(name: str) -> int:
    """dtype name -> ONNX ``TensorProto`` element type code."""
    code = _COMMON_CODES.get(name)
    if code is None:
        code = _all_types()[1].get(name)
    if code is None:
        raise ModelFormatError(f"dtype {name!r} has no ONNX element type")
    return code


def numpy_dtype(name: str) -> np.dtype:
    """dtype name -> numpy dtype (``str`` maps to object arrays, ``bfloat16`` to ml_dtypes)."""
    if name == "str":
        return np.dtype(object)
    if name in ("float32", "float16", "float64", "int8", "uint8", "int16", "uint16", "int32",
                "uint32", "int64", "uint64", "bool", "complex64", "complex128"):
        return np.dtype(name)
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    code = _all_types()[1].get(name)
    if code is None:
        raise ModelFormatError(f"unknown dtype {name!r}")
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(code)


def name_of(dtype: np.dtype | type | str) -> str:
    """numpy dtype (or array dtype) -> dtype name."""
    dt = np.dtype(dtype)
    if dt == np.dtype(object) or dt.kind in "US":
        return "str"
    if dt.name in _COMMON_CODES:
        return dt.name
    from onnx import helper

    try:
        return from_onnx(helper.np_dtype_to_tensor_dtype(dt))
    except (KeyError, ValueError) as exc:
        raise ModelFormatError(f"numpy dtype {dt} has no edgeinfer dtype") from exc


def is_tensor_type(name: str | None) -> bool:
    return name is not None and "(" not in name


def type_to_onnx(name: str | None, shape) -> Any:
    """dtype name (tensor, sequence or optional) and shape -> ``onnx.TypeProto``."""
    import onnx

    tp = onnx.TypeProto()
    if name is not None and name.startswith("sequence("):
        tp.sequence_type.elem_type.CopyFrom(type_to_onnx(name[9:-1], None))
    elif name is not None and name.startswith("optional("):
        tp.optional_type.elem_type.CopyFrom(type_to_onnx(name[9:-1], None))
    else:
        tensor = tp.tensor_type
        tensor.elem_type = to_onnx(name) if name is not None else onnx.TensorProto.UNDEFINED
        if shape is not None:
            tensor.shape.SetInParent()
            for dim in shape:
                d = tensor.shape.dim.add()
                if isinstance(dim, int):
                    d.dim_value = dim
                elif isinstance(dim, str):
                    d.dim_param = dim
    return tp


def type_from_onnx(tp: Any) -> tuple[str | None, tuple | None]:
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


class TypeSpec:
    """A type held as an attribute value (ONNX ``TYPE_PROTO`` attributes, e.g. ``Optional``).
    Immutable; a plain class, not a tuple (attribute code tells tuples of values apart) nor a
    dataclass (a device's cold start imports this module and no ``dataclasses``)."""

    __slots__ = ("dtype", "shape")
    dtype: str | None
    shape: tuple | None

    def __init__(self, dtype: str | None, shape: tuple | None = None) -> None:
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"TypeSpec is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TypeSpec) and (self.dtype, self.shape) == (other.dtype, other.shape)

    def __hash__(self) -> int:
        return hash((self.dtype, self.shape))

    def __reduce__(self) -> tuple:  # copy and deepcopy rebuild it through __init__
        return TypeSpec, (self.dtype, self.shape)

    def __repr__(self) -> str:
        return f"TypeSpec(dtype={self.dtype!r}, shape={self.shape!r})"
