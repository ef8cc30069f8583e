"""IR invariants: verify(), topological order, subgraph(), hashing, text dump, summary."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close, parse_model
from edgeinfer.errors import ModelValidationError
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.onnx_io import graph_from_model


def chain_graph() -> Graph:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    nodes = [Node("MatMul", ["x", "w"], ["t"]), Node("Relu", ["t"], ["u"]), Node("Neg", ["u"], ["y"])]
    return Graph(nodes, [Value("x", "float32", ("N", 3))], [Value("y", "float32", None)], {"w": w},
                 opset={"": 17})


def test_verify_accepts_valid_graph_and_links_producers_and_uses():
    graph = chain_graph()
    graph.verify()
    assert graph.producer("u").op_type == "Relu"
    assert [n.op_type for n in graph.consumers("t")] == ["Relu"]
    assert graph.values["w"].const is not None and graph.values["w"].shape == (3, 4)


def test_verify_rejects_cycle_with_node_name():
    nodes = [Node("Relu", ["b"], ["a"], name="first"), Node("Relu", ["a"], ["b"], name="second")]
    graph = Graph(nodes, [], [Value("a")], opset={"": 17})
    with pytest.raises(ModelValidationError, match="cycle"):
        graph.topological_order()
    with pytest.raises(ModelValidationError, match="first|second"):
        graph.verify()


def test_verify_rejects_value_produced_twice():
    nodes = [Node("Relu", ["x"], ["y"], name="r1"), Node("Neg", ["x"], ["y"], name="r2")]
    graph = Graph(nodes, [Value("x", "float32", (2,))], [Value("y")], opset={"": 17})
    with pytest.raises(ModelValidationError, match="already produced by node 'r1'"):
        graph.verify()


def test_verify_rejects_undefined_input_naming_node():
    graph = Graph([Node("Add", ["x", "ghost"], ["y"], name="adder")], [Value("x", "float32", (2,))],
                  [Value("y")], opset={"": 17})
    with pytest.raises(ModelValidationError, match="adder.*ghost.*nowhere"):
        graph.verify()


def test_verify_rejects_missing_output_and_bad_types():
    graph = Graph([], [Value("x", "float32", (2,))], [Value("nope")], opset={"": 17})
    with pytest.raises(ModelValidationError, match="nope"):
        graph.verify()
    bad_dim = Graph([], [Value("x", "float32", (2, -3))], [Value("x")], opset={"": 17})
    with pytest.raises(ModelValidationError, match="invalid dim"):
        bad_dim.verify()
    bad_const = Graph([], [], [Value("c")], {"c": np.zeros(3, np.float32)},
                      value_info=[], opset={"": 17})
    bad_const.values["c"].shape = (4,)
    with pytest.raises(ModelValidationError, match="declared shape"):
        bad_const.verify()


def test_sorted_reorders_out_of_order_nodes_and_keeps_valid_order():
    graph = chain_graph()
    shuffled = graph.replace([graph.nodes[2], graph.nodes[0], graph.nodes[1]])
    with pytest.raises(ModelValidationError):
        shuffled.verify()
    fixed = shuffled.sorted()
    fixed.verify()
    assert [n.op_type for n in fixed.nodes] == ["MatMul", "Relu", "Neg"]
    assert graph.sorted() is graph


def test_subgraph_boundaries_and_numerics():
    model = parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 3] x) => (float[2, 3] y, float[2, 3] z)
        <float[3] b = {1.0, 2.0, 3.0}>
        {
            a = Add(x, b)
            r = Relu(a)
            y = Neg(r)
            z = Sigmoid(a)
        }""")
    graph = graph_from_model(model)
    part = graph.subgraph(graph.nodes[:2])
    part.verify()
    assert part.input_names == ["x"]
    assert sorted(part.output_names) == ["a", "r"]  # a is read by Sigmoid outside the part
    assert "b" in part.initializers
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    outs = ei.Session(ei.Model(part)).run({"x": x})
    assert_close(outs["r"], np.maximum(x + np.array([1, 2, 3], np.float32), 0))


