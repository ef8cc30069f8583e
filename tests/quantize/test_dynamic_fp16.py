import numpy as np
import pytest
from helpers import ort_optimized_ops, reference_run, sqnr, weight_bytes

import edgeinfer as ei
from devkit import zoo
from devkit.testing import assert_close
from edgeinfer.model import Model
from edgeinfer.quantize import fp16_weights, quantize, quantize_dynamic


@pytest.fixture(scope="module")
def transformer():
    proto = zoo.transformer_encoder_block()
    return proto, ei.convert(proto, optimize=2)


def test_dynamic_quantization_fuses_into_onnxruntime_int8_matmuls(transformer):
    proto, model = transformer
    int8 = quantize_dynamic(model)
    int8.graph.verify()
    ops = ort_optimized_ops(int8.graph)
    assert ops["DynamicQuantizeMatMul"] + ops["MatMulIntegerToFloat"] == 6
    assert "MatMulInteger" not in ops
    assert weight_bytes(int8.graph) < 0.35 * weight_bytes(model.graph)


def test_dynamic_quantization_is_accurate_on_every_backend(transformer):
    proto, model = transformer
    int8 = quantize_dynamic(model)
    feeds = zoo.example_inputs(proto, seed=4)
    reference = ei.Session(model, backend="onnxruntime").run(feeds)["y"]
    spec = reference_run(int8.graph, feeds)["y"]
    assert sqnr(reference, spec) > 30
    assert_close(ei.Session(int8, backend="numpy").run(feeds)["y"], spec, rtol=1e-4, atol=1e-4)
    assert sqnr(spec, ei.Session(int8, backend="onnxruntime").run(feeds)["y"]) > 40


def test_dynamic_gemm_applies_trans_b_alpha_and_beta(rng):
    from edgeinfer.ir import Graph, Node, Value

    weight = rng.standard_normal((6, 5)).astype(np.float32)  # [N, K] with transB
    bias = rng.standard_normal(6).astype(np.float32)
    graph = Graph([Node("Gemm", ["x", "w", "b"], ["y"], {"transB": 1, "alpha": 0.5, "beta": 2.0}, name="fc")],
                  [Value("x", "float32", (3, 5))], [Value("y", "float32", (3, 6))], {"w": weight, "b": bias},
                  opset={"": 17})
    model = Model(graph)
    int8 = quantize_dynamic(model)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    expected = 0.5 * x @ weight.T + 2.0 * bias
    assert sqnr(expected, ei.Session(int8, backend="numpy").run({"x": x})["y"]) > 30
    assert sqnr(expected, ei.Session(int8, backend="onnxruntime").run({"x": x})["y"]) > 30


def test_fp16_weights_compute_exactly_like_fp32_with_rounded_weights():
    proto = zoo.cnn_residual_depthwise()
    model = ei.convert(proto, optimize=1)
    half = fp16_weights(model)
    rounded = {n: (a.astype(np.float16).astype(np.float32) if a.dtype == np.float32 and a.size >= 256 else a)
               for n, a in model.graph.initializers.items()}
    oracle = Model(model.graph.replace(initializers=rounded))
    feeds = zoo.example_inputs(proto, seed=2)
    expected = ei.Session(oracle, backend="onnxruntime").run(feeds)["logits"]
    for backend in ("onnxruntime", "numpy"):
        assert_close(ei.Session(half, backend=backend).run(feeds)["logits"], expected, rtol=1e-5, atol=1e-5)
    assert weight_bytes(half.graph) < 0.55 * weight_bytes(model.graph)
    assert quantize(model, weights="fp16").graph.op_histogram()["Cast"] == half.graph.op_histogram()["Cast"]


def test_fp16_leaves_quantization_scales_float32(rng):
    proto = zoo.cnn_residual_depthwise()
    model = ei.convert(proto, optimize=2)
    samples = [zoo.example_inputs(proto, seed=s)["input"] for s in range(3)]
    int8 = quantize(model, samples)
    half = fp16_weights(int8)
    for node in half.graph.nodes:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert half.graph.values[node.inputs[1]].const.dtype == np.float32
    feeds = zoo.example_inputs(proto, seed=3)
    assert_close(ei.Session(half, backend="numpy").run(feeds)["logits"],
                 ei.Session(int8, backend="numpy").run(feeds)["logits"])
