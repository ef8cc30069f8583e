"""Shape and dtype inference: symbolic batch dims survive; shape subgraphs resolve."""

from __future__ import annotations

import numpy as np

import edgeinfer as ei
from devkit.testing import assert_close, parse_model
from edgeinfer.ir.infer import infer_types, static_shape
from edgeinfer.ir.onnx_io import graph_from_model


def test_symbolic_batch_survives_inference(mlp_model):
    graph = infer_types(graph_from_model(mlp_model))
    assert graph.values["h"].shape == ("N", 16)
    assert graph.values["a"].dtype == "float32"
    assert graph.values["y"].shape == ("N", 4)


def test_shape_subgraph_resolves_reshape_target():
    model = parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4, 6] x) => (float[N, 24] y)
        {
            s = Shape(x)
            zero = Constant<value = int64[1] {0}>()
            n = Gather(s, zero)
            minus = Constant<value = int64[1] {-1}>()
            target = Concat<axis = 0>(n, minus)
            y = Reshape(x, target)
        }""")
    graph = infer_types(graph_from_model(model))
    assert graph.values["y"].shape == ("N", 24)
    assert graph.values["target"].shape == (2,) and graph.values["target"].dtype == "int64"


def test_large_initializers_are_typed_without_copying_into_inference():
    rng = np.random.default_rng(0)
    from onnx import helper, numpy_helper

    w = rng.standard_normal((512, 256)).astype(np.float32)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    proto = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, ["B", 512])],
                              [helper.make_tensor_value_info("y", 1, ["B", 256])],
                              [numpy_helper.from_array(w, "w")])
    model = ei.convert(helper.make_model(proto, opset_imports=[helper.make_opsetid("", 17)]))
    assert model.graph.values["y"].shape == ("B", 256)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    out = ei.Session(model).run({"x": x})["y"]
    assert_close(out, x @ w, rtol=1e-4, atol=1e-4)  # 512-term fp32 sums: BLAS order differs


def test_static_shape_binds_symbols():
    assert static_shape(("N", 3, 224), {"N": 2}) == (2, 3, 224)
    assert static_shape(("N", 3), {}) is None
    assert static_shape(None) is None
