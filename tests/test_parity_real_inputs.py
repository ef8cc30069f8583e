"""``convert --verify`` on what real models bring (issue 19): outputs that are themselves tiny
are judged by the corpus rule (relative plus an absolute floor), a model with dynamic dims gets
a one-line error naming the inputs instead of an internal error, and real inputs (``-i``)
replace the random ones."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from edgeinfer.cli import main
from edgeinfer.cli import parity as verification


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_tiny_outputs_are_judged_with_an_absolute_floor():
    ref = np.full(8, 2e-6, np.float32)
    got = ref + np.float32(1e-7)  # 5% of the output, 1e-7 absolute: no mismatch
    max_abs, max_rel, ok = verification.compare(got, ref, 1e-4)
    assert ok and max_rel > 1e-4 and max_abs < verification.ABSOLUTE_FLOOR
    assert not verification.compare(ref + np.float32(1e-3), ref, 1e-4)[2]
    assert not verification.compare(np.full(8, 1.01, np.float32), np.ones(8, np.float32), 1e-4)[2]


@pytest.fixture
def dynamic_detector(tmp_path):
    """A 3x3 convolution without padding, spatial dims symbolic: random inputs bind them to 1,
    which onnxruntime refuses (the kernel is larger than the image)."""
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "oh", "ow"])], [w])
    path = tmp_path / "dynamic.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    image = tmp_path / "photo.npy"
    np.save(image, rng.uniform(-1, 1, (1, 3, 32, 48)).astype(np.float32))
    return path, image


def test_dynamic_dims_without_real_inputs_is_a_one_line_error(tmp_path, dynamic_detector):
    path, _ = dynamic_detector
    result = invoke("convert", path, "-o", tmp_path / "m.eim", "--verify", "-q")
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: onnxruntime could not run the source model on inputs "
                                                   "of shapes {'x': (1, 3, 1, 1)}"), lines
    assert "-i NAME=FILE.npy" in lines[0]
    assert not (tmp_path / "m.eim").exists()


def test_real_inputs_replace_random_ones(tmp_path, dynamic_detector):
    path, image = dynamic_detector
    out = tmp_path / "m.eim"
    result = invoke("convert", path, "-o", out, "--verify", "-q", "-i", f"x={image}")
    assert result.exit_code == 0, result.output
    assert "on given inputs" in result.output and "ok" in result.output and out.exists()


def test_input_without_verify_is_an_error(tmp_path, dynamic_detector):
    path, image = dynamic_detector
    result = invoke("convert", path, "-o", tmp_path / "m.eim", "-i", f"x={image}")
    assert result.exit_code == 2 and "go with --verify" in result.output
