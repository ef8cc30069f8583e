"""GPTQ weight rounding (Frantar et al. 2023, "GPTQ: Accurate Post-Training Quantization for
Generative Pre-trained Transformers"; the Optimal Brain Quantization update of Frantar & Alistarh
2022): each layer's weights are rounded to int8 one input column at a time, and the rounding
error of a column is spread over the columns not yet rounded through the inverse Hessian
``H = X X^T`` of the layer's inputs on calibration samples, so that the layer's *output* error
is minimized rather than each weight's own error. The grid is unchanged: one symmetric scale per
output channel, ``max |W| / 127`` (the row's largest weight keeps its extreme code), so the
result is exactly ``q * scale`` with int8 ``q``. The QDQ quantizer and the int8 weight storage
(``edgeinfer.ir.weights.int8_factors``) recover those codes as they are.

Measured by ``benchmarks/bench_int8_real.py --variants gptq mixed mixed_nearest``. The Hessians come from
the float model's own activations (not a sequentially quantized one's); columns are taken in
order (GPTQ's ``--act-order`` off).

Layers handled: Conv with a 1-D or 2-D kernel (groups included: one Hessian per group), Gemm and
MatMul with a constant 2-D weight. Others (ConvTranspose, 3-D kernels) keep nearest rounding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import closing

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.ir.graph import Graph, Node
from edgeinfer.ir.weights import INT8_LIMIT, float16_grid_scale

DAMPING = 0.01  # of the Hessian's mean diagonal, added to its diagonal (GPTQ's percdamp)


def _layout(node: Node, graph: Graph) -> str | None:
    """How ``node``'s constant weight (input 1) is laid out for GPTQ, or None if it is not handled:
    the weighted layers of ``static._weight_axis`` with a float32 2-D matrix or 1-D/2-D kernel."""
    from edgeinfer.quantize.static import _weight_axis

    axis = _weight_axis(node, graph)
    if axis is None or graph.values[node.inputs[1]].const.dtype != np.float32:
        return None
    rank = graph.values[node.inputs[1]].const.ndim
    if node.op_type == "Conv":
        return "conv" if rank in (3, 4) else None
    if rank != 2 or node.op_type not in ("Gemm", "MatMul") or int(node.attrs.get("transA", 0)):
        return None
    return "gemm_t" if axis == 0 else "matmul"


def _conv_columns(x: np.ndarray, node: Node, kernel: tuple[int, ...], groups: int) -> np.ndarray:
    """im2col of ``x`` (N, C, *spatial) for ``node``'s kernel: (groups, C/groups * prod(kernel), N * L)."""
    spatial = len(kernel)
    if spatial == 1:  # a 1-D convolution as a 2-D one of height 1
        x, kernel = x[:, :, None, :], (1, *kernel)
    pads = list(node.attrs.get("pads", [0] * (2 * spatial)))
    strides = list(node.attrs.get("strides", [1] * spatial))
    dilations = list(node.attrs.get("dilations", [1] * spatial))
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if spatial == 1:
        pads, strides, dilations = [0, pads[0], 0, pads[1]], [1, *strides], [1, *dilations]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * 4
        for axis in range(2):
            size = x.shape[2 + axis]
            out = -(-size // strides[axis])
            total = max(0, (out - 1) * strides[axis] + (kernel[axis] - 1) * dilations[axis] + 1 - size)
            low = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pads[axis], pads[axis + 2] = low, total - low
    elif auto_pad == "VALID":
        pads = [0] * 4
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    spans = [(kernel[a] - 1) * dilations[a] + 1 for a in range(2)]
    windows = np.lib.stride_tricks.sliding_window_view(x, spans, axis=(2, 3))
    windows = windows[:, :, ::strides[0], ::strides[1], ::dilations[0], ::dilations[1]]
    batch, channels, rows, cols = windows.shape[:4]
    # (N, C, Ho, Wo, kh, kw) -> (groups, C/groups * kh * kw, N * Ho * Wo)
    windows = windows.reshape(batch, groups, channels // groups, rows * cols, kernel[0] * kernel[1])
    return windows.transpose(1, 2, 4, 0, 3).reshape(groups, (channels // groups) * kernel[0] * kernel[1], -1)


def _accumulate(hessian: np.ndarray | None, columns: np.ndarray) -> np.ndarray:
    columns = columns.astype(np.float64)
    update = np.matmul(columns, columns.transpose(0, 2, 1))
    return update if hessian is None else hessian + update


def _rows(weight: np.ndarray, layout: str, groups: int) -> np.ndarray:
    """The weight as (groups, output channels per group, inputs per channel)."""
    if layout == "conv":
        return weight.reshape(groups, weight.shape[0] // groups, -1)
    if layout == "gemm_t":
        return weight[None]
    return weight.T[None]  # MatMul / Gemm without transB: (K, N) -> rows are output columns


def _unrows(rows: np.ndarray, weight: np.ndarray, layout: str) -> np.ndarray:
    if layout == "conv":
        return rows.reshape(weight.shape)
    return rows[0] if layout == "gemm_t" else rows[0].T


def gptq_rows(rows: np.ndarray, hessian: np.ndarray, *, limit: int = INT8_LIMIT,
              damping: float = DAMPING) -> np.ndarray:
    """``rows`` (G, R, K) rounded to ``limit`` levels per row by GPTQ with ``hessian`` (G, K, K):
    float32 ``q * scale`` (integer ``q``, float32 scale ``max |row| / limit`` per row, rounded up
    onto the float16 grid as ``int8_rounded``'s)."""
    weights = rows.astype(np.float64).copy()
    groups, count, width = weights.shape
    peak = np.abs(rows.astype(np.float32)).max(axis=2)
    scale32 = float16_grid_scale(np.divide(peak, np.float32(limit), dtype=np.float32))  # as int8_rounded's
    scale = np.where(scale32 > 0, scale32, 1).astype(np.float64)
    keep = np.argmax(np.abs(weights), axis=2)  # each row's largest weight keeps its extreme code
    extreme = np.sign(np.take_along_axis(weights, keep[..., None], axis=2)[..., 0]) * limit
    diagonal = np.arange(width)
    hessian = hessian.astype(np.float64).copy()
    dead = hessian[:, diagonal, diagonal] <= 0  # inputs always zero on the samples: rounded to nearest
    hessian[:, diagonal, diagonal] += damping * np.maximum(hessian[:, diagonal, diagonal].mean(axis=1, keepdims=True),
                                                           1e-12) + dead
    try:
        upper = np.linalg.cholesky(np.linalg.inv(hessian)).transpose(0, 2, 1)
    except np.linalg.LinAlgError:  # not positive definite even damped: nearest rounding
        return _product(np.clip(np.rint(weights / scale[..., None]), -limit, limit), scale32)
    codes = np.empty_like(weights)
    for column in range(width):
        values = weights[:, :, column]
        q = np.clip(np.rint(values / scale), -limit, limit)
        q = np.where(keep == column, extreme, q)
        codes[:, :, column] = q
        error = (values - q * scale) / upper[:, column, column][:, None]
        weights[:, :, column + 1:] -= error[:, :, None] * upper[:, None, column, column + 1:]
    return _product(codes, scale32)


def _product(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return np.multiply(codes.astype(np.int8), scale[..., None], dtype=np.float32)


def gptq_weights(graph: Graph, feeds: Sequence[dict[str, np.ndarray]], layers: Iterable[str], *,
                 backend: str | None = None, limit: int = INT8_LIMIT, damping: float = DAMPING) -> tuple[Graph, list[str]]:
    """``graph`` with the constant weights of the handled layers among ``layers`` (node names or
    first outputs, as ``layer_name``) rounded by GPTQ on ``feeds``; and the names of those weights.
    A weight read by anything but input 1 of handled nodes of one layout is left as it is."""
    from edgeinfer.quantize.calibrate import run_batches
    from edgeinfer.quantize.static import layer_name

    if not feeds:
        raise InputError("GPTQ weight rounding needs calibration samples: expected at least one feed, found none")
    wanted = frozenset(layers)
    chosen: dict[str, tuple[Node, str]] = {}
    for node in graph.nodes:
        layout = _layout(node, graph) if layer_name(node) in wanted else None
        weight = graph.values[node.inputs[1]] if layout else None
        if weight is None or len(weight.uses) != 1 or not np.all(np.isfinite(weight.const)):
            continue
        chosen[weight.name] = (node, layout)
    if not chosen:
        return graph, []
    hessians: dict[str, np.ndarray] = {}
    inputs = sorted({node.inputs[0] for node, _ in chosen.values()})
    with closing(run_batches(graph, inputs, feeds, backend=backend)) as batches:
        for observed in batches:
            for name, (node, layout) in chosen.items():
                x = np.asarray(observed[node.inputs[0]], np.float32)
                if layout == "conv":
                    weight = graph.values[name].const
                    columns = _conv_columns(x, node, tuple(weight.shape[2:]), int(node.attrs.get("group", 1)))
                else:
                    columns = x.reshape(-1, x.shape[-1]).T[None]
                hessians[name] = _accumulate(hessians.get(name), columns)
    inits = graph.initializers
    for name, (node, layout) in chosen.items():
        weight = inits[name]
        groups = int(node.attrs.get("group", 1)) if layout == "conv" else 1
        rounded = gptq_rows(_rows(weight, layout, groups), hessians[name], limit=limit, damping=damping)
        inits[name] = np.ascontiguousarray(_unrows(rounded, weight, layout))
    return graph.replace(list(graph.nodes), initializers=inits), sorted(chosen)


GPTQ_SAMPLES = 32  # calibration samples the Hessians are measured on (at most)


def with_gptq_weights(calibration, feeds: Sequence[dict[str, np.ndarray]], *, backend: str | None = None,
                      reduce_range: bool = False):
    """``calibration`` (a ``static.Calibration``) whose quantization takes every
    Conv/Gemm/MatMul weight GPTQ can round from its graph rounded by GPTQ on ``feeds`` (on the
    same int8 grid: 7-bit with ``reduce_range``); its float graph stays the reference."""
    from dataclasses import replace

    from edgeinfer.quantize.static import weighted_layers

    limit = 63 if reduce_range else INT8_LIMIT
    rounded, names = gptq_weights(calibration.graph, feeds, weighted_layers(calibration.graph),
                                  backend=backend, limit=limit)
    return replace(calibration, rounded_graph=rounded,
                   weight_rounding={"method": "gptq", "weights": len(names), "samples": len(feeds),
                                    "damping": DAMPING})
