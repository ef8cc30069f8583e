"""cancel_transposes: pairs cancel, transposes sink through elementwise ops, and a converted
MobileNet-style Keras net keeps no Transpose between its convolutions."""

from __future__ import annotations

import numpy as np
import pytest
from passcheck import check_not_fired, check_rewrite, floats, ops

import edgeinfer as ei
from devkit.testing import assert_close

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'
TO_NHWC = "<perm = [0, 2, 3, 1]>"
TO_NCHW = "<perm = [0, 3, 1, 2]>"


def test_inverse_pair_cancels():
    source = HEAD + f"""
        g (float[1, 2, 3, 4] x) => (float[1, 2, 3, 4] y) {{
            t = Transpose{TO_NHWC}(x)
            y = Transpose{TO_NCHW}(t)
        }}"""
    done = check_rewrite(source, "cancel_transposes", fired={"transpose_pair": 1}, nodes_after=1)
    assert ops(done.after) == ["Identity"]


def test_non_inverse_pair_composes():
    source = HEAD + f"""
        g (float[1, 2, 3, 4] x) => (float[3, 4, 2, 1] y) {{
            t = Transpose{TO_NHWC}(x)
            y = Transpose<perm = [1, 2, 3, 0]>(t)
        }}"""
    done = check_rewrite(source, "cancel_transposes", fired={"transpose_pair": 1}, nodes_after=1)
    assert done.after.nodes[0].attrs["perm"] == (2, 3, 1, 0)


def test_pair_cancels_through_activation_and_qdq():
    source = HEAD + f"""
        g (float[1, 2, 3, 4] x) => (float[1, 2, 3, 4] y) {{
            s = Constant<value = float {{0.05}}>()
            z = Constant<value = int8 {{3}}>()
            lo = Constant<value = float {{0.0}}>()
            hi = Constant<value = float {{6.0}}>()
            t = Transpose{TO_NHWC}(x)
            r = Clip(t, lo, hi)
            q = QuantizeLinear(r, s, z)
            d = DequantizeLinear(q, s, z)
            y = Transpose{TO_NCHW}(d)
        }}"""
    done = check_rewrite(source, "cancel_transposes", fired={"transpose_through_unary": 3, "transpose_pair": 1},
                         nodes_after=4 + 4)
    assert "Transpose" not in ops(done.after)


def test_binary_op_with_two_transposed_inputs_and_a_constant(rng):
    source = HEAD + f"""
        g (float[1, 2, 3, 4] a, float[1, 2, 3, 4] b) => (float[1, 2, 3, 4] y) <float[2] c = {floats(rng, 2)}> {{
            ta = Transpose{TO_NHWC}(a)
            tb = Transpose{TO_NHWC}(b)
            s = Add(ta, tb)
            m = Mul(s, c)
            y = Transpose{TO_NCHW}(m)
        }}"""
    done = check_rewrite(source, "cancel_transposes", nodes_after=3,
                         fired={"transpose_through_elementwise": 2, "transpose_pair": 1})
    assert ops(done.after) == ["Add", "Mul", "Identity"]


def test_concat_axis_follows_the_permutation():
    source = HEAD + f"""
        g (float[1, 2, 3, 4] a, float[1, 5, 3, 4] b) => (float[1, 7, 3, 4] y) {{
            ta = Transpose{TO_NHWC}(a)
            tb = Transpose{TO_NHWC}(b)
            c = Concat<axis = -1>(ta, tb)
            y = Transpose{TO_NCHW}(c)
        }}"""
    done = check_rewrite(source, "cancel_transposes", nodes_after=2,
                         fired={"transpose_through_concat": 1, "transpose_pair": 1})
    assert done.after.nodes[0].attrs["axis"] == 1


def test_global_pooling_of_nhwc_needs_no_transpose():
    source = HEAD + f"""
        g (float[2, 3, 4, 5] x) => (float[2, 3] y) {{
            t = Transpose{TO_NHWC}(x)
            y = ReduceMean<axes = [1, 2], keepdims = 0>(t)
        }}"""
    done = check_rewrite(source, "cancel_transposes", fired={"transpose_through_reduce": 1}, nodes_after=1)
    assert done.after.nodes[0].attrs["axes"] == (2, 3)


def test_reduce_keeping_dims_moves_the_transpose_below():
    source = HEAD + f"""
        g (float[2, 3, 4, 5] x) => (float[2, 4, 1, 3] y) {{
            t = Transpose{TO_NHWC}(x)
            y = ReduceMax<axes = [2], keepdims = 1>(t)
        }}"""
    done = check_rewrite(source, "cancel_transposes", fired={"transpose_through_reduce": 1}, nodes_after=2)
    assert ops(done.after) == ["ReduceMax", "Transpose"]


