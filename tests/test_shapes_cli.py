"""--shape on run, bench, convert --verify and inspect: symbolic dims are bound by the user, or by a
default that is said in one line; a default 1 past the first dim is refused where timing happens."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.cli import main

SAMPLE = Path(__file__).resolve().parents[1] / "models" / "sample_cnn.onnx"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def dynamic_cnn(tmp_path_factory) -> Path:
    """The shipped sample CNN (GlobalAveragePool head) with its input made N x 3 x H x W."""
    model = onnx.load(SAMPLE)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, symbol in zip(dims, ("N", None, "H", "W")):
        if symbol:
            dim.dim_param = symbol
    del model.graph.value_info[:]
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    path = tmp_path_factory.mktemp("dyn") / "dynamic_cnn.onnx"
    onnx.save(model, path)
    return path


def test_run_with_shape_feeds_that_shape_and_matches_the_fixed_model(dynamic_cnn):
    result = invoke("run", dynamic_cnn, "--random-inputs", "--shape", "input:2x3x64x64", "--repeat", 1,
                    "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["outputs"]["logits"]["shape"] == [2, 10]
    # the same random feed through the shipped fixed-shape model (batch 1 slice) agrees
    fixed = ei.Session(ei.convert(SAMPLE))
    feed = ei.convert(dynamic_cnn).random_feeds(shapes={"input": (2, 3, 64, 64)})["input"]
    dynamic = ei.Session(ei.convert(dynamic_cnn)).run({"input": feed})["logits"]
    assert_close(dynamic[:1], fixed.run({"input": feed[:1]})["logits"], rtol=1e-4, atol=1e-5)


def test_bare_shape_names_the_only_input(dynamic_cnn):
    result = invoke("run", dynamic_cnn, "--random-inputs", "--shape", "1x3x32x32", "--repeat", 1)
    assert result.exit_code == 0, result.output
    assert "output logits: float32[1, 10]" in result.output
    assert "by default" not in result.output


def test_a_spatial_dim_left_at_1_is_refused_for_timing_unless_asked(dynamic_cnn):
    for command in (("run", "--random-inputs"), ("bench", "--backend", "numpy", "--runs", 1, "--top", 0)):
        result = invoke(command[0], dynamic_cnn, *command[1:])
        assert result.exit_code == 2, result.output
        assert "input dim 2 (H)" in result.output and "--shape" in result.output
        assert "Traceback" not in result.output
    # asked: it runs at 1x3x1x1, says so, and (this model pools 2x2) fails in one line naming the node
    result = invoke("run", dynamic_cnn, "--random-inputs", "--allow-unit-dims", "--repeat", 1)
    assert "shapes: symbolic dims N=1, H=1, W=1 by default (inputs input:1x3x1x1)" in result.output
    assert result.exit_code == 2 and "node 'pool' (MaxPool)" in result.output, result.output


def test_bench_with_shape_times_that_shape(dynamic_cnn):
    result = invoke("bench", dynamic_cnn, "--backend", "numpy", "--shape", "input:1x3x48x48", "--runs", 2,
                    "--warmup", 0, "--top", 0, "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["settings"]["feeds"] == {"input": [1, 3, 48, 48]}


@pytest.mark.parametrize("shape, message", [
    ("input:1x4x64x64", "--shape input:1x4x64x64: input 'input': expected shape [N, 3, H, W], got [1, 4, 64, 64] (dim 1 must be 3)"),
    ("input:1x3x64", "expected rank 4 shape [N, 3, H, W], got rank 3"),
    ("other:1x3x64x64", "--shape names ['other']"),
    ("input:1x3xHx64", "dim 'h' is not a number"),
])
def test_a_shape_the_model_cannot_take_is_one_line(dynamic_cnn, shape, message):
    result = invoke("run", dynamic_cnn, "--random-inputs", "--shape", shape)
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_inspect_counts_flops_at_the_shape_it_names(dynamic_cnn):
    fixed = ei.convert(SAMPLE).summary()["flops"]
    result = invoke("inspect", dynamic_cnn, "--shape", "input:1x3x64x64")
    assert result.exit_code == 0, result.output
    assert f"flops   {fixed:,.0f}" in result.output and "at input:1x3x64x64" in result.output
    result = invoke("inspect", dynamic_cnn)
    assert "symbolic dims N, H, W counted as 1" in result.output
    at_one = ei.convert(dynamic_cnn).summary()["flops"]
    assert at_one < fixed / 100  # why --shape matters: 1x1 counts next to nothing
    result = invoke("inspect", SAMPLE)
    assert "at the declared shapes" in result.output


def test_convert_verify_runs_on_the_shape_given(dynamic_cnn, tmp_path):
    result = invoke("convert", dynamic_cnn, "-o", tmp_path / "m.eim", "--verify", "--shape", "input:1x3x40x40")
    assert result.exit_code == 0, result.output
    assert "on random inputs input:1x3x40x40" in result.output and "ok" in result.output
    result = invoke("convert", dynamic_cnn, "-o", tmp_path / "m.eim", "--shape", "input:1x3x40x40")
    assert result.exit_code == 2 and "go with --verify" in result.output


@pytest.mark.parametrize("flag", [("--backend", "auto"), ("--executor", "auto")])
def test_auto_decides_on_the_shape_given(dynamic_cnn, flag):
    """auto on a model with symbolic dims times the candidates on the --shape feeds (the
    runtime never guesses dims), and the output has that shape."""
    result = invoke("run", dynamic_cnn, "--random-inputs", "--shape", "input:2x3x48x48", "--repeat", 1,
                    "--threads", 2, *flag)
    assert result.exit_code == 0, result.output
    assert "output logits: float32[2, 10]" in result.output
    assert "auto: chose" in result.output or "executor" in result.output
