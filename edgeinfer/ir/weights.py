"""Reduced-precision weight storage: a property of the stored weight, not graph nodes.

A weight that its source file stores in float16 (a TFLite ``DEQUANTIZE`` of a float16
constant, an fp16-weight model) is held in the IR as an ordinary float32 initializer, so every
pass, kernel and the quantizer see a constant weight; the graph's metadata lists it under
``STORAGE_KEY`` (``{"float16": [names]}``). Whoever stores or hands the weight on asks
``stored_weight_dtype``:

- the ``.eim`` file keeps it as float16 bytes and widens it on load (``storage_array``,
  ``widen_stored``);
- the TFLite exporter writes it as a float16 buffer behind ``DEQUANTIZE``, as the original
  file had it (XNNPACK unpacks it once, at delegate creation);
- onnxruntime, OpenVINO and numpy get the float32 initializer: no ``Cast`` runs per request.

The float32 values are exactly the float16 ones widened, so storing them narrow loses
nothing; ``storage_array`` checks that (a pass that rewrote a weight in place under the same
name makes it float32 again).

A weight rounded to int8 with one symmetric scale per output channel (the weights of a layer
that mixed precision keeps float: float compute, int8 bytes) is listed under ``"int8"`` with its
channel axis (``{"int8": {name: axis}}``, axis -1 for one scale). Its float32 values are exactly
``q * scale`` (``int8_rounded`` makes them so); the ``.eim`` file stores ``q`` and ``scale`` and
multiplies on load (``int8_factors``, a product entry of ``eim.py``), every backend gets the
float32 initializer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import numpy as np

STORAGE_KEY = "weight_storage"
NARROW_DTYPES = {"float16": np.float16}
INT8_KEY = "int8"  # under STORAGE_KEY: {name: channel axis} of float32 weights that are int8 x scale
INT8_LIMIT = 127  # symmetric: -127..127


def _json_object(metadata: Mapping[str, str], key: str) -> dict:
    """The JSON object under ``key`` of a graph's metadata ({} if absent or malformed)."""
    text = metadata.get(key)
    if not text:
        return {}
    try:
        table = json.loads(text)
    except ValueError:
        return {}
    return table if isinstance(table, dict) else {}


def stored_weights(metadata: Mapping[str, str]) -> dict[str, str]:
    """``{initializer name: stored dtype}`` declared in a graph's metadata."""
    table = _json_object(metadata, STORAGE_KEY)
    return {name: dtype for dtype, names in table.items() if dtype in NARROW_DTYPES and isinstance(names, list)
            for name in names if isinstance(name, str)}


def stored_weight_dtype(graph, name: str) -> str | None:
    """The dtype a float32 initializer ``name`` of ``graph`` is stored in (``"float16"``), or
    None for a weight stored at full precision (or a name that is no initializer)."""
    value = graph.values.get(name)
    if value is None or value.const is None or value.const.dtype != np.float32:
        return None
    return stored_weights(graph.metadata).get(name)


def int8_stored_weights(metadata: Mapping[str, str]) -> dict[str, int]:
    """``{initializer name: channel axis}`` of the weights declared int8-stored (axis -1: one scale)."""
    table = _json_object(metadata, STORAGE_KEY).get(INT8_KEY)
    if not isinstance(table, dict):
        return {}
    return {name: axis for name, axis in table.items()
            if isinstance(name, str) and isinstance(axis, int) and not isinstance(axis, bool) and axis >= -1}


def with_int8_stored_weights(metadata: Mapping[str, str], axes: Mapping[str, int]) -> dict[str, str]:
    """``metadata`` with ``axes`` (name -> channel axis) added to the int8-stored weights."""
    return _with_storage_table(metadata, _narrow_lists(metadata), {**int8_stored_weights(metadata), **axes})


def _narrow_lists(metadata: Mapping[str, str]) -> dict[str, list[str]]:
    """The declared narrow-stored weights as ``{dtype: [names]}``."""
    table: dict[str, list[str]] = {}
    for name, kind in stored_weights(metadata).items():
        table.setdefault(kind, []).append(name)
    return table


FLOAT16_NORMAL = (2.0 ** -14, 65504.0)  # float16's normal range: 11 significant bits throughout


def float16_grid_scale(scale: np.ndarray) -> np.ndarray:
    """Positive float32 ``scale`` rounded up onto the float16 grid where float16 holds it as a
    normal number (a relative increase under 2**-11: a step 0.05% coarser at most), unchanged
    elsewhere. Such a scale takes 2 bytes in the ``.eim`` file (narrow storage, version 3.2),
    and ``127 * scale`` is exact in float32. Rounding up keeps every value within the grid's range."""
    scale = np.asarray(scale, np.float32)
    with np.errstate(over="ignore"):
        half = scale.astype(np.float16)
    below = half.astype(np.float32) < scale
    half = np.where(below, np.nextafter(half, np.float16(np.inf)), half).astype(np.float32)
    inside = (scale >= FLOAT16_NORMAL[0]) & (half <= FLOAT16_NORMAL[1])
    return np.where(inside, half, scale).astype(np.float32)


def _int8_scale(array: np.ndarray, axis: int) -> np.ndarray:
    """One float32 scale per slice along ``axis`` (all of ``array`` for -1), shaped to broadcast."""
    magnitude = np.abs(array)
    if axis < 0:
        peak = magnitude.max(initial=0.0).reshape((1,) * array.ndim)
    else:
        peak = magnitude.max(axis=tuple(i for i in range(array.ndim) if i != axis), keepdims=True, initial=0.0)
    return np.divide(peak, np.float32(INT8_LIMIT), dtype=np.float32)


