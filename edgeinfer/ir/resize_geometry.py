"""The sampling geometry of ONNX Resize, shared by every backend that lowers it itself (the
numpy reference's kernel, the torch lowering): output sizes from scales or sizes, the input
coordinate of every output position per ``coordinate_transformation_mode``, and each output
position's taps (input indices clamped to the edge, and weights). Engine-independent numpy on
small per-axis arrays; see the numpy kernel's docstring for the modes."""

from __future__ import annotations

import math

import numpy as np


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"Resize: expected axes in [{-rank}, {rank - 1}] for a rank-{rank} input, found {axis}")
    return axis % rank


NEAREST_ROUNDING = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}
MODES = ("nearest", "linear", "cubic")


def source_coords(mode: str, out_size: int, in_size: int, scale: float, roi_axis) -> np.ndarray:
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


def cubic_kernel(distance: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def taps(coords: np.ndarray, in_size: int, scale: float, mode: str, antialias: bool, cubic_a: float,
          exclude_outside: bool, nearest_mode: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(indices [out, taps], weights [out, taps] or None for nearest)."""
    if mode == "nearest":
        rounding = NEAREST_ROUNDING.get(nearest_mode)
        if rounding is None:
            raise ValueError(f"Resize: expected nearest_mode in {sorted(NEAREST_ROUNDING)}, found {nearest_mode!r}")
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
        weights = cubic_kernel(distance, cubic_a)
    if exclude_outside:
        weights = np.where((index < 0) | (index >= in_size), 0.0, weights)
    if antialias or exclude_outside:
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(index, 0, in_size - 1).astype(np.intp), weights


def output_geometry(x, scales, sizes, axes, policy):
    rank = x.ndim
    axes = list(range(rank)) if axes is None else [_axis(a, rank) for a in axes]
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
