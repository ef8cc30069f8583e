"""The capability partitioner: every placement computes what numpy alone computes, parts are
connected, cycle-free and in order, and fallbacks say why."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close, parse_model
from edgeinfer.errors import BackendError
from edgeinfer.runtime.compile import compile
from edgeinfer.runtime.partition import split_branches
from edgeinfer.runtime.placement import make_backends, make_plan

from .backends import RestrictedBackend

# Two outputs, a fork (a -> b, c), joins (d, z) and a long-range edge (x -> e): placements can
# create cycles here if the partitioner is careless.
BRANCHY = """
    <ir_version: 8, opset_import: ["" : 17]>
    branchy (float[2, 8] x) => (float[2, 8] y, float[2, 8] z)
    {
        a = Relu(x)
        b = Sigmoid(a)
        c = Tanh(a)
        d = Add(b, c)
        e = Mul(d, x)
        f = Abs(e)
        y = Neg(f)
        z = Sub(b, f)
    }"""
ALL_OPS = {"Relu", "Sigmoid", "Tanh", "Add", "Mul", "Abs", "Neg", "Sub"}


@pytest.fixture(scope="module")
def branchy():
    return ei.convert(parse_model(BRANCHY), optimize=0)


@pytest.fixture(scope="module")
def feeds():
    return {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}


def check_structure(plan, maximal: bool = True) -> None:
    """Each node in exactly one part, on that part's backend; parts ordered so that every part
    reads only graph inputs, constants and outputs of earlier parts; and maximal: any two parts
    of one backend are linked by a path through a third part (merging them would close a cycle)."""
    graph = plan.graph
    seen = sorted(i for part in plan.parts for i in part.nodes)
    assert seen == list(range(len(graph.nodes)))
    available = set(graph.input_names) | set(graph.initializers)
    for part in plan.parts:
        assert {plan.assignment.backends[i] for i in part.nodes} == {part.backend}
        assert set(part.inputs) <= available, f"{part.graph.name} reads a value made later"
        available |= set(part.outputs)
    assert set(graph.output_names) <= available
    producer = {name: i for i, part in enumerate(plan.parts) for name in part.outputs}
    succs = {i: {j for j, other in enumerate(plan.parts) if any(producer.get(n) == i for n in other.inputs)}
             for i in range(len(plan.parts))}

    def long_path(a: int, b: int) -> bool:
        stack = [s for s in succs[a] if s != b]
        reached = set(stack)
        while stack:
            current = stack.pop()
            if current == b:
                return True
            for nxt in succs[current] - reached:
                reached.add(nxt)
                stack.append(nxt)
        return False

    for a in range(len(plan.parts)):
        for b in range(a + 1, len(plan.parts)):
            if maximal and plan.parts[a].backend == plan.parts[b].backend:
                assert long_path(a, b) or long_path(b, a), f"parts {a} and {b} could be merged"


def test_every_placement_matches_numpy_alone(branchy, feeds):
    reference = ei.Session(branchy, backend="numpy").run(feeds)
    npu = RestrictedBackend("npu", ALL_OPS)
    backends = [npu, *make_backends(["numpy"])]
    count = len(branchy.graph.nodes)
    for choice in itertools.product(["npu", "numpy"], repeat=count):
        pinned = dict(enumerate(choice))
        plan = make_plan(branchy.graph, backends, pinned=pinned)
        check_structure(plan)
        _, runner = compile(branchy.graph, backends, pinned=pinned, threads=1)
        got = runner.run(feeds)
        runner.close()
        for name, ref in reference.items():
            assert_close(got[name], ref, name=f"{name} with placement {choice}")


def test_dag_split_of_random_placements_matches_numpy(branchy, feeds):
    reference = ei.Session(branchy, backend="numpy").run(feeds)
    npu = RestrictedBackend("npu", ALL_OPS)
    backends = [npu, *make_backends(["numpy"])]
    rng = np.random.default_rng(5)
    for _ in range(24):
        pinned = dict(enumerate(rng.choice(["npu", "numpy"], len(branchy.graph.nodes))))
        plan = make_plan(branchy.graph, backends, pinned=pinned, branches=True)
        check_structure(plan, maximal=False)
        _, runner = compile(branchy.graph, backends, pinned=pinned, threads=2, executor="dag")
        got = runner.run(feeds)
        runner.close()
        for name, ref in reference.items():
            assert_close(got[name], ref, name=f"{name} (dag) with placement {pinned}")


def test_unsupported_ops_fall_back_to_numpy_with_reasons(branchy):
    npu = RestrictedBackend("npu", {"Relu", "Add", "Mul", "Abs", "Neg", "Sub"})
    plan = make_plan(branchy.graph, [npu, *make_backends(["numpy"])])
    check_structure(plan)
    on_numpy = {branchy.graph.nodes[i].op_type for i, b in enumerate(plan.assignment.backends) if b == "numpy"}
    assert on_numpy == {"Sigmoid", "Tanh"}
    text = plan.describe()
    assert "fallbacks:" in text and "op Sigmoid is not among the ops this NPU runs" in text
    # Relu | Sigmoid, Tanh | Add, Mul, Abs, Neg, Sub: Relu cannot join the rest (it would need
    # numpy's output to come back into its own part: a cycle)
    assert [(p.backend, len(p.nodes)) for p in plan.parts] == [("npu", 1), ("numpy", 2), ("npu", 5)]


def test_independent_node_merges_where_no_cycle_forms():
    model = ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x, float[4] w) => (float[4] y)
        {
            a = Relu(x)
            n = Sigmoid(a)
            b = Abs(w)
            y = Add(n, b)
        }"""), optimize=0)
    npu = RestrictedBackend("npu", {"Relu", "Abs", "Add"})
    plan = make_plan(model.graph, [npu, *make_backends(["numpy"])])
    check_structure(plan)
    groups = sorted(sorted(model.graph.nodes[i].op_type for i in p.nodes) for p in plan.parts)
    # Abs has no path through numpy, so it joins the Add after Sigmoid; Relu cannot
    assert groups == [["Abs", "Add"], ["Relu"], ["Sigmoid"]]


