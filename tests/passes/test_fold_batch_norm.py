import numpy as np
from passcheck import check_not_fired, check_rewrite, floats, ops

from edgeinfer.passes.rules import GraphView


def conv_bn(rng: np.random.Generator, *, bias: bool = True, extra: str = "", outputs: str = "") -> str:
    b = f", float[4] b = {floats(rng, 4)}" if bias else ""
    return f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 3, 6, 6] x) => (float[N, 4, 6, 6] y{outputs})
        <float[4, 3, 3, 3] w = {floats(rng, 4, 3, 3, 3)}{b}, float[4] gamma = {floats(rng, 4)},
         float[4] beta = {floats(rng, 4)}, float[4] mean = {floats(rng, 4)}, float[4] var = {floats(rng, 4, low=0.5)}>
        {{
            c = Conv<pads = [1, 1, 1, 1]>(x, w{", b" if bias else ""})
            y = BatchNormalization<epsilon = 0.001>(c, gamma, beta, mean, var)
            {extra}
        }}"""


def test_bn_folds_into_conv_with_bias(rng):
    done = check_rewrite(conv_bn(rng), "fold_batch_norm", fired={"bn_into_conv": 1}, nodes_after=1,
                         backends=("numpy", "onnxruntime"))
    assert ops(done.after) == ["Conv"]


def test_bn_folds_into_conv_without_bias(rng):
    done = check_rewrite(conv_bn(rng, bias=False), "fold_batch_norm", fired={"bn_into_conv": 1}, nodes_after=1)
    conv = done.after.nodes[0]
    assert len(conv.inputs) == 3 and GraphView(done.after).const(conv.inputs[2]).shape == (4,)


def test_bn_not_folded_when_conv_output_has_another_consumer(rng):
    source = conv_bn(rng, extra="z = Relu(c)", outputs=", float[N, 4, 6, 6] z")
    check_not_fired(source, "fold_batch_norm", "another consumer")


def test_bn_not_folded_when_conv_output_is_a_graph_output(rng):
    check_not_fired(conv_bn(rng, outputs=", float[N, 4, 6, 6] c"), "fold_batch_norm", "graph output")


def test_bn_not_folded_with_runtime_weights(rng):
    source = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 2, 4, 4] x, float[2, 2, 1, 1] w) => (float[1, 2, 4, 4] y)
        <float[2] s = {1, 2}, float[2] b = {0, 1}, float[2] m = {0, 0}, float[2] v = {1, 1}>
        {
            c = Conv(x, w)
            y = BatchNormalization(c, s, b, m, v)
        }"""
    check_not_fired(source, "fold_batch_norm", "computed at run time")