def test_transpose_with_another_consumer_stays():
    # both readers could take it, but nothing below cancels: pushing would leave two transposes
    source = HEAD + f"""
        g (float[1, 2, 3, 4] x) => (float[1, 3, 4, 2] y, float[1, 3, 4, 2] z) {{
            t = Transpose{TO_NHWC}(x)
            y = Relu(t)
            z = Sigmoid(t)
        }}"""
    check_not_fired(source, "cancel_transposes", "another consumer")


def test_mismatched_permutations_do_not_merge_through_add():
    source = HEAD + f"""
        g (float[2, 2, 2, 2] a, float[2, 2, 2, 2] b) => (float[2, 2, 2, 2] y) {{
            ta = Transpose{TO_NHWC}(a)
            tb = Transpose{TO_NCHW}(b)
            y = Add(ta, tb)
        }}"""
    check_not_fired(source, "cancel_transposes")


def test_mobilenet_style_net_has_no_transposes_between_convolutions():
    keras = pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    layers = keras.layers
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3))
    x = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(8, 3, strides=2, padding="same")(inputs)))
    for filters, stride in ((16, 1), (24, 2), (24, 1)):
        y = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(filters * 2, 1)(x)))
        y = layers.ReLU(6.0)(layers.BatchNormalization()(layers.DepthwiseConv2D(3, stride, padding="same")(y)))
        y = layers.BatchNormalization()(layers.Conv2D(filters, 1)(y))
        x = layers.Add()([x, y]) if stride == 1 and x.shape[-1] == filters else y
    x = layers.Dense(10)(layers.GlobalAveragePooling2D()(x))
    net = keras.Model(inputs, x)

    model = ei.convert(net)
    graph = model.graph
    assert graph.op_histogram()["Conv"] == 10
    # One Transpose at the input (NHWC -> NCHW) and none anywhere else.
    transposes = [n for n in graph.nodes if n.op_type == "Transpose"]
    assert len(transposes) == 1 and transposes[0].inputs[0] == graph.input_names[0]
    sample = np.random.default_rng(0).standard_normal((1, 32, 32, 3)).astype(np.float32)
    (out,) = ei.Session(model).run({graph.input_names[0]: sample}).values()
    assert_close(out, np.asarray(net(sample)), rtol=1e-4, atol=1e-5)


def test_channel_pad_and_prelu_of_nhwc_move_below_and_cancel(rng):
    # MediaPipe's residual blocks: NHWC channel padding and PRelu between convolutions.
    source = HEAD + f"""
        g (float[1, 2, 3, 4] x) => (float[1, 4, 3, 4] y) <int64[8] p = {{0, 0, 0, 0, 0, 0, 0, 2}},
                                                       float[1, 1, 1, 4] slope = {floats(rng, 4)}> {{
            t = Transpose{TO_NHWC}(x)
            padded = Pad(t, p)
            r = PRelu(padded, slope)
            y = Transpose{TO_NCHW}(r)
        }}"""
    done = check_rewrite(source, "cancel_transposes", nodes_after=3,  # Pad, PRelu, Identity
                         fired={"transpose_through_pad": 1, "transpose_through_elementwise": 1, "transpose_pair": 1})
    assert "Transpose" not in ops(done.after)


def test_a_transpose_with_several_readers_that_all_take_it_sinks_and_cancels(rng):
    # A squeeze-and-excitation block of NHWC (MediaPipe's landscape selfie segmenter): the
    # transposed activation feeds both the pooling and the scaling Mul.
    source = HEAD + f"""
        g (float[1, 4, 3, 3] x) => (float[1, 4, 3, 3] y) <float[4, 4, 1, 1] w = {floats(rng, 4, 4, 1, 1)}> {{
            t = Transpose{TO_NHWC}(x)
            pooled = ReduceMean<axes = [1, 2], keepdims = 1>(t)
            back = Transpose{TO_NCHW}(pooled)
            excite = Conv(back, w)
            gate = Sigmoid(excite)
            gate_nhwc = Transpose{TO_NHWC}(gate)
            scaled = Mul(t, gate_nhwc)
            y = Transpose{TO_NCHW}(scaled)
        }}"""
    done = check_rewrite(source, "cancel_transposes", nodes_after=6,  # ReduceMean, Conv, Sigmoid, Mul, 2 Identity
                         fired={"transpose_through_reduce_shared": 1, "transpose_through_elementwise": 1,
                                "transpose_pair": 2})
    assert "Transpose" not in ops(done.after)