def test_branch_split_cuts_at_forks_and_joins(branchy):
    plan = make_plan(branchy.graph, make_backends(["numpy"]))
    assert len(plan.parts) == 1
    split = split_branches(branchy.graph, plan.parts)
    check_structure(make_plan(branchy.graph, make_backends(["numpy"]), branches=True), maximal=False)
    ops = [[branchy.graph.nodes[i].op_type for i in p.nodes] for p in split]
    assert ["Sigmoid"] in ops and ["Tanh"] in ops  # the two sides of the fork are separate parts


def test_pinning_to_a_backend_that_cannot_run_the_node_is_an_error(branchy):
    npu = RestrictedBackend("npu", {"Relu"})
    with pytest.raises(BackendError, match="pinned to backend 'npu', which cannot run it"):
        make_plan(branchy.graph, [npu, *make_backends(["numpy"])], pinned={1: "npu"})


def test_session_with_a_backend_list_reports_its_plan(branchy, feeds):
    npu = RestrictedBackend("npu", {"Relu", "Add", "Mul"})
    session = ei.Session(branchy, backend=[npu, "numpy"])
    assert set(session.plan.backend_names) == {"npu", "numpy"}
    reference = ei.Session(branchy, backend="numpy").run(feeds)
    for name, array in session.run(feeds).items():
        assert_close(array, reference[name])
    assert "parts" in session.stats()


@pytest.mark.parametrize("backend, message", [
    (["onnxruntime", "onnxruntime"], "more than once"),
    (["auto", "numpy"], "cannot be part of a list"),
    ("tensorrt", "unknown backend 'tensorrt'"),
    ([], "expected a name"),
])
def test_bad_backend_choices_are_clear_errors(branchy, backend, message):
    with pytest.raises(BackendError, match=message):
        ei.Session(branchy, backend=backend)


