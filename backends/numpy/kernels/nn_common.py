"""Geometry and helpers shared by the convolution, pooling and quantized kernels.

Window geometry follows the ONNX spec (and ``onnx.reference``): for each spatial axis with
input size ``n``, kernel ``k``, stride ``s``, dilation ``d`` and effective kernel
``e = (k - 1) * d + 1``:

- explicit pads ``(b, a)``: ``out = floor((n + b + a - e) / s) + 1`` (``ceil`` in ceil mode,
  dropping a last window that would start beyond the input and its leading pad);
- ``VALID``: no padding, ``out = floor((n - e) / s) + 1``;
- ``SAME_UPPER`` / ``SAME_LOWER``: ``out = ceil(n / s)`` and the total padding
  ``max(0, (out - 1) * s + e - n)`` is split with the odd element at the end (UPPER) or at
  the beginning (LOWER).

Kernels raise ``ValueError`` for inconsistent inputs; the executor turns it into a
``BackendError`` that names the node and the input shapes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def spatial_attrs(op: str, spatial: Sequence[int], kernel_shape, strides, dilations,
                  pads) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Kernel, strides, dilations and pads with defaults filled in and lengths checked."""
    rank = len(spatial)
    kernel = tuple(int(k) for k in kernel_shape)
    strides = tuple(int(s) for s in strides) if strides else (1,) * rank
    dilations = tuple(int(d) for d in dilations) if dilations else (1,) * rank
    pads = tuple(int(p) for p in pads) if pads else (0,) * (2 * rank)
    for name, value, want in (("kernel_shape", kernel, rank), ("strides", strides, rank),
                              ("dilations", dilations, rank), ("pads", pads, 2 * rank)):
        if len(value) != want:
            raise ValueError(f"{op}: expected {want} values in {name} for {rank} spatial axes, "
                             f"found {list(value)}")
    if min(kernel + strides + dilations, default=1) < 1:
        raise ValueError(f"{op}: kernel_shape, strides and dilations must be >= 1, found "
                         f"{list(kernel)}, {list(strides)}, {list(dilations)}")
    if min(pads, default=0) < 0:
        raise ValueError(f"{op}: pads must be >= 0, found {list(pads)}")
    return kernel, strides, dilations, pads


