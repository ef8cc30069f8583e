"""``backend="auto"`` on a model whose symbolic dims cannot be 1 (issue 19: nudenet's YOLOv8
and silero's VADs): auto never times candidates on guessed dims (random feeds with every symbol
at 1 would fail there); it decides on the first real input of each shape signature."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import edgeinfer as ei
from devkit.testing import assert_close


def test_auto_keeps_the_default_when_random_feeds_cannot_run():
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",  # 3x3, no padding: not at 1x1
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "oh", "ow"])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.uniform(-1, 1, (1, 3, 20, 24)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with ei.Session(ei.convert(model), backend="auto", options=ei.AutoOptions(cache=False)) as session:
        assert session.auto_choice is None  # nothing decided on guessed dims
        assert_close(session.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-5)
        assert session.auto_choice.median_ms  # measured on the real 20x24 input
