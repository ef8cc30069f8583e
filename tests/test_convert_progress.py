"""The steps of a big conversion (read, passes, weight check, write) are reported with their
sizes: to a library caller's ``progress``, and by ``edgeinfer convert`` one line per step in
logs (bars on a terminal), nothing with --quiet or for small models."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import edgeinfer as ei
from edgeinfer.cli import main
from edgeinfer.cli import progress as cli_progress
from edgeinfer.format import eim
from edgeinfer.progress import BYTES, human_bytes


class Recorder:
    """Steps as a caller sees them: label, total, unit, size and the amounts advanced."""

    def __init__(self) -> None:
        self.steps: list[dict] = []

    @contextlib.contextmanager
    def step(self, label, total, unit=BYTES, size=None):
        record = {"label": label, "total": total, "unit": unit, "size": size, "advanced": []}
        self.steps.append(record)

        class Step:
            def advance(self, amount: int = 1) -> None:
                record["advanced"].append(amount)

        yield Step()


@pytest.fixture
def external_model(tmp_path, rng):
    """MatMul -> MatMul with 1 MiB + 0.5 MiB of float32 weights in external data."""
    w0 = rng.standard_normal((512, 512)).astype(np.float32)
    w1 = rng.standard_normal((512, 256)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w0"], ["h"]),
                               helper.make_node("MatMul", ["h", "w1"], ["y"])], "ext",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
                              [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")])
    path = tmp_path / "ext.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path,
                    save_as_external_data=True, location="ext.onnx.data", size_threshold=1024)
    return path, w0.nbytes + w1.nbytes


def test_convert_and_save_report_every_step_with_sizes(tmp_path, external_model):
    path, weight_bytes = external_model
    recorder = Recorder()
    model = ei.convert(path, progress=recorder)
    labels = [s["label"] for s in recorder.steps]
    assert labels[0] == "read ext.onnx (external data)" and labels[-1] == "check weights (NaN, infinity)"
    assert any(label.startswith("passes, round 1") for label in labels)
    for step in recorder.steps:
        assert sum(step["advanced"]) == step["total"], step  # every step finishes at its total
        if step["unit"] == BYTES:
            assert step["total"] == weight_bytes
        else:
            assert step["unit"] == "passes" and step["size"] == weight_bytes
    recorder.steps.clear()
    model.save(tmp_path / "ext.eim", progress=recorder)
    (write,) = recorder.steps
    assert write["label"] == "write ext.eim" and write["total"] == (tmp_path / "ext.eim").stat().st_size
    assert sum(write["advanced"]) == write["total"]


def test_save_streams_strided_weights_in_blocks(tmp_path, rng, monkeypatch):
    monkeypatch.setattr(eim, "WRITE_BLOCK_BYTES", 4096)
    w = rng.standard_normal((256, 96)).astype(np.float32)
    graph = ei.ir.Graph([ei.ir.Node("MatMul", ["x", "w"], ["y"])], [ei.ir.Value("x", "float32", [1, 96])],
                        [ei.ir.Value("y", "float32", [1, 256])], {"w": w.T})  # a strided view: 96 x 256
    recorder = Recorder()
    ei.Model(graph).save(tmp_path / "t.eim", progress=recorder)
    (write,) = recorder.steps
    assert len(write["advanced"]) > w.nbytes // 4096  # written a block at a time
    np.testing.assert_array_equal(ei.load(tmp_path / "t.eim").graph.initializers["w"], w.T)


def _convert(*args):
    return CliRunner().invoke(main, ["convert", *map(str, args)], catch_exceptions=False)


def test_cli_prints_one_line_per_step_with_sizes(tmp_path, external_model, monkeypatch):
    monkeypatch.setattr(cli_progress, "SHOWN_STEP_BYTES", 1 << 20)  # this 1.5 MiB model counts as big
    path, weight_bytes = external_model
    size = human_bytes(weight_bytes)
    number, unit = size.split(" ")
    result = _convert(path, "-o", tmp_path / "ext.eim")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "read ext.onnx (external data)", f"passes, round 1 ({size} of weights)", "check weights (NaN, infinity)",
        "write ext.eim"]
    assert lines[0].startswith(f"read ext.onnx (external data): {number}/{number} {unit} in ")
    assert f"check weights (NaN, infinity): {number}/{number} {unit}" in lines[2]
    file_size = human_bytes((tmp_path / "ext.eim").stat().st_size)
    assert lines[3].startswith(f"write ext.eim: {file_size.split()[0]}/{file_size}")
    done, total = lines[1].split(": ")[1].split()[0].split("/")  # "11/11 passes in 0.01 s"
    assert done == total and int(total) > 0 and " passes in " in lines[1]
    assert result.stdout.startswith("wrote ")


def test_cli_quiet_and_small_models_print_no_steps(tmp_path, external_model, monkeypatch):
    path, _ = external_model
    result = _convert(path, "-o", tmp_path / "a.eim")  # 1.5 MiB: below the default size shown
    assert result.exit_code == 0 and result.stderr == ""
    monkeypatch.setattr(cli_progress, "SHOWN_STEP_BYTES", 1 << 20)
    result = _convert(path, "-o", tmp_path / "b.eim", "--quiet")
    assert result.exit_code == 0 and result.stderr == ""