def test_a_subgraph_keeps_the_storage_of_the_weights_it_copies():
    """A part's float16-stored weights stay declared (a TFLite artifact keeps them float16 behind
    DEQUANTIZE, as the source file had them); weights it does not copy are not listed."""
    from edgeinfer.format.tflite import export_tflite
    from edgeinfer.ir.infer import infer_types
    from edgeinfer.ir.weights import stored_weights, with_stored_weights

    rng = np.random.default_rng(0)
    weights = {name: rng.standard_normal((64, 64)).astype(np.float16).astype(np.float32)  # as the TFLite
               for name in ("w1", "w2")}                                                   # importer holds them
    graph = Graph([Node("MatMul", ["x", "w1"], ["a"]), Node("MatMul", ["a", "w2"], ["y"])],
                  [Value("x", "float32", (1, 64))], [Value("y", "float32", (1, 64))], weights, opset={"": 17},
                  metadata=with_stored_weights({}, ["w1", "w2"]))
    graph = infer_types(graph)
    part = graph.subgraph(graph.nodes[:1])
    assert stored_weights(part.metadata) == {"w1": "float16"}
    wide = part.copy()
    wide.metadata = {}
    assert len(export_tflite(part)) < len(export_tflite(wide)) - 64 * 64  # float16 bytes, not float32
    x = rng.standard_normal((1, 64)).astype(np.float32)
    got = ei.Session(ei.Model(part), backend="tflite").run({"x": x})["a"]
    assert_close(got, x @ weights["w1"], rtol=1e-5, atol=1e-5)


def test_content_hash_is_stable_and_sensitive():
    first, second = chain_graph(), chain_graph()
    assert first.content_hash() == second.content_hash()
    changed = chain_graph()
    changed.values["w"].const = changed.values["w"].const + 1
    assert changed.content_hash() != first.content_hash()
    renamed = first.replace([first.nodes[0], first.nodes[1], Node("Abs", ["u"], ["y"])])
    assert renamed.content_hash() != first.content_hash()


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "bfloat16"])
def test_weights_are_hashed_as_their_bytes_in_place(layout, rng):
    """The digest takes each weight's bytes in C order, as ``tobytes()`` gives them (so the
    hash is the one it always was), in chunks read in place: no whole copy of a weight."""
    import hashlib
    import tracemalloc

    import ml_dtypes

    from edgeinfer.ir.graph import hash_array_bytes

    w = rng.standard_normal((3072, 8192)).astype(np.float32)  # 96 MiB
    array = {"contiguous": w, "transposed": w.T, "strided": w[:, ::3],
             "bfloat16": w[:64].astype(ml_dtypes.bfloat16)}[layout]
    expected = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
    for chunk in (4096, 1 << 20):
        digest = hashlib.sha256()
        hash_array_bytes(array, digest, chunk)
        assert digest.hexdigest() == expected
    tracemalloc.start()
    try:
        hash_array_bytes(array, hashlib.sha256())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    limit = (1 << 20) if layout in ("contiguous", "bfloat16") else 2 * (16 << 20)  # strided: a chunk copied
    assert peak < limit, (layout, peak)


def test_content_hash_of_a_big_weight_copies_nothing_and_sees_one_changed_value(rng):
    w = rng.standard_normal((3072, 8192)).astype(np.float32)  # 96 MiB
    graph = Graph([Node("MatMul", ["x", "w"], ["y"])], [Value("x", "float32", [1, 3072])],
                  [Value("y", "float32", [1, 8192])], {"w": w})
    import tracemalloc

    tracemalloc.start()
    try:
        first = graph.content_hash()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (2 << 20), peak
    assert graph.content_hash() == first
    const = graph.values["w"].const
    const[1234, 5678] = np.nextafter(const[1234, 5678], np.float32(np.inf))  # one ulp of one weight
    assert graph.content_hash() != first


def test_text_dump_and_summary():
    from onnx import helper, numpy_helper

    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    proto = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", 1, [1, 4, 8, 8])],
                              [numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")])
    model = helper.make_model(proto, opset_imports=[helper.make_opsetid("", 17)])
    graph = ei.convert(model).graph
    text = str(graph)
    assert "Conv(x, w)" in text and "pads=[1, 1, 1, 1]" in text and "float32[1,4,8,8]" in text
    summary = graph.summary()
    assert summary["ops"] == {"Conv": 1}
    assert summary["parameters"] == 4 * 3 * 3 * 3
    assert summary["weight_bytes"] == 4 * 3 * 3 * 3 * 4
    # 2 FLOPs per MAC: every output element does C_in * k * k MACs
    assert summary["flops"] == 2 * (3 * 3 * 3) * (4 * 8 * 8)


def test_verify_rejects_inconsistent_dtypes_naming_node():
    graph = Graph([Node("Add", ["a", "b"], ["y"], name="mix")],
                  [Value("a", "float32", (2,)), Value("b", "int64", (2,))], [Value("y", "float32", (2,))],
                  opset={"": 17})
    with pytest.raises(ModelValidationError, match="mix.*one element type.*int64"):
        graph.verify()
