"""Shared checks for the quantization tests."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx

from edgeinfer.ir import Graph
from edgeinfer.ir.lowering import lower_graph
from edgeinfer.ir.onnx_io import graph_to_model


def ort_optimized_ops(graph: Graph) -> Counter:
    """Op types of the graph onnxruntime actually runs (after its QDQ fusions)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.log_severity_level = 3
    model = graph_to_model(lower_graph(graph))
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
    return Counter(node.op_type for node in optimized.graph.node)


def reference_run(graph: Graph, feeds: dict) -> dict:
    """onnx.reference's outputs for ``graph`` (the spec's own evaluator)."""
    from onnx.reference import ReferenceEvaluator

    model = graph_to_model(lower_graph(graph))
    for opset in model.opset_import:
        # onnx.reference implements QuantizeLinear/DequantizeLinear from opset 19; the ops in these
        # tests mean the same at 17 and 19, and integer Q/DQ gained nothing in between
        if opset.domain in ("", "ai.onnx") and opset.version < 19:
            opset.version = 19
    return dict(zip(graph.output_names, ReferenceEvaluator(model).run(None, feeds), strict=True))


def sqnr(reference: np.ndarray, got: np.ndarray) -> float:
    ref = reference.astype(np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - got) ** 2), 1e-30)))


def weight_bytes(graph: Graph) -> int:
    return sum(a.nbytes for a in graph.initializers.values())
