"""Per-layer error of a quantized model against its float original: SQNR and cosine.

For every quantized layer, the value its consumers see in the int8 model (the dequantized
output) is compared with the same tensor of the float model on the same inputs::

    SQNR = 10 log10( sum(ref^2) / sum((ref - q)^2) )   dB (higher is better; ~6 dB per bit)
    cosine = <ref, q> / (|ref| |q|)

``format_table`` renders the rows as text and ``plot`` writes a PNG (matplotlib, Agg).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass

import numpy as np

from edgeinfer.ir import Graph
from edgeinfer.quantize.calibrate import run_batches


@dataclass(frozen=True)
class LayerError:
    layer: str
    op_type: str
    tensor: str
    sqnr_db: float
    cosine: float


def sqnr_db(reference: np.ndarray, quantized: np.ndarray) -> float:
    ref = reference.astype(np.float64)
    noise = float(np.sum((ref - quantized.astype(np.float64)) ** 2))
    signal = float(np.sum(ref ** 2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(max(signal, 1e-30) / noise)


def observed_tensors(float_graph: Graph, quantized: Graph, layers: Iterable[str]) -> list[tuple[str, str, str, str]]:
    """(layer, op, tensor in the float graph, tensor in the quantized graph) per layer."""
    wanted = set(layers)
    found = []
    for node in quantized.nodes:
        name = node.name or node.outputs[0]
        if name not in wanted or node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        out = node.outputs[0]
        seen = out
        for consumer in quantized.consumers(out):
            if consumer.op_type == "QuantizeLinear":
                dq = quantized.consumers(consumer.outputs[0])
                if dq and dq[0].op_type == "DequantizeLinear":
                    seen = dq[0].outputs[0]
        reference = out if out in float_graph.values else seen
        if reference in float_graph.values:
            found.append((name, node.op_type, reference, seen))
    return found


def layer_errors(float_graph: Graph, quantized: Graph, layers: Iterable[str], feeds: Iterable[dict],
                 *, backend: str | None = None) -> list[LayerError]:
    """SQNR and cosine of every quantized layer's output over ``feeds`` (graph order)."""
    observed = observed_tensors(float_graph, quantized, layers)
    feeds = list(feeds)
    sums = {layer: np.zeros(4) for layer, *_ in observed}  # signal, noise, dot, |q|^2
    with closing(run_batches(float_graph, [o[2] for o in observed], feeds, backend=backend)) as refs, \
            closing(run_batches(quantized, [o[3] for o in observed], feeds, backend=backend)) as gots:
        for ref_values, got_values in zip(refs, gots, strict=True):
            for layer, _, ref_name, got_name in observed:
                ref = ref_values[ref_name].astype(np.float64).reshape(-1)
                got = got_values[got_name].astype(np.float64).reshape(-1)
                sums[layer] += (ref @ ref, (ref - got) @ (ref - got), ref @ got, got @ got)
    rows = []
    for layer, op, ref_name, _ in observed:
        signal, noise, dot, power = sums[layer]
        sqnr = math.inf if noise == 0 else 10.0 * math.log10(max(signal, 1e-30) / noise)
        cosine = dot / math.sqrt(signal * power) if signal > 0 and power > 0 else float(signal == power)
        rows.append(LayerError(layer, op, ref_name, sqnr, cosine))
    return rows


def format_table(rows: Iterable[LayerError], title: str = "per-layer error vs fp32") -> str:
    rows = list(rows)
    width = max([len(r.layer) for r in rows] + [5])
    lines = [title, f"{'layer':<{width}}  {'op':<18} {'SQNR dB':>8} {'cosine':>9}"]
    for r in rows:
        sqnr = "inf" if math.isinf(r.sqnr_db) else f"{r.sqnr_db:8.2f}"
        lines.append(f"{r.layer:<{width}}  {r.op_type:<18} {sqnr:>8} {r.cosine:9.5f}")
    return "\n".join(lines)


def plot(rows: Iterable[LayerError], path: str | os.PathLike, title: str = "INT8 error per layer") -> None:
    """A PNG: SQNR per layer (bars, left axis) and cosine similarity (line, right axis)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows = list(rows)
    positions = np.arange(len(rows))
    sqnr = [min(r.sqnr_db, 99.0) for r in rows]
    figure, left = pyplot.subplots(figsize=(max(6.0, 0.28 * len(rows) + 2), 4.5))
    left.bar(positions, sqnr, color="#4c72b0", label="SQNR (dB)")
    left.set_ylabel("SQNR vs fp32 (dB)")
    left.set_xticks(positions)
    left.set_xticklabels([r.layer for r in rows], rotation=90, fontsize=7)
    right = left.twinx()
    right.plot(positions, [r.cosine for r in rows], color="#dd8452", marker="o", markersize=3, label="cosine")
    right.set_ylabel("cosine similarity")
    left.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
