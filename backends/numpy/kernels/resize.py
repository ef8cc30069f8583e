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

from edgeinfer.backends.numpy.kernels.nn_common import compute_dtype, normalize_axis
from edgeinfer.backends.numpy.registry import kernel

_NEAREST = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}
_MODES = ("nearest", "linear", "cubic")


def _source_coords(mode: str, out_size: int, in_size: int, scale: float, roi_axis) -> np.ndarray:
    """Input coordinate of every output position along one axis (float64)."""
    y = np.arange(out_size, dtype=np.float64)
    length = scale * in_size  # the spec's (fractional) resized length
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / length)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if length != 1 else np.full(out_size, -0.5)
    if mode == "align_corners":
        return y * (in_size - 1) / (length - 1) if length != 1 else np.zeros(out_size)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if mode == "tf_crop_and_resize":
        start, end = roi_axis
        if length == 1:
            return np.full(out_size, (end - start) * (in_size - 1) / 2 + start * (in_size - 1))
        return y * (end - start) * (in_size - 1) / (length - 1) + start * (in_size - 1)
    raise ValueError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _cubic_kernel(distance: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _taps(coords: np.ndarray, in_size: int, scale: float, mode: str, antialias: bool, cubic_a: float,
          exclude_outside: bool, nearest_mode: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(indices [out, taps], weights [out, taps] or None for nearest)."""
    if mode == "nearest":
        rounding = _NEAREST.get(nearest_mode)
        if rounding is None:
            raise ValueError(f"Resize: expected nearest_mode in {sorted(_NEAREST)}, found {nearest_mode!r}")
        index = np.where(coords == np.floor(coords), coords, rounding(coords))
        return np.clip(index, 0, in_size - 1).astype(np.intp)[:, None], None
    stretch = min(scale, 1.0) if antialias else 1.0
    radius = 1 if mode == "linear" else 2
    first = math.floor(-radius / stretch) + 1
    offsets = np.arange(first, 2 - first)
    base = np.floor(coords)
    index = base[:, None] + offsets[None, :]
    distance = (index - coords[:, None]) * stretch
    if mode == "linear":
        weights = np.clip(1 - np.abs(distance), 0, 1)
    else:
        weights = _cubic_kernel(distance, cubic_a)
    if exclude_outside:
        weights = np.where((index < 0) | (index >= in_size), 0.0, weights)
    if antialias or exclude_outside:
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(index, 0, in_size - 1).astype(np.intp), weights


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


def _output_geometry(x, scales, sizes, axes, policy):
    rank = x.ndim
    axes = list(range(rank)) if axes is None else [normalize_axis("Resize", a, rank, "axes") for a in axes]
    in_sizes = [x.shape[a] for a in axes]
    if sizes is not None and sizes.size:
        if sizes.size != len(axes):
            raise ValueError(f"Resize: expected {len(axes)} sizes, found {sizes.size}")
        out = [int(s) for s in sizes]
        factors = [o / i for o, i in zip(out, in_sizes, strict=False)]
        if policy in ("not_larger", "not_smaller"):
            common = min(factors) if policy == "not_larger" else max(factors)
            factors = [common] * len(axes)
            out = [int(common * i + 0.5) for i in in_sizes]
        elif policy != "stretch":
            raise ValueError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
    elif scales is not None and scales.size:
        if scales.size != len(axes):
            raise ValueError(f"Resize: expected {len(axes)} scales, found {scales.size}")
        factors = [float(s) for s in scales.astype(np.float64)]
        if min(factors) <= 0:
            raise ValueError(f"Resize: expected positive scales, found {factors}")
        out = [int(f * i) for f, i in zip(factors, in_sizes, strict=False)]
    else:
        raise ValueError("Resize: expected one of scales or sizes, found neither")
    return axes, factors, out


@kernel("Resize", since=11)
def resize(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None, coordinate_transformation_mode="half_pixel",
              cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch",
              mode="nearest", nearest_mode="round_prefer_floor") -> np.ndarray:
    if mode not in _MODES:
        raise ValueError(f"Resize: expected mode in {_MODES}, found {mode!r}")
    axes, factors, out_sizes = _output_geometry(x, scales, sizes, axes, keep_aspect_ratio_policy)
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
        coords = _source_coords(coordinate_transformation_mode, out_size, in_size, scale, roi_axis)
        index, weights = _taps(coords, in_size, scale, mode, bool(antialias), cubic_coeff_a,
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
