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
                 int_steps: int = 0, name: str = "output") -> None:
    """Raise AssertionError describing the worst mismatch if ``got`` differs from ``ref``."""
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
