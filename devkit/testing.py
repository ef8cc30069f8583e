"""The one numeric oracle used by tests and the compare tools: ``assert_close``.

Tolerances are per dtype: fp32 rtol 1e-5 (plus a small atol for values near zero), fp16 and
bf16 looser, integers exact unless ``int_steps`` allows a number of quantization steps.
An override at a call site carries a comment saying why.
"""

from __future__ import annotations

import numpy as np

DEFAULT_TOLERANCES = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-5, 1e-6),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}


def assert_close(got, ref, *, rtol: float | None = None, atol: float | None = None,
                 int_steps: int = 0, name: str = "output", scaled_atol: float | None = None) -> None:
    """Raise AssertionError describing the worst mismatch if ``got`` differs from ``ref``.

    ``scaled_atol`` adds that fraction of ``ref``'s largest magnitude to ``atol``: two engines
    summing float32 products in different orders differ by a rounding of the sums' scale, which
    an element that cancels to near zero carries whole (how far depends on the kernels the CPU
    gets: on an AMD EPYC (Zen 5, AVX-512) numpy's OpenBLAS picks its Haswell kernels,
    ``np.show_runtime()``; other CPUs get other kernels, which sum in other orders)."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        raise AssertionError(f"{name}: shape {got.shape} != expected {ref.shape}")
    if ref.dtype == object or ref.dtype.kind in "USb":
        if not np.array_equal(got, ref):
            raise AssertionError(f"{name}: values differ from expected")
        return
    if ref.dtype.kind in "iu":
        diff = np.abs(got.astype(np.int64) - ref.astype(np.int64))
        worst = int(diff.max()) if diff.size else 0
        if worst > int_steps:
            index = np.unravel_index(int(diff.argmax()), diff.shape)
            raise AssertionError(f"{name}: integer mismatch of {worst} steps (allowed {int_steps}) at "
                                 f"{index}: got {got[index]}, expected {ref[index]}")
        return
    default_rtol, default_atol = DEFAULT_TOLERANCES.get(str(ref.dtype), DEFAULT_TOLERANCES["float32"])
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if scaled_atol is not None and ref.size:
        atol += scaled_atol * float(np.nanmax(np.abs(np.where(np.isfinite(ref), ref, 0))))
    with np.errstate(invalid="ignore"):  # inf - inf in the excess computation is masked below
        _assert_float_close(got.astype(np.float64), ref.astype(np.float64), rtol, atol, name)


def _assert_float_close(g: np.ndarray, r: np.ndarray, rtol: float, atol: float, name: str) -> None:
    nan_mismatch = np.isnan(g) != np.isnan(r)
    if nan_mismatch.any():
        raise AssertionError(f"{name}: NaN pattern differs at {int(nan_mismatch.sum())} positions")
    finite = ~np.isnan(r)
    excess = np.abs(g - r) - (atol + rtol * np.abs(r))
    excess = np.where(finite & ~(np.isinf(r) & (g == r)), excess, -1.0)
    if excess.size and excess.max() > 0:
        index = np.unravel_index(int(excess.argmax()), excess.shape)
        bad = int((excess > 0).sum())
        raise AssertionError(f"{name}: {bad}/{excess.size} elements beyond rtol={rtol} atol={atol}; worst at "
                             f"{index}: got {g[index]!r}, expected {r[index]!r} "
                             f"(max abs diff {np.nanmax(np.abs(g - r)):.3g})")


def parse_model(text: str):
    """Build a checked ``onnx.ModelProto`` from ``onnx.parser`` text (tests build graphs this way)."""
    import onnx
    from onnx import parser

    model = parser.parse_model(text)
    onnx.checker.check_model(model)
    return model


# -- exact integer arithmetic: the oracle for integer kernels (no engine's kernels involved) ----

def integer_matmul(a, b, a_zero_point=0, b_zero_point=0) -> np.ndarray:
    """ONNX ``MatMulInteger`` in int64: ``(a - a_zp) @ (b - b_zp)``, a per-row ``a_zp`` ([M] or
    [..., M, 1]) and a per-column ``b_zp`` ([N]) broadcast as the spec says."""
    a64 = np.asarray(a).astype(np.int64) - _column(a_zero_point, np.ndim(a))
    b64 = np.asarray(b).astype(np.int64) - np.asarray(b_zero_point).astype(np.int64)
    return np.matmul(a64, b64)


def _column(zero_point, ndim: int) -> np.ndarray:
    zp = np.asarray(zero_point).astype(np.int64)
    return zp.reshape(zp.shape + (1,)) if zp.ndim == 1 and ndim >= 2 and zp.size > 1 else zp


def integer_conv(x, w, x_zero_point=0, w_zero_point=0, *, group: int = 1, strides=None, pads=None,
                 dilations=None) -> np.ndarray:
    """ONNX ``ConvInteger`` in int64 (N-d, grouped, strided, dilated, explicit pads); ``w_zp``
    a scalar or one per output channel."""
    x64 = np.asarray(x).astype(np.int64) - np.asarray(x_zero_point).astype(np.int64)
    w64 = np.asarray(w).astype(np.int64)
    w_zp = np.asarray(w_zero_point).astype(np.int64)
    w64 = w64 - (w_zp.reshape((-1,) + (1,) * (w64.ndim - 1)) if w_zp.ndim else w_zp)
    spatial = x64.ndim - 2
    kernel = w64.shape[2:]
    strides = tuple(strides or (1,) * spatial)
    dilations = tuple(dilations or (1,) * spatial)
    pads = tuple(pads or (0,) * (2 * spatial))
    padded = np.pad(x64, [(0, 0), (0, 0)] + [(pads[i], pads[i + spatial]) for i in range(spatial)])
    out = [(padded.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(spatial)]
    n, channels = x64.shape[:2]
    m, per_group = w64.shape[:2]
    if channels != per_group * group:
        raise ValueError(f"integer_conv: x has {channels} channels, w expects {per_group} x {group} groups")
    y = np.zeros((n, m, *out), np.int64)
    for offset in np.ndindex(*kernel):
        window = tuple(slice(offset[i] * dilations[i], offset[i] * dilations[i] + strides[i] * (out[i] - 1) + 1,
                             strides[i]) for i in range(spatial))
        patch = padded[(slice(None), slice(None), *window)]  # [N, C, *out]
        for g in range(group):
            rows = slice(g * (m // group), (g + 1) * (m // group))
            taps = w64[(rows, slice(None), *offset)]  # [M/group, C/group]
            y[:, rows] += np.einsum("oc,nc...->no...", taps, patch[:, g * per_group:(g + 1) * per_group])
    return y


def requantize(accumulator, multiplier, zero_point, dtype) -> np.ndarray:
    """``saturate(round_half_even(accumulator * multiplier) + zero_point)`` in ``dtype``, the
    output step of QLinearConv/QLinearMatMul (``multiplier`` per output channel on axis 1 if
    it is a vector)."""
    acc = np.asarray(accumulator, np.float64)
    scale = np.asarray(multiplier, np.float64)
    if scale.ndim == 1 and acc.ndim > 1:
        scale = scale.reshape((1, -1) + (1,) * (acc.ndim - 2))
    info = np.iinfo(dtype)
    return np.clip(np.rint(acc * scale) + int(zero_point), info.min, info.max).astype(dtype)
