import numpy as np
from passcheck import check_not_fired, check_rewrite, ops

from edgeinfer.passes import fold_constants as fold_module

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def test_constant_subgraph_folds_to_initializer():
    source = HEAD + """
        g (float[2, 3] x) => (float[2, 3] y) <float[3] a = {1, 2, 3}> {
            two = Constant<value = float {2.0}>()
            b = Mul(a, two)
            c = Exp(b)
            y = Add(x, c)
        }"""
    done = check_rewrite(source, "fold_constants", fired={"Constant": 1, "Mul": 1, "Exp": 1}, nodes_after=1)
    assert ops(done.after) == ["Add"]
    np.testing.assert_allclose(done.after.initializers[done.after.nodes[0].inputs[1]],
                               np.exp(np.array([2.0, 4.0, 6.0], np.float32)), rtol=1e-6)


def test_shape_subgraph_folds_with_a_symbolic_batch():
    source = HEAD + """
        g (float[N, 3, 4] x) => (float[N, 12] y) {
            s = Shape(x)
            i = Constant<value = int64[1] {0}>()
            j = Constant<value = int64[2] {1, 2}>()
            batch = Gather(s, i)
            rest = Gather(s, j)
            prod = ReduceProd<keepdims = 1>(rest)
            shape = Concat<axis = 0>(batch, prod)
            y = Reshape(x, shape)
        }"""
    # Gather(s, j) and everything built only from static dims fold; the batch dim stays computed.
    done = check_rewrite(source, "fold_constants", fired={"shape": 1, "ReduceProd": 1, "Constant": 2},
                         nodes_after=4)
    assert ops(done.after) == ["Shape", "Gather", "Concat", "Reshape"]


def test_static_shape_folds_entirely():
    source = HEAD + """
        g (float[2, 3, 4] x) => (float[2, 12] y) {
            s = Shape<start = 1>(x)
            p = ReduceProd<keepdims = 1>(s)
            b = Constant<value = int64[1] {2}>()
            shape = Concat<axis = 0>(b, p)
            y = Reshape(x, shape)
        }"""
    done = check_rewrite(source, "fold_constants", fired={"shape": 1}, nodes_after=1)
    assert ops(done.after) == ["Reshape"]
    np.testing.assert_array_equal(done.after.initializers[done.after.nodes[0].inputs[1]], [2, 12])


def test_huge_constant_of_shape_is_not_folded(monkeypatch):
    monkeypatch.setattr(fold_module, "MAX_FOLD_ELEMENTS", 1000)
    source = HEAD + """
        g (float[100, 100] x) => (float[100, 100] y) <int64[2] s = {100, 100}> {
            big = ConstantOfShape<value = float[1] {1.0}>(s)
            y = Add(x, big)
        }"""
    check_not_fired(source, "fold_constants")


def test_random_and_dequantize_are_not_folded():
    source = HEAD + """
        g (float[2] x) => (float[2] y) <int8[2] q = {1, 2}, float s = {0.5}> {
            r = RandomUniform<shape = [2]>()
            w = DequantizeLinear(q, s)
            t = Add(x, w)
            y = Add(t, r)
        }"""
    check_not_fired(source, "fold_constants")
