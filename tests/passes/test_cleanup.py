import numpy as np
from passcheck import check_not_fired, check_rewrite, graph_of, ops

from edgeinfer.passes import run_pass

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def test_identity_dropout_and_same_type_cast_are_removed():
    source = HEAD + """
        g (float[N, 4] x) => (float[N, 4] y) {
            a = Identity(x)
            b = Dropout(a)
            c = Cast<to = 1>(b)
            d = Relu(c)
            y = Identity(d)
        }"""
    done = check_rewrite(source, "remove_identity", fired={"identity": 4}, nodes_after=1)
    assert ops(done.after) == ["Relu"]
    assert done.after.nodes[0].outputs == ("y",)  # the graph output keeps its name


def test_identity_feeding_a_subgraph_is_redirected():
    source = HEAD + """
        g (bool c, float[3] x) => (float[3] y) {
            a = Identity(x)
            y = If(c) <then_branch = t () => (float[3] o) { o = Relu(a) },
                       else_branch = e () => (float[3] o) { o = Neg(a) }>
        }"""
    done = check_rewrite(source, "remove_identity", fired={"identity": 1}, nodes_after=1,
                         feeds={"c": np.array(True), "x": np.array([-1.0, 0.5, 2.0], np.float32)})
    assert done.after.nodes[0].attrs["then_branch"].nodes[0].inputs == ("x",)


def test_identity_between_graph_input_and_output_stays():
    check_not_fired(HEAD + "g (float[2] x) => (float[2] y) { y = Identity(x) }", "remove_identity")


def test_dropout_whose_mask_is_read_stays():
    source = HEAD + """
        g (float[2] x) => (float[2] y, bool[2] m) { y, m = Dropout(x) }"""
    check_not_fired(source, "remove_identity")


def test_cast_to_another_type_stays():
    check_not_fired(HEAD + "g (float[2] x) => (double[2] y) { y = Cast<to = 11>(x) }", "remove_identity")


def test_dead_nodes_and_initializers_are_removed():
    source = HEAD + """
        g (float[4] x) => (float[4] y) <float[4] unused = {1, 2, 3, 4}, float[4] k = {1, 1, 1, 1}> {
            dead = Mul(x, unused)
            dead2 = Exp(dead)
            y = Add(x, k)
        }"""
    before = graph_of(source)
    result = run_pass("eliminate_dead_nodes", before)
    assert result.fired == {"nodes": 2, "initializers": 1}
    result.graph.verify()
    assert ops(result.graph) == ["Add"] and "unused" not in result.graph.initializers


def test_nothing_dead_is_not_modified():
    check_not_fired(HEAD + "g (float[2] x) => (float[2] y) { y = Relu(x) }", "eliminate_dead_nodes")
