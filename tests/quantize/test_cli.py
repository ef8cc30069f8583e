import json

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


def test_report_is_sorted_worst_first_explains_inf_and_plots_the_worst_30_legibly(files):
    import re

    folder, _ = files
    out, png = folder / "sorted.int8.eim", folder / "worst.png"
    result = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "--calib", str(folder / "calib"),
                                                   "-o", str(out), "--report", str(png), "-q"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("per-layer error vs fp32 on 6 sample(s)"))
    values = []
    for line in lines[start + 2:]:
        found = re.match(r"^\S+\s+\S+\s+(inf|-?[\d.]+)\s+[\d.]+$", line)
        if not found:
            break
        values.append(float(found.group(1)))
    assert len(values) > 3 and values == sorted(values)  # worst (lowest SQNR) first, inf last
    if "inf" in result.output.split("worst first")[1]:
        assert "inf: " in result.output and "equals the float one exactly" in result.output
    import matplotlib.image

    height, width = matplotlib.image.imread(png).shape[:2]
    assert width <= 1000 and height <= 0.32 * 100 * 30 + 260  # one readable bar per layer, at most 30


def test_fewer_than_16_calibration_samples_warn_and_the_bar_has_a_total(files, monkeypatch):
    """The calibration step the command renders knows its total ("6/6 samples", not "0/?")."""
    from contextlib import contextmanager

    import edgeinfer.cli.progress as cli_progress

    folder, _ = files
    steps_told = []
    real = cli_progress.step_reporter

    @contextmanager
    def recording(label, *, quiet=False):
        with real(label, quiet=quiet) as steps:
            class Spy:
                def step(self, label, total, unit="bytes", size=None):
                    steps_told.append((label, total, unit))
                    return steps.step(label, total, unit, size)

            yield Spy()

    monkeypatch.setattr(cli_progress, "step_reporter", recording)
    result = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "--calib", str(folder / "calib"),
                                                   "-o", str(folder / "few.int8.eim")])
    assert result.exit_code == 0, result.output
    assert "warning: calibrated on 6 sample(s): ranges from fewer than 16" in result.output
    assert ("calibrating", 6, "samples") in steps_told


def test_quantize_command_exits_0_but_says_when_quality_is_poor(files, tmp_path):
    """Held-out samples 100x larger than the calibration ones saturate: the guard says it."""
    folder, proto = files
    calib = tmp_path / "calib"
    calib.mkdir()
    for seed in range(10):
        scale = 100.0 if seed % 5 == 4 else 1.0
        np.save(calib / f"{seed}.npy", zoo.example_inputs(proto, seed=seed)["input"] * scale)
    result = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "--calib", str(calib),
                                                   "--method", "minmax", "--quality-floor", "off",
                                                   "-o", str(tmp_path / "q.eim")])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "INT8 quality below" in line]
    assert len(lines) == 1 and "worst layers" in lines[0]
    assert (tmp_path / "q.eim").exists()


def test_quantize_command_refuses_an_unknown_exclude_in_one_line(files, tmp_path):
    folder, _ = files
    result = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "--calib", str(folder / "calib"),
                                                   "--exclude", "no_such_layer", "-o", str(tmp_path / "q.eim")])
    assert result.exit_code != 0
    assert result.output.count("\n") == 1 and "no_such_layer" in result.output
    assert not (tmp_path / "q.eim").exists()


def test_weight_only_int4_from_the_command_line_with_progress(tmp_path, monkeypatch):
    """``--weights int4 --mode weight_only``: the packed model of ``ei.quantize`` (same outputs,
    bit for bit), the quantize step reported with its size; calibration options refused."""
    from onnx import TensorProto, helper, numpy_helper

    from edgeinfer.cli import progress as cli_progress

    w = np.random.default_rng(0).standard_normal((256, 128)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 128])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "mm.onnx")
    monkeypatch.setattr(cli_progress, "SHOWN_STEP_BYTES", 0)  # report the steps of this small model
    out = tmp_path / "mm.int4.eim"
    result = CliRunner().invoke(quantize_command, [str(tmp_path / "mm.onnx"), "-o", str(out), "--weights", "int4",
                                                   "--mode", "weight_only", "--block-size", "64"])
    assert result.exit_code == 0, result.output
    assert "quantize weights to int4, block 64: 128.0/128.0 KiB" in result.stderr
    expected = ei.quantize(ei.convert(tmp_path / "mm.onnx"), weights="int4", mode="weight_only", block_size=64)
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)}
    np.testing.assert_array_equal(ei.Session(ei.load(out)).run(feeds)["y"], ei.Session(expected).run(feeds)["y"])
    refused = CliRunner().invoke(quantize_command, [str(tmp_path / "mm.onnx"), "-o", str(out), "--weights", "int4",
                                                    "--calib-random", "4"])
    assert refused.exit_code == 2 and refused.output.count("\n") == 1 and "no calibration" in refused.output


def test_quantize_command_min_sqnr_says_what_stayed_float(files, tmp_path):
    import json

    folder, proto = files
    out = tmp_path / "mixed.eim"
    result = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "--calib", str(folder / "calib"),
                                                   "--min-sqnr", "60", "--equalize", "-o", str(out)])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("mixed precision:"))
    record = json.loads(ei.load(out).metadata["quantization"])["mixed_precision"]
    assert record["min_sqnr_db"] == 60 and f"{record['float_layers']} layers kept float" in line
    assert record["float_layers"] > 0 and record["met"]
    assert "equalization" in ei.load(out).metadata
    refused = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "--mode", "dynamic", "--min-sqnr", "30",
                                                    "-o", str(tmp_path / "d.eim")])
    assert refused.exit_code != 0 and refused.output.count("\n") == 1


