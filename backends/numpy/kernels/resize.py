"""Resize (opsets 10-19) and Upsample (opsets 7-9), separable and vectorized.

Interpolation is separable, so the tensor is resized one axis at a time. For each axis the
output coordinates are mapped to input coordinates (``coordinate_transformation_mode``), and
every output position gets a fixed number of taps: indices into the input (clamped to the
edge) and weights. The axis is then resized with one ``np.take`` and one multiply-add per tap.

- nearest: one tap chosen by ``nearest_mode``;
- linear / cubic: 2 / 4 taps with the triangle / cubic (``cubic_coeff_a``) kernel; with
  ``antialias`` and a scale below 1 the kernel is stretched by ``1 / scale`` (more taps) and
  the weights renormalized, as in ``onnx.reference``;
- ``exclude_outside`` zeroes the taps outside the input and renormalizes;
- ``tf_crop_and_resize`` writes ``extrapolation_value`` where a coordinate leaves the input.

Output sizes: ``floor(in * scale)`` from scales; from sizes, with ``keep_aspect_ratio_policy``
``not_larger`` / ``not_smaller``, one common scale (min / max) and ``round_half_up(in * scale)``.
"""

from __future__ import annotations

import math

import numpy as np

from edgeinfer.backends.numpy.kernels.nn_common import compute_dtype
from edgeinfer.backends.numpy.registry import kernel
from edgeinfer.ir import resize_geometry as geometry


def _resize_axis(data: np.ndarray, axis: int, index: np.ndarray, weights, dtype) -> np.ndarray:
    if weights is None:
        return np.take(data, index[:, 0], axis=axis)
    shape = (-1,) + (1,) * (data.ndim - axis - 1)
    out = None
    for tap in range(index.shape[1]):
        term = np.take(data, index[:, tap], axis=axis)
        term *= weights[:, tap].astype(dtype).reshape(shape)
        out = term if out is None else np.add(out, term, out=out)
    return out


@kernel("Resize", since=11)
def resize(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None, coordinate_transformation_mode="half_pixel",
              cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch",
              mode="nearest", nearest_mode="round_prefer_floor") -> np.ndarray:
    if mode not in geometry.MODES:
        raise ValueError(f"Resize: expected mode in {geometry.MODES}, found {mode!r}")
    axes, factors, out_sizes = geometry.output_geometry(x, scales, sizes, axes, keep_aspect_ratio_policy)
    crop = coordinate_transformation_mode == "tf_crop_and_resize"
    if crop and (roi is None or roi.size != 2 * len(axes)):
        raise ValueError(f"Resize: tf_crop_and_resize expects an roi of {2 * len(axes)} values, found "
                         f"{None if roi is None else roi.size}")
    dtype = compute_dtype(x.dtype)
    data = x if mode == "nearest" else x.astype(dtype, copy=False)
    for k, (axis, scale, out_size) in enumerate(zip(axes, factors, out_sizes, strict=False)):
        in_size = data.shape[axis]
        roi_axis = (float(roi[k]), float(roi[k + len(axes)])) if crop else None
        if out_size == in_size and math.isclose(scale, 1.0) and (not crop or roi_axis == (0.0, 1.0)):
            continue
        coords = geometry.source_coords(coordinate_transformation_mode, out_size, in_size, scale, roi_axis)
        index, weights = geometry.taps(coords, in_size, scale, mode, bool(antialias), cubic_coeff_a,
                               bool(exclude_outside), nearest_mode)
        data = _resize_axis(data, axis, index, weights, dtype)
        if crop:
            outside = (coords < 0) | (coords > in_size - 1)
            if outside.any():
                data = data.astype(dtype, copy=False)
                data[(slice(None),) * axis + (outside,)] = extrapolation_value
    if data.dtype == x.dtype:
        return data
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        return np.clip(np.rint(data), info.min, info.max).astype(x.dtype)
    return data.astype(x.dtype)


@kernel("Resize", since=10)
def resize_10(x, scales, *, mode="nearest"):
    return upsample_9(x, scales, mode=mode)


@kernel("Upsample", since=9)
def upsample_9(x, scales, *, mode="nearest"):
    """Upsample and Resize-10: asymmetric coordinates, nearest rounds down (``np.repeat``)."""
    return resize(x, scales=np.asarray(scales, dtype=np.float32), mode=mode,
                     coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@kernel("Upsample", since=7)
def upsample_7(x, *, mode="nearest", scales=None):
    if scales is None:
        raise ValueError("Upsample: the scales attribute is required")
    return upsample_9(x, np.asarray(scales, dtype=np.float32), mode=mode)
