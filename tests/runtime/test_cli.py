"""The scheduler from the command line: inspect --plan, run with backend lists, bench --stream."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import edgeinfer as ei
from devkit import zoo
from devkit.testing import parse_model
from edgeinfer.cli import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def cnn_file(tmp_path):
    path = tmp_path / "cnn.onnx"
    onnx.save(zoo.cnn_residual_depthwise(seed=1), path)
    return path


def test_inspect_plan_shows_parts_and_fallback_reasons(tmp_path):
    pytest.importorskip("openvino")
    # OpenVINO computes float64 in float32, so its backend declines the float64 node with a reason
    path = tmp_path / "mixed.eim"
    ei.convert(parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 4] x) => (float[2, 4] y)
        {
            a = Relu(x)
            d = Cast<to = 11>(a)
            e = Sqrt(d)
            f = Cast<to = 1>(e)
            y = Neg(f)
        }"""), optimize=0).save(path)
    result = invoke("inspect", path, "--plan", "--backend", "openvino")
    assert result.exit_code == 0, result.output
    assert "over openvino+numpy on cpu" in result.output
    assert "part 0: openvino" in result.output and "numpy" in result.output
    assert "fallbacks:" in result.output and "(Sqrt) -> numpy (openvino:" in result.output


def test_inspect_plan_rejects_auto_with_one_line(cnn_file):
    result = CliRunner().invoke(main, ["inspect", str(cnn_file), "--plan", "--backend", "auto"])
    assert result.exit_code == 2
    assert "auto measures candidates by running them" in result.output


def test_run_with_a_priority_list_and_the_dag_executor(cnn_file):
    result = invoke("run", cnn_file, "--random-inputs", "--backend", "onnxruntime+numpy", "--executor", "dag",
                    "--threads", 2, "--repeat", 2)
    assert result.exit_code == 0, result.output
    assert "latency (onnxruntime,numpy, threads=2)" in result.output


def test_bench_reports_every_backend_and_the_stream_plan(cnn_file, tmp_path):
    out = tmp_path / "bench.json"
    result = invoke("bench", cnn_file, "--backend", "onnxruntime,numpy", "--threads", 2, "--runs", 5,
                    "--warmup", 1, "--stream", 20, "--stages", 2, "--json", out)
    assert result.exit_code == 0, result.output
    assert "stream of 20 requests on onnxruntime" in result.output and "2 stage(s)" in result.output
    data = json.loads(out.read_text())
    assert [r["backend"] for r in data["latency"]] == ["onnxruntime", "numpy"]
    for report in data["latency"]:
        ms = report["ms"]
        assert ms["min"] <= ms["median"] <= ms["p90"] <= ms["p99"] <= ms["max"]
    assert data["stream"]["stages"] == 2 and data["stream"]["stream_per_s"] > 0
    assert data["machine"]["cpus"] >= 1 and "onnxruntime" in data["machine"]["versions"]


@pytest.mark.parametrize("args, message", [
    (["--backend", "tensorrt"], "unknown backend 'tensorrt'"),
    (["--backend", "onnxruntime+"], "expected a name, 'auto' or names joined by '+'"),
    (["--stages", "two"], "--stages 'two'"),
])
def test_bench_bad_options_print_one_line(cnn_file, args, message):
    result = CliRunner().invoke(main, ["bench", str(cnn_file), "--runs", "1", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_run_on_a_missing_device_is_one_line(cnn_file):
    result = CliRunner().invoke(main, ["run", str(cnn_file), "--random-inputs", "--backend", "onnxruntime",
                                       "--device", "npu"])
    assert result.exit_code == 2
    assert "no NPU execution provider" in result.output


@pytest.fixture
def no_tflite_file(tmp_path):
    """CumSum then Einsum: ops with no TFLite export rule, so the tflite backend runs none of them."""
    helper = onnx.helper
    graph = helper.make_graph(
        [helper.make_node("CumSum", ["x", "axis"], ["c"], name="running_sum"),
         helper.make_node("Einsum", ["c"], ["y"], name="transpose", equation="ij->ji")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 2])],
        initializer=[onnx.numpy_helper.from_array(np.array(1, np.int64), "axis")])
    path = tmp_path / "no_tflite.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_run_says_the_placement_when_it_is_not_the_one_asked_for(no_tflite_file, cnn_file):
    pytest.importorskip("ai_edge_litert")
    result = invoke("run", no_tflite_file, "--random-inputs", "--backend", "tflite", "--repeat", 1)
    assert result.exit_code == 0, result.output
    placement = ei.Session(ei.convert(no_tflite_file), backend="tflite").plan.node_counts()
    assert placement == {"numpy": 2}
    assert "placement: tflite 0 nodes, numpy 2 nodes" in result.output
    result = invoke("run", cnn_file, "--random-inputs", "--backend", "onnxruntime", "--repeat", 1)
    assert result.exit_code == 0 and "placement:" not in result.output  # every node where asked