def test_independent_subgraphs_on_one_backend_share_a_part():
    model = ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] a, float[4] b) => (float[4] y, float[4] z) { y = Relu(a)  z = Sigmoid(b) }"""), optimize=0)
    plan = make_plan(model.graph, make_backends(["numpy"]))
    assert len(plan.parts) == 1
    with ei.Session(model, backend=[RestrictedBackend("npu", {"Relu"}), "numpy"]) as session:
        assert len(session.plan.parts) == 2
        assert session.stats()["fallback_ops"] == {}  # every part's numpy fallbacks, added up


def test_a_value_read_only_inside_another_parts_if_branch_is_that_parts_output():
    """A value that only an If's branch body reads (not the If's inputs) must still leave the
    part that makes it (re-partitioning moved such an If away from its producer)."""
    from onnx import TensorProto, helper

    then_branch = helper.make_graph([helper.make_node("Neg", ["c"], ["t"])], "then", [],
                                    [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])])
    else_branch = helper.make_graph([helper.make_node("Abs", ["c"], ["e"])], "else", [],
                                    [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["c"]),
         helper.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
              helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), optimize=0)
    npu = RestrictedBackend("npu", {"Relu"})
    backends = [npu, *make_backends(["numpy"])]
    plan = make_plan(model.graph, backends)
    assert [p.backend for p in plan.parts] == ["npu", "numpy"]
    assert plan.parts[0].outputs == ["c"]
    feeds = {"x": np.array([-1.0, 2.0, -3.0, 4.0], np.float32), "flag": np.array(True)}
    _, runner = compile(model.graph, backends, threads=1)
    got = runner.run(feeds)
    runner.close()
    assert_close(got["y"], ei.Session(model).run(feeds)["y"])


def _qdq_conv_pair():
    """x -> Conv (weight DequantizeLinear(int8 w1)) -> Relu -> ConvTranspose (weight
    DequantizeLinear(int8 w2)) -> y: each weight is computed from constants by its own node."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (4, 4, 3, 3), dtype=np.int8), "w1"),
             numpy_helper.from_array(np.full(4, 0.02, np.float32), "s1"),
             numpy_helper.from_array(rng.integers(-127, 128, (4, 2, 2, 2), dtype=np.int8), "w2"),
             numpy_helper.from_array(np.full(4, 0.03, np.float32), "s2")]
    nodes = [helper.make_node("DequantizeLinear", ["w1", "s1"], ["w1f"], name="dq1", axis=0),
             helper.make_node("Conv", ["x", "w1f"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("DequantizeLinear", ["w2", "s2"], ["w2f"], name="dq2", axis=0),
             helper.make_node("ConvTranspose", ["r", "w2f"], ["y"], name="up", strides=[2, 2])]
    graph = helper.make_graph(nodes, "qdq_pair", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 16, 16])], inits)
    return ei.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), optimize=0)


def test_a_weights_dequantize_goes_where_its_reader_goes():
    """A node computing from constants alone (a weight's DequantizeLinear) follows its reader's
    backend: placed on the backend that declined its reader, its output would be a constant
    leaving a part, which TFLite cannot compile (PP-OCRv4 det INT8 on tflite: 25 nodes moved by
    re-partitioning, the part's real fault hidden behind probes of lone DequantizeLinear nodes)."""
    pytest.importorskip("ai_edge_litert")
    model = _qdq_conv_pair()
    npu = RestrictedBackend("npu", {"DequantizeLinear", "Conv", "Relu"}, inner="tflite")
    plan = make_plan(model.graph, [npu, *make_backends(["numpy"])])
    check_structure(plan)
    placed = {model.graph.nodes[i].name: b for i, b in enumerate(plan.assignment.backends)}
    assert placed == {"dq1": "npu", "conv": "npu", "relu": "npu", "dq2": "numpy", "up": "numpy"}
    assert all(not (set(p.outputs) & set(model.graph.initializers)) for p in plan.parts)
    x = {"x": np.random.default_rng(4).standard_normal((1, 4, 8, 8)).astype(np.float32)}
    with ei.Session(model, backend=[npu, "numpy"]) as session:
        got = session.run(x)
        assert not session.compiled_plan(x).repartitions  # nothing failed to compile
    assert_close(got["y"], ei.Session(model, backend="numpy").run(x)["y"], rtol=1e-4, atol=1e-4)


def test_compile_probes_judge_a_weights_dequantize_with_its_reader():
    """The node-by-node probe after a failed compile takes a node with the nodes computing its
    constant inputs, and only the node's own outputs: a lone DequantizeLinear of a weight (a
    constant output) or a Conv whose weight arrives as an input is no culprit of its own."""
    pytest.importorskip("ai_edge_litert")
    from edgeinfer.backend import get_backend
    from edgeinfer.runtime.compile import probe_compile, probe_units
    from edgeinfer.runtime.partition import Part

    model = _qdq_conv_pair()
    graph = model.graph
    first = [i for i, node in enumerate(graph.nodes) if node.name in ("dq1", "conv", "relu")]
    part = Part("tflite", first, graph.subgraph([graph.nodes[i] for i in first]))
    units = [([graph.nodes[i].name for i in indices], sub.output_names) for indices, sub in probe_units(part)]
    assert units == [(["dq1", "conv"], ["c"]), (["relu"], ["r"])]
    assert probe_compile(part, get_backend("tflite")) == {}
