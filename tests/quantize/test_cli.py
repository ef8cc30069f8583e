import click
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import sqnr

import edgeinfer as ei
from devkit import zoo
from edgeinfer.cli.quantize import apply_quantization, quantize_command, quantize_options


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    proto = zoo.cnn_residual_depthwise(size=16)
    onnx.save(proto, folder / "cnn.onnx")
    calib = folder / "calib"
    calib.mkdir()
    for seed in range(6):
        np.save(calib / f"{seed}.npy", zoo.example_inputs(proto, seed=seed)["input"])
    return folder, proto


def test_quantize_command_writes_a_working_int8_model(files):
    folder, proto = files
    out = folder / "cnn.int8.eim"
    result = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "--calib", str(folder / "calib"),
                                                   "--method", "entropy", "-o", str(out),
                                                   "--report", str(folder / "layers.png")])
    assert result.exit_code == 0, result.output
    assert "weights" in result.output and "SQNR" in result.output
    assert (folder / "layers.png").read_bytes()[:4] == b"\x89PNG"
    feeds = zoo.example_inputs(proto, seed=42)
    reference = ei.Session(ei.convert(proto), backend="onnxruntime").run(feeds)["logits"]
    got = ei.Session(ei.load(out), backend="onnxruntime").run(feeds)["logits"]
    assert sqnr(reference, got) > 20


def test_quantize_command_refuses_missing_calibration_in_one_line(files):
    folder, _ = files
    result = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "-o", str(folder / "x.eim")])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "--calib" in result.output


def test_dynamic_and_fp16_need_no_calibration(files):
    folder, proto = files
    for args in (["--mode", "dynamic"], ["--weights", "fp16"]):
        out = folder / f"m{args[1]}.eim"
        result = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "-o", str(out), *args])
        assert result.exit_code == 0, result.output
        feeds = zoo.example_inputs(proto, seed=1)
        reference = ei.Session(ei.convert(proto), backend="numpy").run(feeds)["logits"]
        assert sqnr(reference, ei.Session(ei.load(out), backend="numpy").run(feeds)["logits"]) > 25


def test_convert_options_collect_into_one_keyword(files):
    folder, proto = files
    seen = {}

    @click.command()
    @click.argument("source")
    @quantize_options
    def convert(source: str, quantization):
        model = apply_quantization(ei.convert(source), quantization)
        seen["model"], seen["quantization"] = model, quantization

    runner = CliRunner()
    assert runner.invoke(convert, [str(folder / "cnn.onnx")]).exit_code == 0
    assert seen["quantization"] is None
    result = runner.invoke(convert, [str(folder / "cnn.onnx"), "--quantize", "int8", "--calib", str(folder / "calib"),
                                     "--method", "minmax"])
    assert result.exit_code == 0, result.output
    assert seen["quantization"]["mode"] == "int8" and seen["quantization"]["method"] == "minmax"
    assert seen["model"].graph.op_histogram()["QuantizeLinear"] > 0
