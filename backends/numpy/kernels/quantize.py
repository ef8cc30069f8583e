"""QuantizeLinear and DequantizeLinear: per-tensor, per-axis and blocked.

``QuantizeLinear``: ``y = saturate(round_half_even(x / scale) + zero_point)``;
``DequantizeLinear``: ``y = (x - zero_point) * scale``. A 1-D scale of length
``x.shape[axis]`` is per-axis; a scale of x's rank whose ``axis`` dimension is
``ceil(x.shape[axis] / block_size)`` is blocked (each scale covers ``block_size`` elements).

The integer types (int8, uint8, int16, uint16 and, for DequantizeLinear, int32) are computed
here. The low-precision float and sub-byte types (float8, float4, int4, ...) are delegated to
``onnx.reference``, whose casts (``ml_dtypes``, saturating where the spec says so) define them.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.backends.numpy.kernels.nn_common import normalize_axis, run_reference
from edgeinfer.backends.numpy.registry import kernel

_INTEGER_TYPES = tuple(np.dtype(t) for t in ("int8", "uint8", "int16", "uint16", "int32"))


def broadcast_param(op: str, name: str, value: np.ndarray, shape: tuple[int, ...], axis: int,
                    block_size: int = 0) -> np.ndarray:
    """A scale or zero point reshaped (or, blocked, repeated) to broadcast against ``shape``."""
    if value.size == 1 and not block_size:
        return value.reshape(())
    axis = normalize_axis(op, axis, len(shape))
    if not block_size:
        if value.ndim != 1 or value.size != shape[axis]:
            raise ValueError(f"{op}: expected {name} to be a scalar or 1-D of length {shape[axis]} "
                             f"(axis {axis} of input shape {list(shape)}), found shape {list(value.shape)}")
        return value.reshape((-1,) + (1,) * (len(shape) - axis - 1))
    blocks = -(-shape[axis] // block_size)
    expected = shape[:axis] + (blocks,) + shape[axis + 1:]
    if value.shape != expected:
        raise ValueError(f"{op}: expected blocked {name} of shape {list(expected)} (block_size "
                         f"{block_size} on axis {axis}), found shape {list(value.shape)}")
    return np.repeat(value, block_size, axis=axis)[(slice(None),) * axis + (slice(0, shape[axis]),)]


def _output_type(zero_point, output_dtype: int) -> np.dtype:
    from onnx.helper import tensor_dtype_to_np_dtype

    if zero_point is not None:
        if output_dtype and tensor_dtype_to_np_dtype(output_dtype) != zero_point.dtype:
            raise ValueError(f"QuantizeLinear: output_dtype {tensor_dtype_to_np_dtype(output_dtype)} differs "
                             f"from the zero point's type {zero_point.dtype}")
        return zero_point.dtype
    return tensor_dtype_to_np_dtype(output_dtype) if output_dtype else np.dtype(np.uint8)


@kernel("QuantizeLinear", since=10)
def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=0, precision=0,
                    saturate=1, _ctx=None):
    dtype = _output_type(y_zero_point, output_dtype)
    if dtype not in _INTEGER_TYPES[:4] or precision:
        attrs = dict(axis=axis, block_size=block_size, output_dtype=output_dtype, precision=precision,
                     saturate=saturate)
        return run_reference("QuantizeLinear", _ctx.opset if _ctx else 21, [x, y_scale, y_zero_point], attrs)[0]
    scale = broadcast_param("QuantizeLinear", "y_scale", y_scale, x.shape, axis, block_size)
    scaled = np.rint(x / scale)
    if y_zero_point is not None:
        scaled += broadcast_param("QuantizeLinear", "y_zero_point", y_zero_point, x.shape, axis, block_size)
    info = np.iinfo(dtype)
    return np.clip(scaled, info.min, info.max).astype(dtype)


@kernel("DequantizeLinear", since=10)
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0, _ctx=None):
    if x.dtype not in _INTEGER_TYPES:
        attrs = dict(axis=axis, block_size=block_size, output_dtype=output_dtype)
        return run_reference("DequantizeLinear", _ctx.opset if _ctx else 21, [x, x_scale, x_zero_point], attrs)[0]
    if x_zero_point is not None and x_zero_point.dtype != x.dtype:
        raise ValueError(f"DequantizeLinear: expected x_zero_point of x's type {x.dtype}, found {x_zero_point.dtype}")
    scale = broadcast_param("DequantizeLinear", "x_scale", x_scale, x.shape, axis, block_size)
    if output_dtype:
        from onnx.helper import tensor_dtype_to_np_dtype

        out_type = tensor_dtype_to_np_dtype(output_dtype)
    else:
        out_type = x_scale.dtype
    work = np.float64 if x.dtype == np.int32 else np.float32  # int32 - zp is not exact in float32
    shifted = x.astype(work)
    if x_zero_point is not None:
        shifted -= broadcast_param("DequantizeLinear", "x_zero_point", x_zero_point, x.shape, axis, block_size)
    return (shifted * scale.astype(np.float32)).astype(out_type)
