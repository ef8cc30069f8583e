"""Every edgeinfer-domain op: its lowering to standard ops computes what its numpy kernel
computes, and its type rule (derived from the lowering) gives the right output type."""

import numpy as np
import pytest
from passcheck import random_feeds, run

from devkit.testing import assert_close
from edgeinfer.errors import UnsupportedOpError
from edgeinfer.ir import EDGEINFER_DOMAIN, Graph, Node, Value
from edgeinfer.ir.infer import infer_types
from edgeinfer.ir.lowering import ACTIVATIONS, lower_graph

PARAMS = {"Clip": (-0.5, 0.75), "LeakyRelu": (0.1,), "HardSigmoid": (0.3, 0.45)}


def one_node(node: Node, inputs: list[Value], inits: dict, out: Value, opset: int = 17) -> Graph:
    return Graph([node], inputs, [out], inits, opset={"": opset, EDGEINFER_DOMAIN: 1})


def check_lowering(graph: Graph, expected_shape: tuple) -> None:
    untyped = Graph(graph.nodes, graph.inputs, [Value(v.name) for v in graph.outputs], graph.initializers,
                    opset=graph.opset)
    infer_types(untyped)
    assert untyped.outputs[0].shape == expected_shape and untyped.outputs[0].dtype == "float32"
    lowered = lower_graph(graph)
    assert all(not n.domain for n in lowered.nodes)
    lowered.verify()
    feeds = random_feeds(graph)
    reference = run(graph, feeds)
    for backend in ("numpy", "onnxruntime"):
        target = lowered if backend == "numpy" else graph
        assert_close(run(target, feeds, backend)["y"], reference["y"], name=f"y lowered on {backend}")


@pytest.mark.parametrize("opset", [13, 20])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_fused_conv(rng, activation, opset):
    attrs = {"activation": activation, "pads": (1, 1, 1, 1), "strides": (2, 2)}
    if PARAMS.get(activation):
        attrs["activation_params"] = PARAMS[activation]
    node = Node("FusedConv", ["x", "w", "b"], ["y"], attrs, domain=EDGEINFER_DOMAIN)
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
    graph = one_node(node, [Value("x", "float32", (2, 3, 7, 7))], inits, Value("y", "float32", (2, 4, 4, 4)), opset)
    check_lowering(graph, (2, 4, 4, 4))


def test_fused_gemm_and_matmul(rng):
    node = Node("FusedGemm", ["a", "w", "c"], ["y"], {"transB": 1, "activation": "Relu"}, domain=EDGEINFER_DOMAIN)
    inits = {"w": rng.standard_normal((5, 6)).astype(np.float32), "c": rng.standard_normal(5).astype(np.float32)}
    check_lowering(one_node(node, [Value("a", "float32", ("N", 6))], inits, Value("y", "float32", ("N", 5))), ("N", 5))
    node = Node("FusedMatMul", ["a", "w", "c"], ["y"], {"activation": "Silu"}, domain=EDGEINFER_DOMAIN)
    inits = {"w": rng.standard_normal((6, 5)).astype(np.float32), "c": rng.standard_normal(5).astype(np.float32)}
    check_lowering(one_node(node, [Value("a", "float32", (2, 3, 6))], inits, Value("y", "float32", (2, 3, 5))),
                   (2, 3, 5))


@pytest.mark.parametrize("opset", [13, 18])
def test_layer_norm_and_gelu(rng, opset):
    node = Node("LayerNormalization", ["x", "s", "b"], ["y"], {"axis": -2, "epsilon": 1e-3}, domain=EDGEINFER_DOMAIN)
    inits = {"s": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
    check_lowering(one_node(node, [Value("x", "float32", (2, 3, 4))], inits, Value("y", "float32", (2, 3, 4)), opset),
                   (2, 3, 4))
    for approximate in ("none", "tanh"):
        node = Node("Gelu", ["x"], ["y"], {"approximate": approximate}, domain=EDGEINFER_DOMAIN)
        check_lowering(one_node(node, [Value("x", "float32", (2, 9))], {}, Value("y", "float32", (2, 9)), opset), (2, 9))


def test_attention(rng):
    node = Node("Attention", ["q", "k", "v", "m"], ["y"], {"num_heads": 2, "scale": 0.3}, domain=EDGEINFER_DOMAIN)
    inputs = [Value("q", "float32", ("N", 5, 8)), Value("k", "float32", ("N", 6, 8)),
              Value("v", "float32", ("N", 6, 6)), Value("m", "float32", ("N", 1, 1, 6))]
    check_lowering(one_node(node, inputs, {}, Value("y", "float32", ("N", 5, 6))), ("N", 5, 6))


def test_unknown_edgeinfer_op_has_no_lowering():
    node = Node("NoSuchOp", ["x"], ["y"], domain=EDGEINFER_DOMAIN)
    graph = one_node(node, [Value("x", "float32", (2,))], {}, Value("y", "float32", (2,)))
    with pytest.raises(UnsupportedOpError, match="NoSuchOp"):
        lower_graph(graph)


def test_half_precision_attention_lowers_to_a_graph_onnxruntime_runs():
    """The scale constant takes the scores' type (a float32 scale beside fp16 scores would be an
    invalid Mul); onnxruntime's result matches the numpy kernel within fp16 rounding."""
    from edgeinfer.backend import CompileOptions, get_backend

    graph = infer_types(one_node(
        Node("Attention", ["q", "k", "v"], ["y"], {"num_heads": 2, "scale": 0.25}, domain=EDGEINFER_DOMAIN),
        [Value(n, "float16", (1, 4, 8)) for n in "qkv"], {}, Value("y", "float16", (1, 4, 8))))
    lower_graph(graph).verify()
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((1, 4, 8)).astype(np.float16) for n in "qkv"}
    reference = get_backend("numpy").compile(graph, CompileOptions()).run(feeds)["y"]
    got = get_backend("onnxruntime").compile(graph, CompileOptions()).run(feeds)["y"]
    assert got.dtype == np.float16
    # two engines, each rounding fp16 intermediates in its own order: a few fp16 steps
    assert_close(got.astype(np.float32), reference.astype(np.float32), rtol=4e-3, atol=2e-3)
