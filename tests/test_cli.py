"""The CLI: convert/run/inspect/export work; bad input gives one line and exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.cli import main


@pytest.fixture
def onnx_file(tmp_path, mlp_model):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model, path)
    return path


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_convert_run_inspect_export(tmp_path, onnx_file, rng):
    eim = tmp_path / "mlp.eim"
    result = invoke("convert", onnx_file, "-o", eim, "--report")
    assert result.exit_code == 0, result.output
    assert eim.is_file() and "wrote" in result.output

    x = rng.standard_normal((3, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "outs"
    result = invoke("run", eim, "--input", f"x={tmp_path / 'x.npy'}", "--repeat", 2, "--output-dir", out_dir)
    assert result.exit_code == 0, result.output
    assert "output y: float32[3, 4]" in result.output and "latency" in result.output
    expected = ei.Session(ei.convert(onnx_file)).run({"x": x})["y"]
    assert_close(np.load(out_dir / "y.npy"), expected)

    result = invoke("inspect", eim)
    assert result.exit_code == 0
    assert "input   x: float32[Nx8]" in result.output and "ops     " in result.output

    onnx_out = tmp_path / "back.onnx"
    result = invoke("export", eim, "-o", onnx_out)
    assert result.exit_code == 0, result.output
    onnx.checker.check_model(onnx.load(onnx_out), full_check=True)


def test_run_with_random_inputs_and_batch(onnx_file):
    result = invoke("run", onnx_file, "--random-inputs", "--batch", 4, "--repeat", 1)
    assert result.exit_code == 0, result.output
    assert "float32[4, 4]" in result.output


def test_input_shape_override_fixes_batch(tmp_path, onnx_file):
    eim = tmp_path / "fixed.eim"
    assert invoke("convert", onnx_file, "-o", eim, "--input-shape", "x:2x8").exit_code == 0
    assert ei.load(eim).inputs[0].shape == (2, 8)


@pytest.mark.parametrize("args, message", [
    (["convert", "{missing}", "-o", "{out}"], "no such file"),
    (["convert", "{bad}", "-o", "{out}"], "expected an ONNX protobuf"),
    (["convert", "{onnx}", "-o", "{tmp}/x.txt"], "ending in .eim"),
    (["convert", "{onnx}", "-o", "{out}", "--input-shape", "x:2xq!"], "neither a number nor a symbol"),
    (["convert", "{onnx}", "-o", "{out}", "--input-shape", "zz:2x8"], "input shapes given for"),
    (["convert", "{onnx}", "-o", "{out}", "--weights", "{onnx}"], "onnx front end does not take option(s) weights"),
    (["run", "{onnx}", "--input", "x={missing}"], "no such file"),
    (["run", "{onnx}", "--input", "x={wrongdtype}"], "expected dtype float32, got float64"),
    (["run", "{onnx}", "--input", "x={pickled}"], "not a readable .npy file without pickles"),
    (["run", "{onnx}", "--backend", "tpu", "--random-inputs"], "unknown backend"),
    (["inspect", "{bad}"], "expected an ONNX protobuf"),
    (["inspect", "{bad_eim}"], "bad.eim"),
    (["run", "{truncated_eim}", "--random-inputs"], "truncated.eim"),
    (["convert", "{unknown_op}", "-o", "{out}"], "op 'FancyConv' is not an ONNX operator"),
    (["convert", "{cycle}", "-o", "{out}"], "cycle"),
    (["export", "{onnx}", "-o", "{tmp}/x.bin"], "ending in one of .onnx, .tflite"),
])
def test_bad_input_prints_one_line_and_exits_2(tmp_path, onnx_file, args, message):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x12\x34not onnx at all")
    np.save(tmp_path / "wrong.npy", np.zeros((1, 8), np.float64))
    np.save(tmp_path / "pickled.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    bad_eim = tmp_path / "bad.eim"
    bad_eim.write_bytes(b"EIM\x00" + bytes(range(200)))
    good_eim = tmp_path / "good.eim"
    ei.convert(onnx_file).save(good_eim)
    truncated = tmp_path / "truncated.eim"
    truncated.write_bytes(good_eim.read_bytes()[:-100])
    unknown = helper.make_model(helper.make_graph(
        [helper.make_node("FancyConv", ["x"], ["y"], name="layer7")], "g",
        [helper.make_tensor_value_info("x", 1, [1])], [helper.make_tensor_value_info("y", 1, [1])]),
        opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(unknown, tmp_path / "unknown.onnx")
    cyclic = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])], "g",
        [helper.make_tensor_value_info("x", 1, [1])], [helper.make_tensor_value_info("b", 1, [1])]),
        opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(cyclic, tmp_path / "cycle.onnx")
    values = {"missing": tmp_path / "absent.onnx", "bad": bad, "onnx": onnx_file, "bad_eim": bad_eim,
              "truncated_eim": truncated, "unknown_op": tmp_path / "unknown.onnx",
              "cycle": tmp_path / "cycle.onnx",
              "out": tmp_path / "o.eim", "tmp": tmp_path, "wrongdtype": tmp_path / "wrong.npy",
              "pickled": tmp_path / "pickled.npy"}
    result = CliRunner().invoke(main, [a.format(**values) for a in args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert message in lines[0]
    assert "Traceback" not in result.output
    assert not (tmp_path / "o.eim").exists()


def test_console_script_has_help_for_every_command_and_no_traceback():
    env = {**os.environ, "EDGEINFER_DEBUG": "0"}
    for command in ([], ["convert"], ["run"], ["inspect"], ["export"]):
        done = subprocess.run([sys.executable, "-m", "edgeinfer.cli", *command, "--help"],
                              capture_output=True, text=True, env=env)
        assert done.returncode == 0 and "Usage:" in done.stdout
    done = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "inspect", "/nonexistent/model.onnx"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_every_command_help_has_an_example():
    for name in main.commands:
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0, result.output
        assert "Example: edgeinfer " + name in " ".join(result.output.split()), name


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and ei.__version__ in result.output


def test_run_json_summarizes_the_outputs_it_also_writes(tmp_path, onnx_file):
    out_dir = tmp_path / "outs"
    result = CliRunner().invoke(main, ["run", str(onnx_file), "--random-inputs", "--batch", "2", "--repeat", "3",
                                       "--output-dir", str(out_dir), "--json", "-"])
    assert result.exit_code == 0, result.output
    import json

    document = json.loads(result.stdout)
    y = np.load(out_dir / "y.npy")
    assert document["outputs"]["y"]["shape"] == list(y.shape)
    assert document["outputs"]["y"]["mean"] == pytest.approx(float(y.mean()))
    assert document["runs"] == 3 and document["latency_ms"]["min"] <= document["latency_ms"]["max"]


def test_convert_strict_refuses_non_finite_weights_and_warns_without(tmp_path):
    weight = np.ones((4, 4), np.float32)
    weight[0, 0] = np.nan
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
                              [onnx.numpy_helper.from_array(weight, "w")])
    path = tmp_path / "nan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    refused = CliRunner().invoke(main, ["convert", str(path), "-o", str(tmp_path / "a.eim"), "--strict", "-q"])
    assert refused.exit_code == 2 and "hold NaN or infinite values" in refused.output
    assert not (tmp_path / "a.eim").exists()
    warned = CliRunner().invoke(main, ["convert", str(path), "-o", str(tmp_path / "b.eim"), "-q"])
    assert warned.exit_code == 0 and "warning: " in warned.output and (tmp_path / "b.eim").is_file()


HEAVY = ("onnx", "onnxruntime", "torch", "tensorflow", "openvino", "ml_dtypes", "ai_edge_litert", "ray")


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["bench", "--help"], ["convert", "--help"],
                                  ["quantize", "--help"],
                                  ["inspect", "/nonexistent/model.onnx"], ["run", "/nonexistent/model.onnx"],
                                  ["convert", "/nonexistent/model.onnx", "-o", "/nonexistent/x.eim"]])
def test_help_and_early_errors_import_no_engine_and_no_onnx(argv):
    """Startup stays short (benchmarks/bench_startup.py measures it): nothing heavy is imported."""
    probe = ("import sys\nfrom edgeinfer.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True,
                          env={**os.environ, "EDGEINFER_DEBUG": "0"})
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


def test_the_clis_calibration_names_are_the_librarys():
    """The CLI spells them so that --help imports no framework; they must not drift."""
    from edgeinfer.cli import quantize as cli_quantize
    from edgeinfer.quantize.methods import CALIBRATION_METHODS
    from edgeinfer.quantize.static import DEFAULT_METHOD

    assert sorted(cli_quantize.CALIBRATION_METHODS) == sorted(CALIBRATION_METHODS)
    assert cli_quantize.DEFAULT_METHOD == DEFAULT_METHOD
