"""Shape, comparisons, logical ops and Where exported to .tflite (SHAPE + GATHER, EQUAL, LESS,
..., LOGICAL_*, SELECT_V2). Each graph runs in LiteRT and in onnx's reference evaluator on the
same inputs, with a dynamic batch fed larger than the file's declared 1, and after a Conv so
that the exporter holds the activation in NHWC. basic-pitch's ``nmp.tflite`` (Shape of its
dynamic batch, ``div_no_nan`` as Equal + Where) was split into 9 parts by these ops; it is one
flatbuffer now."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator

import edgeinfer as ei
from devkit.testing import assert_close, parse_model
from edgeinfer.converters.tflite.reader import read_model
from edgeinfer.format.tflite import export_tflite, node_support
from edgeinfer.format.tflite.schema import TENSOR_TYPE_CODES

from .conftest import opcodes, run_flatbuffer

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
CONV_X = "float[N, 3, 6, 6] x"
BATCH = 3  # fed for the symbolic N (the file declares 1, LiteRT resizes)


def _conv_weights() -> str:
    values = np.random.default_rng(0).normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)
    return f"float[4, 3, 3, 3] w = {{{', '.join(f'{v:.6f}' for v in values.reshape(-1))}}}"


CASES = {  # name -> (inputs, outputs, initializers, body)
    "shape_dynamic_batch": ("float[N, 3, 5] x", "int64[3] y", "", "y = Shape (x)"),
    # c is held in NHWC only: SHAPE of that tensor, GATHER back into the IR's order
    "shape_after_conv": (CONV_X, "int64[4] s, int64[2] t", _conv_weights(),
                         "c = Conv <pads = [1, 1, 1, 1]> (x, w)\ns = Shape (c)\nt = Shape <start = -4, end = 2> (c)"),
    "compare_after_conv": (CONV_X, "float[N, 4, 6, 6] y, bool[N, 4, 6, 6] k", _conv_weights(),
                           "c = Conv <pads = [1, 1, 1, 1]> (x, w)\nr = Relu (c)\n"
                           "z = Constant <value = float {0}> ()\nb = Constant <value = float[4, 1, 1] {0.5, -1, 2, 0}> ()\n"
                           "e = Equal (r, z)\ny = Where (e, b, c)\nl = Less (c, b)\ng = GreaterOrEqual (c, z)\n"
                           "n = Not (g)\no = Or (l, n)\nk = And (o, e)"),
    # basic-pitch's normalized_log: tf.math.divide_no_nan by the per-example maximum
    "div_no_nan": ("float[N, 4, 5] x", "float[N, 4, 5] y", "",
                   "m = ReduceMax <axes = [1, 2], keepdims = 1> (x)\nz = Constant <value = float {0}> ()\n"
                   "e = Equal (m, z)\nq = Div (x, m)\ny = Where (e, z, q)"),
    "compare_int64": ("int64[N, 3] a, int64[3] b", "bool[N, 3] le, bool[N, 3] gt, bool[N, 3] eq", "",
                      "le = LessOrEqual (a, b)\ngt = Greater (a, b)\neq = Equal (a, b)"),
}


def _onnx(name: str):
    inputs, outputs, initializers, body = CASES[name]
    return parse_model(f"{HEADER}\nt ({inputs}) => ({outputs})\n" + (f"<{initializers}>\n" if initializers else "")
                       + "{\n" + body + "\n}")


def _feeds(onnx_model) -> dict[str, np.ndarray]:
    """Small integers (as float where the input is float), so comparisons see ties; the first
    example of a float input is all zeros (div_no_nan's maximum 0)."""
    rng = np.random.default_rng(0)
    feeds = {}
    for value in onnx_model.graph.input:
        shape = [d.dim_value or BATCH for d in value.type.tensor_type.shape.dim]
        array = rng.integers(-2, 3, shape)
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            array = array.astype(np.float32)
            array[0] = 0
        feeds[value.name] = array
    return feeds


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("resolver", ["builtin", "xnnpack"])
def test_op_matches_onnx_reference(name, resolver):
    onnx_model = _onnx(name)
    model = ei.convert(onnx_model, optimize=0)
    assert all(node_support(node, model.graph) is None for node in model.graph.nodes)
    feeds = _feeds(onnx_model)
    with np.errstate(divide="ignore", invalid="ignore"):  # div_no_nan divides 0 by 0 before it selects
        expected = ReferenceEvaluator(onnx_model).run(None, feeds)
        numpy_out = list(ei.Session(model, backend="numpy").run(feeds).values())
    got = run_flatbuffer(export_tflite(model.graph), feeds, resolver)
    assert len(got) == len(expected) == len(numpy_out)
    for index, (g, n, e) in enumerate(zip(got, numpy_out, expected, strict=True)):
        assert g.dtype == e.dtype, (index, g.dtype, e.dtype)
        assert_close(n, e, name=f"{name} numpy backend output {index}")
        assert_close(g, e, name=f"{name} LiteRT output {index}")


def test_shape_of_an_nhwc_value_gathers_its_dims():
    """SHAPE reads the conv's NHWC tensor as it is (no TRANSPOSE back to NCHW for it); a GATHER
    puts the dims in the IR's order, [start, end) included."""
    ops = opcodes(export_tflite(ei.convert(_onnx("shape_after_conv"), optimize=0).graph))
    assert ops.count("SHAPE") == 2 and ops.count("GATHER") == 2
    assert ops.count("TRANSPOSE") == 1  # only x, into NHWC for the conv


def test_comparisons_and_where_stay_in_nhwc():
    """Element-wise like ADD: in the conv output's NHWC, the constants transposed to it; the
    two graph outputs go back to NCHW, the input into NHWC, and nothing else moves."""
    ops = opcodes(export_tflite(ei.convert(_onnx("compare_after_conv"), optimize=0).graph))
    assert ops.count("TRANSPOSE") == 3
    assert {"EQUAL", "SELECT_V2", "LESS", "GREATER_EQUAL", "LOGICAL_NOT", "LOGICAL_OR", "LOGICAL_AND"} <= set(ops)


QDQ = ('<ir_version: 9, opset_import: ["" : 19]>\n'
       "t (float[N, 3, 4] x) => (float[N, 3, 4] y, int64[3] s)\n<float sc = {0.05}, int8 zp = {0}>\n"
       "{\n q = QuantizeLinear (x, sc, zp)\n d = DequantizeLinear (q, sc, zp)\n s = Shape (d)\n"
       " z = Constant <value = float {0}> ()\n g = Greater (d, z)\n w = Where (g, d, z)\n"
       " wq = QuantizeLinear (w, sc, zp)\n y = DequantizeLinear (wq, sc, zp)\n}")


def test_quantized_graph_compares_and_selects_in_float():
    """These rules have no integer kernel (``int8="none"``): between a QDQ model's int8 tensors
    GREATER and SELECT_V2 run on the DEQUANTIZEd float and a QUANTIZE stores the result; SHAPE
    reads the int8 tensor itself."""
    onnx_model = parse_model(QDQ)
    model = ei.convert(onnx_model, optimize=0)
    x = np.random.default_rng(1).standard_normal((BATCH, 3, 4)).astype(np.float32)
    data = export_tflite(model.graph)
    ops = opcodes(data)
    assert ops.count("DEQUANTIZE") == 2 and "SELECT_V2" in ops and "QUANTIZE" in ops, ops
    subgraph = read_model(data).subgraphs[0]
    (shape_op,) = [op for op in subgraph.operators if op.opcode == "SHAPE"]
    assert subgraph.tensors[shape_op.inputs[0]].type_code == TENSOR_TYPE_CODES["int8"]
    got = dict(zip(["y", "s"], run_flatbuffer(data, {"x": x}), strict=True))
    expected = dict(zip(["y", "s"], ReferenceEvaluator(onnx_model).run(None, {"x": x}), strict=True))
    assert_close(got["s"], expected["s"], name="shape")
    assert_close(got["y"], expected["y"], atol=0.05 * 1.01, rtol=0, name="where")  # one int8 step of scale 0.05


def test_shape_with_an_empty_range_is_refused():
    """``start >= end`` of a graph output (not folded: the interface stays computed) is an
    empty tensor, which TFLite computes with no operator."""
    model = ei.convert(parse_model(f"{HEADER}\nt (float[N, 3] x) => (int64[0] y)\n{{ y = Shape <start = 1, end = 1> (x) }}"),
                       optimize=0)
    assert "empty" in node_support(model.graph.nodes[0], model.graph)


def test_comparison_of_unsigned_operands_is_refused():
    """LiteRT's comparison kernels take no uint16/uint32/uint64 (they fail when invoked)."""
    model = ei.convert(parse_model(f"{HEADER}\nt (uint32[3] a, uint32[3] b) => (bool[3] y)\n{{ y = Less (a, b) }}"),
                       optimize=0)
    assert "uint32" in node_support(model.graph.nodes[0], model.graph)


def test_basic_pitch_nmp_is_one_tflite_part():
    """The corpus's basic-pitch ``nmp.tflite``: every node has a rule, the tflite backend runs it
    as one flatbuffer (it was 5 LiteRT parts and 4 numpy parts) and matches LiteRT on the file."""
    from tests.real.checks import compare, run_litert
    from tests.real.corpus import model_file
    from tests.real.models_tflite import BASIC_PITCH, MODELS, basic_pitch_window

    path = model_file("basic-pitch", BASIC_PITCH + "nmp.tflite")
    model = ei.convert(path)
    assert [node.label for node in model.graph.nodes if node_support(node, model.graph)] == []
    feeds = basic_pitch_window()
    with ei.Session(model, backend="tflite", threads=2) as session:
        assert [part.backend for part in session.plan.parts] == ["tflite"]
        got = list(session.run(dict(zip([info.name for info in model.inputs], feeds, strict=True))).values())
    entry = next(m for m in MODELS if m.id == "basic-pitch/nmp_tflite")
    compare(got, run_litert(path, feeds), entry, "tflite backend")
