"""Cross-layer equalization (edgeinfer/quantize/equalize.py): which paths it rescales, that the
float function is unchanged, and what it does to channel ranges and to INT8."""

import json
import warnings

import numpy as np
import onnx
from onnx import helper, numpy_helper

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.model import Model
from edgeinfer.quantize import quantize
from edgeinfer.quantize.equalize import channel_ranges, equalization_pairs, equalize
from edgeinfer.quantize.guard import output_quality

CHANNELS = 8


def _model(middle: list[onnx.NodeProto], extra_inits: list[onnx.TensorProto] = (), *, reader_group: int = 1,
           outputs: tuple[str, ...] = ("y",), seed: int = 0) -> Model:
    """x [1,3,12,12] -> Conv A (8 channels, channel 0 50x larger) -> ``middle`` (a -> m) -> Conv B -> y
    (reading channel 0 with 50x smaller weights)."""
    rng = np.random.default_rng(seed)
    w_a = rng.standard_normal((CHANNELS, 3, 3, 3)).astype(np.float32) * 0.3
    w_a[0] *= 50.0
    b_a = rng.standard_normal(CHANNELS).astype(np.float32)
    w_b = rng.standard_normal((6 if reader_group == 1 else CHANNELS, CHANNELS // reader_group, 1, 1)).astype(np.float32)
    w_b[:, 0] *= 0.02  # the wide channel is read with small weights: the others carry the signal
    inits = [numpy_helper.from_array(w_a, "w_a"), numpy_helper.from_array(b_a, "b_a"),
             numpy_helper.from_array(w_b, "w_b"), *extra_inits]
    nodes = [helper.make_node("Conv", ["x", "w_a", "b_a"], ["a"], name="conv_a", pads=[1, 1, 1, 1]), *middle,
             helper.make_node("Conv", ["m", "w_b"], ["y"], name="conv_b", group=reader_group)]
    channels_out = 6 if reader_group == 1 else CHANNELS
    shapes = {"y": [1, channels_out, 12, 12], "a": [1, CHANNELS, 12, 12]}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, shapes[o]) for o in outputs],
                              inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto)
    return ei.convert(proto, optimize=0)


def _feeds(count: int = 6, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(count)]


def _run(graph, feeds: list[dict]) -> list[np.ndarray]:
    session = ei.Session(Model(graph), backend="numpy")
    return [session.run(f)["y"] for f in feeds]


def _assert_same_function(before, after, feeds) -> None:
    for ref, got in zip(_run(before, feeds), _run(after, feeds), strict=True):
        assert_close(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))  # float rounding of the rescale


RELU = [helper.make_node("Relu", ["a"], ["m"])]
AFFINE = [helper.make_node("Mul", ["a", "k"], ["h"]), helper.make_node("Add", ["h", "c"], ["m"])]  # PP-LCNet's block
AFFINE_INITS = [numpy_helper.from_array(np.array(1.7, np.float32), "k"),
                numpy_helper.from_array(np.array(-0.4, np.float32), "c")]


def test_conv_relu_conv_is_equalized_data_free_and_computes_the_same():
    model = _model(RELU)
    graph, pairs = equalize(model.graph)
    assert [(p.absorber, p.reader, p.data_free) for p in pairs] == [("conv_a", "conv_b", True)]
    assert len(graph.nodes) == len(model.graph.nodes)
    graph.verify()
    feeds = _feeds()
    _assert_same_function(model.graph, graph, feeds)
    # Nagel's rule: both sides of every channel get the range sqrt(r_A r_B)
    w_a, w_b = graph.initializers[graph.nodes[0].inputs[1]], graph.initializers[graph.nodes[-1].inputs[1]]
    rows = np.abs(w_a).reshape(CHANNELS, -1).max(axis=1)
    columns = np.abs(w_b).max(axis=(0, 2, 3))
    assert_close(rows, columns, rtol=1e-5)
    before = channel_ranges(model.graph, ["a"], feeds)["a"]
    after = channel_ranges(graph, ["a"], feeds)["a"]
    assert before.max() / np.median(before) > 20 and after.max() / np.median(after) < before.max() / np.median(before) / 3


def test_affine_block_is_equalized_with_measured_ranges():
    """Conv -> Mul(k) -> Add(c) -> Conv: the scalar constants become per-channel ones."""
    model = _model(AFFINE, AFFINE_INITS)
    assert equalize(model.graph)[1] == []  # no data-free rule through an Add of a constant
    feeds = _feeds()
    graph, pairs = equalize(model.graph, feeds)
    assert [(p.absorber, p.reader, p.data_free) for p in pairs] == [("conv_a", "conv_b", False)]  # the Mul is carried through
    assert pairs[0].range_after < pairs[0].range_before
    graph.verify()
    mul, add = graph.nodes[1], graph.nodes[2]
    assert graph.initializers[mul.inputs[1]].shape == ()  # commutes with the scale
    assert graph.initializers[add.inputs[1]].shape == (1, CHANNELS, 1, 1)  # the scalar became per channel
    _assert_same_function(model.graph, graph, feeds)
    measured = channel_ranges(graph, ["m"], feeds)["m"]
    columns = np.abs(graph.initializers[graph.nodes[-1].inputs[1]]).max(axis=(0, 2, 3))
    assert_close(measured, columns, rtol=1e-4)  # both sides balanced on the samples measured


def test_a_mul_absorbs_where_no_conv_can():
    """Conv -> Sigmoid -> Mul(k) -> Add(c) -> Conv: the Mul is the furthest op that can take the scale."""
    model = _model([helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Mul", ["s", "k"], ["h"]),
                    helper.make_node("Add", ["h", "c"], ["m"])], AFFINE_INITS)
    feeds = _feeds()
    graph, pairs = equalize(model.graph, feeds)
    assert [(p.absorber, p.reader) for p in pairs] == [("h", "conv_b")]
    assert graph.initializers[graph.nodes[2].inputs[1]].shape == (1, CHANNELS, 1, 1)
    graph.verify()
    _assert_same_function(model.graph, graph, feeds)


def test_depthwise_reader_is_scaled_per_channel():
    model = _model(RELU, reader_group=CHANNELS)
    graph, pairs = equalize(model.graph)
    assert len(pairs) == 1
    _assert_same_function(model.graph, graph, _feeds())


def test_a_tensor_read_twice_is_left_alone():
    """Scaling a channel that a second reader (here a graph output) also sees would change it."""
    model = _model(RELU + [helper.make_node("Identity", ["a"], ["a_copy"])], outputs=("y",))
    assert equalization_pairs(model.graph) == []
    exposed = _model(RELU, outputs=("y", "a"))
    assert equalization_pairs(exposed.graph) == []


def test_quantize_with_equalize_records_it_and_gains_sqnr():
    model = _model(AFFINE, AFFINE_INITS, seed=3)
    samples = _feeds(12, seed=2)
    held_out = _feeds(4, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = quantize(model, samples, quality_floor=None)  # plain INT8 both: what equalization alone gains
        equalized = quantize(model, samples, equalize=True, quality_floor=None)
    record = json.loads(equalized.metadata["equalization"])
    assert record["pairs"] == 1 and record["rescaled"][0]["reader"] == "conv_b"
    sqnr = {name: output_quality(model.graph, m.graph, held_out, backend="numpy")[0].sqnr_db
            for name, m in (("plain", plain), ("equalized", equalized))}
    # one activation scale over a channel 50x the others: equalizing it gives the rest their bits back
    assert sqnr["equalized"] > sqnr["plain"] + 3, sqnr
