"""7-bit weights (``reduce_range=True``): exact on onnxruntime's fast u8 x s8 kernels on every
CPU, so the backend leaves them as they are; and the exact path's rewrite keeps the integer
kernels onnxruntime fuses."""

import numpy as np
import pytest
from helpers import ort_optimized_ops, sqnr

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.ir.lowering import lower_graph
from edgeinfer.model import Model
from edgeinfer.quantize import quantize

int8 = pytest.importorskip("edgeinfer.backends.onnxruntime.int8")


@pytest.fixture(scope="module")
def cnn():
    proto = zoo.cnn_residual_depthwise()
    samples = [zoo.example_inputs(proto, seed=seed)["input"] for seed in range(1, 9)]
    return proto, ei.convert(proto, optimize=2), samples


def _int8_weights(model: Model) -> list[np.ndarray]:
    return [a for a in model.graph.initializers.values() if a.dtype == np.int8 and a.size > 1]


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_reduce_range_stores_7_bit_weights(cnn, mode):
    _, fused, samples = cnn
    data = samples if mode == "static" else None
    full = quantize(fused, data, method="minmax", mode=mode)
    seven = quantize(fused, data, method="minmax", mode=mode, reduce_range=True)
    assert max(int(np.abs(w).max()) for w in _int8_weights(full)) == 127
    weights = _int8_weights(seven)
    assert weights and max(int(np.abs(w.astype(np.int16)).max()) for w in weights) == 63
    assert "7-bit" in seven.metadata["quantization"]
    graph = lower_graph(seven.graph)
    assert int8.exact_weights(graph)[1] == []  # nothing to rewrite: no CPU can saturate them
    expected = int8.SEVEN_BIT if int8.saturates() else int8.integer_path()
    assert int8.graph_integer_path(graph) == expected


def test_reduce_range_costs_little_accuracy_and_runs_alike_everywhere(cnn):
    proto, fused, samples = cnn
    seven = quantize(fused, samples, method="minmax", reduce_range=True)
    feeds = zoo.example_inputs(proto, seed=42)
    reference = ei.Session(fused, backend="onnxruntime").run(feeds)["logits"]
    numpy_out = ei.Session(seven, backend="numpy").run(feeds)["logits"]
    ort_out = ei.Session(seven, backend="onnxruntime").run(feeds)["logits"]
    assert sqnr(reference, numpy_out) > 20
    assert sqnr(numpy_out, ort_out) > 30  # onnxruntime requantizes in float32: a step here and there


def test_exact_path_keeps_onnxruntimes_integer_kernels(cnn):
    """The uint8 weights of the exact path fuse into the same integer kernels as int8 ones."""
    _, fused, samples = cnn
    model = quantize(fused, samples, method="minmax")
    graph = lower_graph(model.graph)
    rewritten, labels = int8.exact_weights(graph)
    assert len(labels) == sum(1 for n in graph.nodes if n.op_type == "DequantizeLinear"
                              and graph.values[n.inputs[0]].dtype == "int8")
    before, after = ort_optimized_ops(graph), ort_optimized_ops(rewritten)
    assert after["QLinearConv"] == before["QLinearConv"] == 5
    assert "Conv" not in after and "DequantizeLinear" not in after
    feeds = {"input": samples[0]}
    assert_close(ei.Session(Model(rewritten), backend="numpy").run(feeds)["logits"],
                 ei.Session(model, backend="numpy").run(feeds)["logits"])
