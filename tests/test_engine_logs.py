"""Engines' own log lines are off unless -v / EDGEINFER_DEBUG=1, and a numeric warning names its node.

The engines write to file descriptor 2 from native code, so these run the command line in a
subprocess and read its real stderr."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from devkit import zoo
from edgeinfer.cli import main

ENV = {**os.environ, "EDGEINFER_DEBUG": "0", "EDGEINFER_VERBOSE": "0"}


def edgeinfer(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeinfer.cli", *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=300)


def test_litert_xnnpack_info_line_only_with_verbose(tmp_path):
    pytest.importorskip("ai_edge_litert")
    model = tmp_path / "cnn.tflite"
    ei.export(ei.convert(zoo.cnn_residual_depthwise(size=16)), model)
    quiet = edgeinfer("run", model, "--random-inputs", "--backend", "tflite", "--repeat", 1)
    assert quiet.returncode == 0, quiet.stderr
    assert "XNNPACK" not in quiet.stderr and "latency (tflite" in quiet.stdout
    loud = edgeinfer("-v", "run", model, "--random-inputs", "--backend", "tflite", "--repeat", 1)
    assert loud.returncode == 0 and "INFO: Created TensorFlow Lite XNNPACK delegate" in loud.stderr


def test_onnxruntime_warnings_only_with_verbose(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="act")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              initializer=[numpy_helper.from_array(np.ones(3, np.float32), "unused")])
    source = tmp_path / "unused.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    # bench --peers runs the file itself in raw onnxruntime, which warns about the unused initializer
    args = ("bench", source, "--backend", "numpy", "--peers", "--runs", 2, "--top", 0)
    quiet = edgeinfer(*args)
    assert quiet.returncode == 0, quiet.stderr
    assert "[W:onnxruntime" not in quiet.stderr and "raw onnxruntime" in quiet.stdout
    loud = edgeinfer("-v", *args)
    assert loud.returncode == 0 and "[W:onnxruntime" in loud.stderr and "unused" in loud.stderr


def test_a_numpy_warning_names_the_node_once(tmp_path):
    graph = helper.make_graph([helper.make_node("Sub", ["x", "x"], ["z"], name="zero"),
                               helper.make_node("Div", ["z", "z"], ["y"], name="ratio")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    source = tmp_path / "nan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    result = CliRunner().invoke(main, ["run", str(source), "--random-inputs", "--repeat", 3])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warned == ["warning: node 'ratio' (Div): invalid value encountered in divide "
                      "(the outputs may hold NaN or inf)"], result.output
    with pytest.warns(RuntimeWarning, match="invalid value"):  # the library itself warns, nameless
        outputs = ei.Session(ei.convert(source)).run({"x": np.ones((2, 3), np.float32)})
    assert np.isnan(outputs["y"]).all()