def test_quantize_command_calibrates_images_in_the_layout_given(tmp_path):
    """An NHWC input of 3 rows looks NCHW to the guess ([1, 3, 8, 3]); --layout NHWC makes the
    images calibrate as the model reads them: the same model as ei.quantize on those arrays."""
    import cv2
    from onnx import TensorProto, helper, numpy_helper

    from edgeinfer.quantize.data import image_array

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
                               helper.make_node("Conv", ["t", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
                              "nhwc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 8])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "nhwc.onnx")
    images = tmp_path / "images"
    images.mkdir()
    for index in range(4):
        cv2.imwrite(str(images / f"{index}.png"), rng.integers(0, 256, (3, 8, 3), dtype=np.uint8))
    out = tmp_path / "q.eim"
    result = CliRunner().invoke(quantize_command, [str(tmp_path / "nhwc.onnx"), "--calib", str(images),
                                                   "--layout", "NHWC", "-o", str(out)])
    assert result.exit_code == 0, result.output
    model = ei.convert(str(tmp_path / "nhwc.onnx"))
    value = model.graph.inputs[0]
    samples = [{"x": image_array(images / f"{i}.png", value, layout="NHWC")} for i in range(4)]
    assert samples[0]["x"].shape == (1, 3, 8, 3)
    expected = ei.quantize(model, samples)
    feeds = {"x": rng.standard_normal((1, 3, 8, 3)).astype(np.float32)}
    np.testing.assert_array_equal(ei.Session(ei.load(out)).run(feeds)["y"], ei.Session(expected).run(feeds)["y"])


def test_float_weights_option_stores_the_excluded_layers_weights_as_int8(files, tmp_path):
    """--exclude keeps a layer float with float32 weights; --float-weights int8 keeps it float with
    int8-stored weights: a smaller file, the same outputs as ei.quantize with the same options."""
    from edgeinfer.ir.weights import int8_stored_weights
    from edgeinfer.quantize import quantize

    folder, proto = files
    model = ei.convert(proto)
    first = next(n for n in model.graph.nodes if n.op_type in ("Conv", "FusedConv"))
    outs = {}
    for choice in ("float32", "int8"):
        outs[choice] = tmp_path / f"{choice}.eim"
        result = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "--calib", str(folder / "calib"),
                                                       "--exclude", first.name, "--float-weights", choice,
                                                       "-o", str(outs[choice])])
        assert result.exit_code == 0, result.output
    int8, whole = ei.load(outs["int8"]), ei.load(outs["float32"])
    assert len(int8_stored_weights(int8.graph.metadata)) == 1 and not int8_stored_weights(whole.graph.metadata)
    assert outs["int8"].stat().st_size < outs["float32"].stat().st_size
    feeds = zoo.example_inputs(proto, seed=42)
    samples = [np.load(folder / "calib" / f"{seed}.npy") for seed in range(6)]
    expected = quantize(model, samples, exclude=[first.name], float_weights="int8")
    np.testing.assert_allclose(ei.Session(int8, backend="numpy").run(feeds)["logits"],
                               ei.Session(expected, backend="numpy").run(feeds)["logits"], rtol=1e-5, atol=1e-6)
    reference = ei.Session(model, backend="numpy").run(feeds)["logits"]
    assert sqnr(reference, ei.Session(int8, backend="numpy").run(feeds)["logits"]) > 20
    refused = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "--mode", "dynamic",
                                                    "--float-weights", "int8", "-o", str(tmp_path / "d.eim")])
    assert refused.exit_code != 0 and refused.output.count("\n") == 1 and "float_weights" in refused.output


def test_weight_rounding_option_rounds_by_gptq_as_the_library_does(files, tmp_path):
    """--weight-rounding gptq gives what ei.quantize(weight_rounding="gptq") gives, and says so in
    the metadata; by default plain int8 rounds to nearest and --min-sqnr by GPTQ; with dynamic
    quantization it is a one-line error."""
    from edgeinfer.quantize import quantize

    folder, proto = files
    model = ei.convert(proto)
    runs = {"gptq": ["--weight-rounding", "gptq"], "default": [], "min_sqnr": ["--min-sqnr", "20"]}
    rounding = {}
    for label, options in runs.items():
        result = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "--calib", str(folder / "calib"),
                                                       *options, "-o", str(tmp_path / f"{label}.eim")])
        assert result.exit_code == 0, result.output
        summary = json.loads(ei.load(tmp_path / f"{label}.eim").metadata["quantization"])
        rounding[label] = summary.get("weight_rounding", {}).get("method", "nearest")
    assert rounding == {"gptq": "gptq", "default": "nearest", "min_sqnr": "gptq"}
    feeds = zoo.example_inputs(proto, seed=42)
    samples = [np.load(folder / "calib" / f"{seed}.npy") for seed in range(6)]
    expected = quantize(model, samples, weight_rounding="gptq")
    np.testing.assert_allclose(ei.Session(ei.load(tmp_path / "gptq.eim"), backend="numpy").run(feeds)["logits"],
                               ei.Session(expected, backend="numpy").run(feeds)["logits"], rtol=1e-5, atol=1e-6)
    refused = CliRunner().invoke(quantize_command, [str(folder / "cnn.onnx"), "--mode", "dynamic",
                                                    "--weight-rounding", "gptq", "-o", str(tmp_path / "d.eim")])
    assert refused.exit_code != 0 and refused.output.count("\n") == 1 and "weight_rounding" in refused.output
