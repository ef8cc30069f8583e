"""ONNX export and output shapes on what real files do (issue 19): a model optimized at level 2
exports standard ONNX only; ``input_shapes`` gives every output a concrete shape through the
shape subgraphs paddle2onnx and onnx.version_converter write; a declared output rank the ops
do not produce is replaced by the one they do. onnxruntime is the oracle and the checker
(``full_check``) judges every exported file."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.converters.onnx import export
from edgeinfer.errors import UnsupportedOpError
from edgeinfer.ir import Graph, Node, Value


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def tensor(name, array) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(array), name)


def paddle_style_head(opset: int = 11) -> onnx.ModelProto:
    """Conv -> HardSigmoid -> GlobalAveragePool -> Reshape to [batch, C] through
    ``Concat(Slice(Shape(x)), Cast(200))`` -> MatMul -> Softmax, dims declared -1, as
    paddle2onnx writes PP-OCR's direction classifier. At opset 11 the front end's upgrade
    to 13 turns the Softmax into ``Shape -> Flatten -> Softmax -> Reshape``."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSigmoid", ["c"], ["h"]),
        helper.make_node("GlobalAveragePool", ["h"], ["p"]),
        helper.make_node("Shape", ["p"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one", "zero"], ["batch"]),
        helper.make_node("Cast", ["channels32"], ["channels"], to=TensorProto.INT64),
        helper.make_node("Concat", ["batch", "channels"], ["target"], axis=0),
        helper.make_node("Reshape", ["p", "target"], ["flat"]),
        helper.make_node("MatMul", ["flat", "fc"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1),
    ]
    inits = [tensor("w", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
             tensor("zero", np.array([0], np.int64)), tensor("one", np.array([1], np.int64)),
             tensor("channels32", np.array([8], np.int32)),
             tensor("fc", rng.standard_normal((8, 2)).astype(np.float32))]
    graph = helper.make_graph(nodes, "paddle-onnx", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, -1, -1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("optimize", [0, 1, 2])
@pytest.mark.parametrize("opset", [11, 13, 17])
def test_input_shapes_make_every_output_shape_concrete(opset, optimize, tmp_path):
    model = paddle_style_head(opset)
    x = np.random.default_rng(1).standard_normal((1, 3, 24, 40)).astype(np.float32)
    (expected,) = ort_run(model, {"x": x})
    converted = ei.convert(model, input_shapes={"x": (1, 3, 24, 40)}, optimize=optimize)
    assert [tuple(v.shape) for v in converted.outputs] == [(1, 2)]
    path = tmp_path / "static.onnx"
    ei.export(converted, path)
    written = onnx.load(path)
    onnx.checker.check_model(written, full_check=True)
    assert [d.dim_value for d in written.graph.output[0].type.tensor_type.shape.dim] == [1, 2]
    assert_close(ort_run(written, {"x": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_declared_symbols_bound_by_input_shapes_carry_to_outputs():
    """An output whose shape inference cannot reach keeps its declared rank, with the symbols
    the given input shapes bind substituted."""
    body = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    node = helper.make_node("If", ["flag"], ["y"], then_branch=body, else_branch=other)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
                                            helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    converted = ei.convert(model, input_shapes={"x": (3, 4)})
    assert tuple(converted.outputs[0].shape) == (3, 4)


def test_a_declared_output_rank_the_ops_do_not_produce_is_replaced(tmp_path):
    """ddddocr's recognizer declares its output ``[1, seqlen]``; its Reshape makes it rank 3."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seqlen"])],
                              [tensor("shape", np.array([6, 1, -1], np.int64))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    (expected,) = ort_run(model, {"x": x})
    converted = ei.convert(model)
    assert tuple(converted.outputs[0].shape) == expected.shape == (6, 1, 4)
    path = tmp_path / "rank.onnx"
    ei.export(converted, path)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    assert_close(ort_run(onnx.load(path), {"x": x})[0], expected)


def test_optimize_2_exports_standard_onnx_only(tmp_path):
    """FusedConv, FusedGemm and friends are lowered back on export, so onnxruntime (and any
    other engine) loads the file."""
    model = paddle_style_head(17)
    x = np.random.default_rng(2).standard_normal((2, 3, 16, 16)).astype(np.float32)
    (expected,) = ort_run(model, {"x": x})
    converted = ei.convert(model, optimize=2)
    assert any(node.domain == "edgeinfer" for node in converted.graph.nodes)
    path = tmp_path / "fused.onnx"
    ei.export(converted, path)
    written = onnx.load(path)
    assert {node.domain for node in written.graph.node} <= {"", "ai.onnx"}
    assert {o.domain for o in written.opset_import} <= {"", "ai.onnx"}
    onnx.checker.check_model(written, full_check=True)
    assert_close(ort_run(written, {"x": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_an_edgeinfer_op_without_lowering_is_refused_before_writing(tmp_path):
    graph = Graph([Node("NoSuchFusedOp", ["x"], ["y"], {}, domain="edgeinfer", name="fused7")],
                  [Value("x", "float32", (2,))], [Value("y", "float32", (2,))], {})
    path = tmp_path / "refused.onnx"
    with pytest.raises(UnsupportedOpError, match="fused7.*no lowering to standard ONNX"):
        export(graph, path)
    assert not path.exists()
