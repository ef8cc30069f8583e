"""Export classes that real models need (issue 19): grouped convolution, LRN, a YOLOv8-style
head that broadcasts rank-2 strides against rank-3 boxes, PRelu and DepthToSpace. Each graph
runs in onnxruntime (the reference), as an exported ``.tflite`` in LiteRT, and on the tflite
backend, which must take every node."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import numpy_helper

import edgeinfer as ei
from devkit.testing import assert_close

ort = pytest.importorskip("onnxruntime")
litert = pytest.importorskip("ai_edge_litert.interpreter")

RNG = np.random.default_rng(0)


def _weights(**arrays: np.ndarray) -> list:
    return [numpy_helper.from_array(np.asarray(a), name) for name, a in arrays.items()]


CASES = {
    "grouped_conv_lrn": ("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 8, 12, 12] x) => (float[1, 12, 12, 12] y) {
            c = Conv <group = 2, pads = [1, 1, 1, 1]> (x, W, B)
            y = LRN <size = 5, alpha = 0.001, beta = 0.75, bias = 1.0> (c)
        }""", _weights(W=RNG.standard_normal((12, 4, 3, 3)).astype(np.float32),
                       B=RNG.standard_normal(12).astype(np.float32)), (1, 8, 12, 12), {"CONV_2D", "LOCAL_RESPONSE_NORMALIZATION"}),
    "yolov8_head_broadcast": ("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 3, 16, 16] x) => (float[1, 8, 64] y) {
            c = Conv <strides = [2, 2], pads = [1, 1, 1, 1]> (x, W)
            r = Reshape (c, shape)
            a, b = Split <axis = 1> (r, split)
            s = Sigmoid (b)
            m = ReduceMean <axes = [1], keepdims = 0> (s)
            boxes = Mul (a, strides)
            scored = Mul (a, m)
            y = Concat <axis = 1> (boxes, scored)
        }""", _weights(W=RNG.standard_normal((8, 3, 3, 3)).astype(np.float32),
                       strides=RNG.standard_normal((1, 64)).astype(np.float32),
                       shape=np.array([1, 8, 64], np.int64), split=np.array([4, 4], np.int64)),
        (1, 3, 16, 16), {"MUL"}),
    "prelu_depth_to_space": ("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 8, 6, 6] x) => (float[1, 2, 12, 12] y) {
            p = PRelu (x, slope)
            y = DepthToSpace <blocksize = 2, mode = "DCR"> (p)
        }""", _weights(slope=RNG.uniform(0.1, 0.5, (8, 1, 1)).astype(np.float32)), (1, 8, 6, 6),
        {"PRELU", "DEPTH_TO_SPACE"}),
}


def _model(text: str, weights: list) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(weights)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("case", sorted(CASES))
def test_exports_and_runs_on_tflite(case, tmp_path):
    from edgeinfer.converters.tflite.reader import read_model

    text, weights, shape, opcodes = CASES[case]
    path = tmp_path / f"{case}.onnx"
    onnx.save(_model(text, weights), path)
    x = RNG.standard_normal(shape).astype(np.float32)
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    model = ei.convert(path)

    exported = tmp_path / f"{case}.tflite"
    ei.export(model, exported)
    written = {op.opcode for op in read_model(exported.read_bytes()).subgraphs[0].operators}
    assert opcodes <= written, written
    interpreter = litert.Interpreter(model_path=str(exported), num_threads=2)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    assert_close(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]), reference)

    with ei.Session(model, backend="tflite", threads=2) as session:
        assert set(session.plan.node_counts()) == {"tflite"}, session.plan.node_counts()
        assert_close(next(iter(session.run({"x": x}).values())), reference)


def test_even_lrn_is_refused_with_a_reason(tmp_path):
    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 4, 5, 5] x) => (float[1, 4, 5, 5] y) { y = LRN <size = 4> (x) }"""
    path = tmp_path / "lrn4.onnx"
    onnx.save(_model(text, []), path)
    with pytest.raises(ei.EdgeInferError, match="even LRN size"):
        ei.export(ei.convert(path), tmp_path / "lrn4.tflite")