def _int8_values(array: np.ndarray, scale: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale > 0, np.rint(array / np.where(scale > 0, scale, 1)), 0)
    return np.clip(q, -INT8_LIMIT, INT8_LIMIT).astype(np.int8)


def int8_factors(array: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(q, scale)``, int8 and float32 (broadcasting to ``array``), with
    ``np.multiply(q, scale, dtype=float32)`` equal to ``array`` bit for bit; None when ``array``
    is not so (not float32, not finite, a float weight never rounded, or ``axis`` out of range)."""
    if array.dtype != np.float32 or array.ndim == 0 or axis >= array.ndim or not np.all(np.isfinite(array)):
        return None
    scale = _int8_scale(array, axis)
    q = _int8_values(array, scale)
    with np.errstate(all="ignore"):
        product = np.multiply(q, scale, dtype=np.float32)
    if not np.array_equal(product.view(np.uint32), np.ascontiguousarray(array).view(np.uint32)):
        return None
    return q, scale


def int8_rounded(array: np.ndarray, axis: int) -> np.ndarray:
    """``array`` rounded to int8 with one symmetric scale per slice along ``axis`` (-1: one
    scale) on the float16 grid (``float16_grid_scale``), as the float32 values ``q * scale`` that
    ``int8_factors`` recovers exactly (the scale of the rounded values is computed again until it
    no longer moves: one ulp at most, for a scale outside float16's normal range)."""
    current = np.asarray(array, np.float32)
    if not np.all(np.isfinite(current)):
        raise ValueError("int8_rounded: the weight holds NaN or infinity")
    for _ in range(8):
        scale = float16_grid_scale(_int8_scale(current, axis))
        with np.errstate(all="ignore"):
            rounded = np.multiply(_int8_values(current, scale), scale, dtype=np.float32)
        if int8_factors(rounded, axis) is not None:
            return rounded
        current = rounded
    return rounded  # never seen: the weight is then stored at full precision (storage checks)


def with_stored_weights(metadata: Mapping[str, str], names: Iterable[str], dtype: str = "float16") -> dict[str, str]:
    """``metadata`` with ``names`` added to the weights stored as ``dtype``."""
    if dtype not in NARROW_DTYPES:
        raise ValueError(f"stored weight dtype {dtype!r}: expected one of {sorted(NARROW_DTYPES)}")
    table = _narrow_lists(metadata)
    table.setdefault(dtype, []).extend(names)
    return _with_storage_table(metadata, table, int8_stored_weights(metadata))


def with_live_stored_weights(metadata: Mapping[str, str], present: Mapping[str, object]) -> dict[str, str]:
    """``metadata`` whose weight-storage list names only weights in ``present`` (the graph's
    initializers): a weight replaced (an int8 one now) is no longer listed."""
    declared, int8 = stored_weights(metadata), int8_stored_weights(metadata)
    if not declared and not int8:
        return dict(metadata)
    table: dict[str, list[str]] = {}
    for name, kind in declared.items():
        if name in present:
            table.setdefault(kind, []).append(name)
    return _with_storage_table(metadata, table, {name: axis for name, axis in int8.items() if name in present})


def _with_storage_table(metadata: Mapping[str, str], table: Mapping[str, list[str]],
                        int8: Mapping[str, int]) -> dict[str, str]:
    """``metadata`` with its weight-storage list set to ``table`` (dtype -> names) and ``int8``
    (name -> axis); the key is removed when no name is left."""
    out = {k: v for k, v in metadata.items() if k != STORAGE_KEY}
    stored: dict[str, object] = {k: sorted(set(v)) for k, v in table.items() if v}
    if int8:
        stored[INT8_KEY] = dict(sorted(int8.items()))
    if stored:
        out[STORAGE_KEY] = json.dumps(stored, sort_keys=True)
    return out


def storage_array(array: np.ndarray, dtype: str | None) -> np.ndarray:
    """The array to store for a weight declared ``dtype``: its narrow form when that is exact,
    else ``array`` itself."""
    if dtype is None or array.dtype != np.float32:
        return array
    narrow = array.astype(NARROW_DTYPES[dtype])
    return narrow if np.array_equal(narrow.astype(np.float32), array) else array


def widen_stored(initializers: dict[str, np.ndarray], metadata: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Loaded initializers with the narrow-stored weights widened back to float32 (in place)."""
    for name, dtype in stored_weights(metadata).items():
        array = initializers.get(name)
        if array is not None and array.dtype == NARROW_DTYPES[dtype]:
            initializers[name] = array.astype(np.float32)
    return initializers


# -- derived weights ---------------------------------------------------------------------------
# A float32 weight that is exactly the element-wise product of two others (a quantized bias's
# scale, ``x_scale * w_scale``) is declared under ``PRODUCTS_KEY`` (``{name: [a, b]}``); the
# ``.eim`` file (version 3) then stores the operands' references instead of its bytes and
# multiplies on load, after checking at save time that the product gives the same bits.
PRODUCTS_KEY = "weight_products"


def weight_products(metadata: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """``{initializer name: (operand, operand)}`` declared in a graph's metadata."""
    table = _json_object(metadata, PRODUCTS_KEY)
    return {name: (pair[0], pair[1]) for name, pair in table.items()
            if isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)}


def with_weight_products(metadata: Mapping[str, str], products: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """``metadata`` declaring ``products`` (replacing any declared before); none: the key removed."""
    out = {k: v for k, v in metadata.items() if k != PRODUCTS_KEY}
    if products:
        out[PRODUCTS_KEY] = json.dumps({name: list(pair) for name, pair in products.items()}, sort_keys=True,
                                       separators=(",", ":"))
    return out