def window_geometry(op: str, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                    dilations: Sequence[int], pads: Sequence[int], auto_pad: str = "NOTSET",
                    ceil_mode: bool = False) -> tuple[list[int], list[int], list[int]]:
    """(output sizes, leading pads, trailing pads) of a sliding window op.

    The trailing pads returned cover every input position a window reads, so in ceil mode
    they may exceed the explicit pads; callers that count padding (AveragePool) use the
    explicit ones for that.
    """
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"{op}: expected auto_pad in {AUTO_PADS}, found {auto_pad!r}")
    rank = len(spatial)
    out, begin, end = [], [], []
    for axis, n in enumerate(spatial):
        k, s, d = kernel[axis], strides[axis], dilations[axis]
        extent = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            size = -(-n // s)
            total = max(0, (size - 1) * s + extent - n)
            small, large = total // 2, total - total // 2
            b, a = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        elif auto_pad == "VALID":
            b = a = 0
            size = (n - extent) // s + 1
        else:
            b, a = pads[axis], pads[axis + rank]
            span = n + b + a - extent
            if ceil_mode:
                size = -(-span // s) + 1
                if (size - 1) * s >= n + b:
                    size -= 1
            else:
                size = span // s + 1
        if size < 1:
            raise ValueError(f"{op}: spatial axis {axis} of size {n} with pads ({b}, {a}) is smaller than "
                             f"the kernel extent {extent}; expected an output size >= 1, found {size}")
        out.append(size)
        begin.append(b)
        end.append(max(a, (size - 1) * s + extent - n - b))
    return out, begin, end


def pad_spatial(x: np.ndarray, begin: Sequence[int], end: Sequence[int], value=0) -> np.ndarray:
    """``x`` padded on its trailing ``len(begin)`` axes (no copy when there is nothing to pad)."""
    if not any(begin) and not any(end):
        return x
    lead = x.ndim - len(begin)
    shape = x.shape[:lead] + tuple(n + b + a for n, b, a in zip(x.shape[lead:], begin, end, strict=False))
    padded = np.empty(shape, dtype=x.dtype)
    # fill only the border slabs, so the tensor is written once (not filled, then copied over)
    for axis, (before, after) in enumerate(zip(begin, end, strict=False)):
        index = [slice(None)] * len(shape)
        if before > 0:
            index[lead + axis] = slice(0, before)
            padded[tuple(index)] = value
        if after > 0:
            index[lead + axis] = slice(shape[lead + axis] - after, None)
            padded[tuple(index)] = value
    padded[(Ellipsis, *(slice(b, b + n) for b, n in zip(begin, x.shape[lead:], strict=False)))] = x
    return padded


def tap_slices(offsets: Sequence[int], strides: Sequence[int], sizes: Sequence[int]) -> tuple:
    """Index of the strided view that one kernel tap reads from a padded input."""
    return (Ellipsis, *(slice(o, o + s * (n - 1) + 1, s) for o, s, n in zip(offsets, strides, sizes, strict=False)))


def kernel_taps(kernel: Sequence[int], dilations: Sequence[int]):
    """Every kernel tap as (its index in the kernel, its offset in the input)."""
    for index in np.ndindex(*kernel):
        yield index, tuple(i * d for i, d in zip(index, dilations, strict=False))


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype arithmetic runs in: float32 for half types (numpy has no fast fp16 BLAS)."""
    dtype = np.dtype(dtype)
    if dtype in (np.float32, np.float64):
        return dtype
    return np.dtype(np.float32)


def as_compute(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return array if array.dtype == dtype else array.astype(dtype)


def normalize_axis(op: str, axis: int, rank: int, name: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{op}: expected {name} in [{-rank}, {rank - 1}] for a rank-{rank} input, "
                         f"found {axis}")
    return axis % rank


def prod(values: Sequence[int]) -> int:
    return math.prod(int(v) for v in values)


@functools.lru_cache(maxsize=256)
def _reference_evaluator(op_type: str, opset: int, input_types: tuple, output_count: int, attrs: tuple):
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" if code else "" for k, code in enumerate(input_types)]
    node = helper.make_node(op_type, names, [f"o{k}" for k in range(output_count)])
    node.attribute.extend(helper.make_attribute(k, list(v) if isinstance(v, tuple) else v) for k, v in attrs)
    inputs = [helper.make_tensor_value_info(n, code, None) for n, code in zip(names, input_types, strict=False) if n]
    outputs = [helper.make_empty_tensor_value_info(f"o{k}") for k in range(output_count)]
    model = helper.make_model(helper.make_graph([node], op_type, inputs, outputs),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = onnx.IR_VERSION
    return ReferenceEvaluator(model)


def run_reference(op_type: str, opset: int, inputs: Sequence[np.ndarray | None], attrs: dict,
                  output_count: int = 1) -> list[np.ndarray]:
    """Run one op with ``onnx.reference`` (for element types numpy cannot compute natively).

    ``attrs`` may hold every attribute the kernel knows; only those the op's schema at
    ``opset`` defines are passed on.
    """
    import onnx
    from onnx.helper import np_dtype_to_tensor_dtype

    known = onnx.defs.get_schema(op_type, opset).attributes
    attrs = {k: v for k, v in attrs.items() if k in known and v is not None}

    types = tuple(0 if a is None else np_dtype_to_tensor_dtype(a.dtype) for a in inputs)
    evaluator = _reference_evaluator(op_type, opset, types, output_count, tuple(sorted(attrs.items())))
    feeds = {f"i{k}": a for k, a in enumerate(inputs) if a is not None}
    return evaluator.run(None, feeds)
