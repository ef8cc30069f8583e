"""One op at a time: small graphs (ONNX text) exported to .tflite, run by the interpreter,
against the numpy backend; and the ops or attributes the exporter refuses."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer as ei
from devkit.testing import assert_close, parse_model
from edgeinfer.errors import UnsupportedOpError
from edgeinfer.format.tflite import export_tflite, node_support

from .conftest import opcodes, run_flatbuffer

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
X4 = "float[1, 4, 6, 6] x"


def _weights(shape, seed=0) -> str:
    values = np.random.default_rng(seed).normal(0, 0.5, shape).astype(np.float32)
    return f"float[{', '.join(map(str, shape))}] w = {{{', '.join(f'{v:.6f}' for v in values.reshape(-1))}}}"


CASES = {  # name -> (inputs, output, initializers, body)
    "conv_transpose_same": (X4, "float[1, 3, 12, 12] y", _weights((4, 3, 3, 3)),
                            "y = ConvTranspose <strides = [2, 2], pads = [1, 1, 0, 0], output_padding = [0, 0]> (x, w)"),
    "conv_transpose_valid": (X4, "float[1, 3, 13, 13] y", _weights((4, 3, 3, 3)),
                             "y = ConvTranspose <strides = [2, 2]> (x, w)"),
    "conv_transpose_cropped": (X4, "float[1, 3, 10, 10] y", _weights((4, 3, 3, 3)),
                               "y = ConvTranspose <strides = [2, 2], pads = [2, 2, 1, 1]> (x, w)"),
    "conv_dilated_same": (X4, "float[1, 2, 6, 6] y", _weights((2, 4, 3, 3)),
                          "y = Conv <dilations = [2, 2], auto_pad = \"SAME_UPPER\"> (x, w)"),
    "maxpool_explicit_pads": (X4, "float[1, 4, 3, 3] y", "",
                              "y = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (x)"),
    "avgpool_same": (X4, "float[1, 4, 3, 3] y", "",
                     "y = AveragePool <kernel_shape = [2, 2], strides = [2, 2], auto_pad = \"SAME_UPPER\"> (x)"),
    "avgpool_count_pad": (X4, "float[1, 4, 6, 6] y", "",
                          "y = AveragePool <kernel_shape = [3, 3], pads = [1, 1, 1, 1], count_include_pad = 1> (x)"),
    "resize_bilinear_half_pixel": (X4, "float[1, 4, 12, 12] y", "",
                                   "roi = Constant <value = float[0] {}> ()\n"
                                   "scales = Constant <value = float[4] {1, 1, 2, 2}> ()\n"
                                   "y = Resize <mode = \"linear\"> (x, roi, scales)"),
    "resize_bilinear_align_corners": (X4, "float[1, 4, 11, 11] y", "",
                                      "roi = Constant <value = float[0] {}> ()\n"
                                      "sizes = Constant <value = int64[4] {1, 4, 11, 11}> ()\n"
                                      "y = Resize <mode = \"linear\", coordinate_transformation_mode = "
                                      "\"align_corners\"> (x, roi, , sizes)"),
    "resize_nearest": (X4, "float[1, 4, 12, 12] y", "",
                       "roi = Constant <value = float[0] {}> ()\n"
                       "scales = Constant <value = float[4] {1, 1, 2, 2}> ()\n"
                       "y = Resize <mode = \"nearest\", coordinate_transformation_mode = \"asymmetric\", "
                       "nearest_mode = \"floor\"> (x, roi, scales)"),
    "pad_constant_after_conv": (X4, "float[1, 2, 7, 9] y", _weights((2, 4, 1, 1)),
                                "c = Conv (x, w)\npads = Constant <value = int64[8] {0, 0, 1, 2, 0, 0, 0, 1}> ()\n"
                                "v = Constant <value = float {1.5}> ()\ny = Pad (c, pads, v)"),
    "pad_reflect": (X4, "float[1, 4, 8, 8] y", "",
                    "pads = Constant <value = int64[8] {0, 0, 1, 1, 0, 0, 1, 1}> ()\ny = Pad <mode = \"reflect\"> (x, pads)"),
    "softmax_channels_nhwc": (X4, "float[1, 4, 6, 6] y", _weights((4, 4, 1, 1)),
                              "c = Conv (x, w)\ny = Softmax <axis = 1> (c)"),
    "reduce_mean_no_keepdims": (X4, "float[1, 6] y", _weights((4, 4, 1, 1)),
                                "c = Conv (x, w)\ny = ReduceMean <axes = [1, 3], keepdims = 0> (c)"),
    "concat_channels_nhwc": (X4, "float[1, 8, 6, 6] y", _weights((4, 4, 1, 1)),
                             "c = Conv (x, w)\ny = Concat <axis = 1> (c, x)"),
    "slice_and_gather": (X4, "float[1, 2, 6] y", "",
                         "s = Constant <value = int64[2] {1, -1}> ()\ne = Constant <value = int64[2] {3, -100}> ()\n"
                         "a = Constant <value = int64[2] {1, 2}> ()\nst = Constant <value = int64[2] {1, -2}> ()\n"
                         "z = Slice (x, s, e, a, st)\ni = Constant <value = int64 {-1}> ()\ny = Gather <axis = 3> (z, i)"),
    "layer_norm": ("float[2, 5, 8] x", "float[2, 5, 8] y", "float[8] g = {1, 2, 3, 4, 5, 6, 7, 8}",
                   "b = Constant <value = float[8] {0, 1, 0, 1, 0, 1, 0, 1}> ()\n"
                   "y = LayerNormalization <axis = -1, epsilon = 0.001> (x, g, b)"),
    "batch_norm_unfolded": (X4, "float[1, 4, 6, 6] y", "float[4] s = {1, 2, 0.5, 1}, float[4] m = {0, 1, 2, 3}",
                            "y = BatchNormalization (x, s, m, m, s)"),
    "activations": ("float[3, 7] x", "float[3, 7] y", "",
                    "lo = Constant <value = float {-0.5}> ()\nhi = Constant <value = float {0.7}> ()\n"
                    "a = Clip (x, lo, hi)\nb = LeakyRelu <alpha = 0.2> (x)\nc = HardSigmoid (x)\nd = HardSwish (x)\n"
                    "e = Erf (x)\nf = Sigmoid (x)\ng = Tanh (x)\ns1 = Add (a, b)\ns2 = Mul (s1, c)\ns3 = Sub (s2, d)\n"
                    "s4 = Add (s3, e)\ns5 = Div (s4, f)\ny = Add (s5, g)"),
    "reshape_flatten_transpose": (X4, "float[1, 144] y", _weights((4, 4, 1, 1)),
                                  "c = Conv (x, w)\nt = Transpose <perm = [0, 2, 3, 1]> (c)\ny = Flatten (t)"),
    "matmul_activations": ("float[2, 3, 8] x, float[2, 8, 5] z", "float[2, 3, 5] y", "",
                           "y = MatMul (x, z)"),
    "sum_one": ("float[3, 7] x", "float[3, 7] y", "", "s = Sum (x)\ny = Relu (s)"),
    "sum_two_broadcast": (X4, "float[1, 4, 6, 6] y", _weights((4, 4, 1, 1)),
                          "c = Conv (x, w)\nb = Constant <value = float[4, 1, 1] {0.5, -1, 2, 0}> ()\n"
                          "s = Sum (c, b)\ny = Relu (s)"),
    "sum_three": (X4, "float[1, 4, 6, 6] y", _weights((4, 4, 1, 1)), "c = Conv (x, w)\ny = Sum (c, x, c)"),
}


def _model(name: str):
    inputs, output, initializers, body = CASES[name]
    text = f"{HEADER}\nt ({inputs}) => ({output})\n" + (f"<{initializers}>\n" if initializers else "") + \
        "{\n" + body + "\n}"
    return ei.convert(parse_model(text), optimize=0)


def _feeds(model, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in model.graph.inputs}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("resolver", ["builtin", "xnnpack"])
def test_op_matches_numpy_backend(name, resolver):
    model = _model(name)
    feeds = _feeds(model)
    (expected,) = ei.Session(model).run(feeds).values()
    (got,) = run_flatbuffer(export_tflite(model.graph), feeds, resolver)
    # Erf from its A&S polynomial: absolute error up to 1.5e-7 per use.
    assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_nhwc_consumers_need_no_transpose():
    ops = opcodes(export_tflite(_model("concat_channels_nhwc").graph))
    assert ops.count("TRANSPOSE") == 2  # x into NHWC for the conv, the result back to NCHW


def test_transpose_of_nhwc_value_is_free():
    ops = opcodes(export_tflite(_model("reshape_flatten_transpose").graph))
    assert ops.count("TRANSPOSE") == 1 and "RESHAPE" in ops  # only the input's


def test_sum_is_add_or_add_n():
    """Two inputs: ADD, which broadcasts and takes the following Relu as its fused activation
    (the ONNX model zoo's ShuffleNet sums so); three: ADD_N, in the conv output's NHWC."""
    assert [op for op in opcodes(export_tflite(_model("sum_two_broadcast").graph))
            if op not in ("TRANSPOSE", "CONV_2D")] == ["ADD"]
    ops = opcodes(export_tflite(_model("sum_three").graph))
    assert "ADD_N" in ops and ops.count("TRANSPOSE") == 2


UNSUPPORTED = {
    "cubic resize": (X4, "float[1, 4, 12, 12] y", "",
                     "roi = Constant <value = float[0] {}> ()\nscales = Constant <value = float[4] {1, 1, 2, 2}> ()\n"
                     "y = Resize <mode = \"cubic\"> (x, roi, scales)"),
    "edge pad": (X4, "float[1, 4, 8, 8] y", "",
                 "pads = Constant <value = int64[8] {0, 0, 1, 1, 0, 0, 1, 1}> ()\ny = Pad <mode = \"edge\"> (x, pads)"),
    "no rule": ("float[3, 7] x", "float[3, 7] y", "", "y = Hardmax (x)"),
    "broadcast sum of three": ("float[3, 7] x", "float[3, 7] y", "float[7] b = {1, 2, 3, 4, 5, 6, 7}",
                               "y = Sum (x, b, x)"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_op_names_the_node(case):
    CASES["_probe"] = UNSUPPORTED[case]
    try:
        model = _model("_probe")
    finally:
        del CASES["_probe"]
    node = next(n for n in model.graph.nodes if n.outputs[0] == "y")
    reason = node_support(node, model.graph)
    assert reason
    with pytest.raises(UnsupportedOpError, match=f"{node.op_type}"):
        export_tflite(model.graph)