def test_run_auto_shows_each_candidate_and_its_choice_with_the_margin(cnn_file, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "cache"))  # measured, not a cached choice
    result = invoke("run", cnn_file, "--random-inputs", "--backend", "auto", "--repeat", 1)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    candidates = [line for line in lines if line.startswith("auto: candidate ")]
    from edgeinfer.backend import installed_backends
    from edgeinfer.runtime.auto import candidates as auto_candidates

    assert len(candidates) == len(auto_candidates(installed_backends()))
    chosen = next(line for line in lines if line.startswith("auto: chose "))
    session = ei.Session(ei.convert(cnn_file), backend="auto")  # the cached choice, now
    assert chosen.startswith(f"auto: chose {','.join(session.auto_choice.backends)}")
    assert "ms median" in chosen and any(word in chosen for word in ("faster than", "only candidate", "against"))
    assert any(line.startswith("placement: ") for line in lines)
    # the second time the choice comes from the cache, and says so
    again = invoke("run", cnn_file, "--random-inputs", "--backend", "auto", "--repeat", 1)
    assert "(measured earlier on this machine; cached)" in again.output


def test_compile_writes_a_file_that_run_uses_as_it_is(tmp_path):
    """``edgeinfer compile`` then ``edgeinfer run`` with no --backend: the stored plan, the same outputs."""
    from pathlib import Path

    runner = CliRunner()
    sample = Path(__file__).resolve().parents[2] / "models"
    out = tmp_path / "sample.eim"
    done = runner.invoke(main, ["compile", str(sample / "sample_cnn.onnx"), "-o", str(out), "--backend", "onnxruntime",
                                "-i", f"input={sample / 'sample_input.npy'}"])
    assert done.exit_code == 0, done.output
    assert "1 engine artifact(s)" in done.output and out.is_file()
    ran = runner.invoke(main, ["run", str(out), "-i", f"input={sample / 'sample_input.npy'}", "--output-dir",
                               str(tmp_path / "got"), "--repeat", "1"])
    assert ran.exit_code == 0, ran.output
    import onnxruntime as ort

    x = np.load(sample / "sample_input.npy")
    expected = ort.InferenceSession(str(sample / "sample_cnn.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "got" / "logits.npy"), expected, rtol=1e-4, atol=1e-5)
    bad = runner.invoke(main, ["compile", str(sample / "sample_cnn.onnx"), "-o", str(tmp_path / "x.onnx")])
    assert bad.exit_code == 2 and "expected a path ending in .eim" in bad.output


def test_compile_on_device_leaves_the_plan_to_the_devices_first_run(tmp_path):
    """``edgeinfer compile --on-device``: the IR; the first ``edgeinfer run`` decides there and
    writes the compiled file back; -i inputs are refused (the device decides on its own)."""
    from pathlib import Path

    runner = CliRunner()
    sample = Path(__file__).resolve().parents[2] / "models"
    out = tmp_path / "device.eim"
    done = runner.invoke(main, ["compile", str(sample / "sample_cnn.onnx"), "-o", str(out), "--backend",
                                "onnxruntime", "--on-device"])
    assert done.exit_code == 0, done.output
    assert "to be compiled on the device" in done.output and ei.load(out).compiled is None
    ran = runner.invoke(main, ["run", str(out), "-i", f"input={sample / 'sample_input.npy'}", "--output-dir",
                               str(tmp_path / "got"), "--repeat", "1"])
    assert ran.exit_code == 0, ran.output
    assert ei.load(out).compiled.backends[0] == "onnxruntime"
    import onnxruntime as ort

    x = np.load(sample / "sample_input.npy")
    expected = ort.InferenceSession(str(sample / "sample_cnn.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "got" / "logits.npy"), expected, rtol=1e-4, atol=1e-5)
    bad = runner.invoke(main, ["compile", str(sample / "sample_cnn.onnx"), "-o", str(out), "--on-device", "-i",
                               f"input={sample / 'sample_input.npy'}"])
    assert bad.exit_code == 2 and "the device decides on its own inputs" in bad.output
