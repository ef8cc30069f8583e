"""Resize (opsets 10-19) and Upsample (7-9): separable, one axis at a time.

The geometry (output sizes, source coordinates, taps and weights per output position) depends
only on shapes and attributes, so it is computed on the host with the numpy backend's
definitions (``edgeinfer.backends.numpy.kernels.resize``: the one place the spec's coordinate
modes are written down) and cached per shape, on the device; each axis is then resized with
one ``index_select`` and one multiply-add per tap. Cached taps also mean a CUDA graph capture
performs no host-to-device copy.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from edgeinfer.backends.torch.registry import lowering
from edgeinfer.ir import resize_geometry as geometry


def _array(value):
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.cpu().numpy()
    return np.asarray(value, dtype=np.float64 if any(isinstance(v, float) for v in value) else np.int64)


@functools.lru_cache(maxsize=512)
def _axis_plan(mode, coordinate_mode, out_size, in_size, scale, roi_axis, antialias, cubic_a, exclude_outside,
               nearest_mode, device):
    coords = geometry.source_coords(coordinate_mode, out_size, in_size, scale, roi_axis)
    index, weights = geometry.taps(coords, in_size, scale, mode, antialias, cubic_a, exclude_outside, nearest_mode)
    outside = (coords < 0) | (coords > in_size - 1) if coordinate_mode == "tf_crop_and_resize" else None
    as_device = functools.partial(torch.as_tensor, device=device)
    return (as_device(index.astype(np.int64)), None if weights is None else as_device(weights),
            None if outside is None or not outside.any() else as_device(outside))


def _check(node, graph) -> str | None:
    if node.attrs.get("mode", "nearest") not in ("nearest", "linear", "cubic"):
        return f"Resize mode {node.attrs.get('mode')!r} is not defined by ONNX"
    return None


@lowering("Resize", since=11, static=(1, 2, 3), check=_check)
def resize(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None, coordinate_transformation_mode="half_pixel",
           cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch",
           mode="nearest", nearest_mode="round_prefer_floor"):
    axes, factors, out_sizes = geometry.output_geometry(_Shape(x.shape), _array(scales),
                                                         _array(sizes), axes, keep_aspect_ratio_policy)
    crop = coordinate_transformation_mode == "tf_crop_and_resize"
    roi = _array(roi)
    compute = x.dtype if x.is_floating_point() else torch.float64
    data = x if mode == "nearest" else x.to(compute)
    for k, (axis, scale, out_size) in enumerate(zip(axes, factors, out_sizes, strict=False)):
        in_size = data.shape[axis]
        roi_axis = (float(roi[k]), float(roi[k + len(axes)])) if crop else None
        if out_size == in_size and math.isclose(scale, 1.0) and (not crop or roi_axis == (0.0, 1.0)):
            continue
        index, weights, outside = _axis_plan(mode, coordinate_transformation_mode, out_size, in_size, scale,
                                             roi_axis, bool(antialias), cubic_coeff_a, bool(exclude_outside),
                                             nearest_mode, data.device)
        data = _resize_axis(data, axis, index, weights)
        if outside is not None:
            shape = [1] * data.dim()
            shape[axis] = -1
            data = torch.where(outside.reshape(shape), extrapolation_value, data)
    if data.dtype == x.dtype:
        return data
    if not x.is_floating_point():
        info = torch.iinfo(x.dtype)
        return torch.round(data).clamp(info.min, info.max).to(x.dtype)
    return data.to(x.dtype)


class _Shape:
    """What ``_output_geometry`` reads of its array argument: ``ndim`` and ``shape``."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.ndim = len(self.shape)


def _resize_axis(data, axis, index, weights):
    if weights is None:
        return data.index_select(axis, index[:, 0])
    shape = [1] * data.dim()
    shape[axis] = -1
    out = None
    for tap in range(index.shape[1]):
        term = data.index_select(axis, index[:, tap]) * weights[:, tap].to(data.dtype).reshape(shape)
        out = term if out is None else out + term
    return out


@lowering("Resize", since=10, static=(1,))
def resize_10(x, scales, *, mode="nearest"):
    return upsample_9(x, scales, mode=mode)


@lowering("Upsample", since=9, static=(1,))
def upsample_9(x, scales, *, mode="nearest"):
    """Upsample and Resize-10: asymmetric coordinates, nearest rounds down."""
    return resize(x, scales=[float(s) for s in np.asarray(_array(scales), dtype=np.float64).reshape(-1)],
                  mode=mode, coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@lowering("Upsample", since=7)
def upsample_7(x, *, mode="nearest", scales):
    return upsample_9(x, list(scales), mode=mode)
