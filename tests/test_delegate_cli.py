"""--delegate PATH for the tflite backend on the command line (run and bench)."""

from __future__ import annotations

import os
import subprocess
import sys

import onnx
import pytest
from click.testing import CliRunner

from devkit import zoo
from edgeinfer.cli import main

pytest.importorskip("ai_edge_litert")


def test_cli_delegate_reaches_the_tflite_backend_and_a_bad_one_is_one_line(tmp_path):
    """--delegate PATH on run and bench: a library that cannot load is one line (no teardown
    traceback from LiteRT's Delegate), --fallback runs on the CPU, bench times the others."""
    source = tmp_path / "cnn.onnx"
    onnx.save(zoo.cnn_residual_depthwise(size=16), source)
    fake = tmp_path / "libfake_delegate.so"
    fake.write_bytes(b"not a shared library")
    env = {**os.environ, "EDGEINFER_DEBUG": "0"}
    done = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "run", str(source), "--random-inputs",
                           "--backend", "tflite", "--device", "npu", "--delegate", str(fake)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: tflite backend: delegate library '{fake}' cannot be loaded: {fake}: file too short"], done.stderr
    result = CliRunner().invoke(main, ["run", str(source), "--random-inputs", "--backend", "tflite", "--repeat", 1,
                                       "--device", "npu", "--fallback", "--delegate", str(fake)])
    assert result.exit_code == 0, result.output
    assert "latency" in result.output
    result = CliRunner().invoke(main, ["bench", str(source), "--backend", "numpy,tflite", "--runs", 2, "--top", 0,
                                       "--delegate", str(fake), "--delegate-option", "k=v"])
    assert result.exit_code == 0, result.output
    assert "tflite failed: tflite backend: delegate library" in result.output
    result = CliRunner().invoke(main, ["run", str(source), "--random-inputs", "--delegate", str(fake)])
    assert result.exit_code == 2 and "--delegate is for the tflite backend" in result.output
    result = CliRunner().invoke(main, ["run", str(source), "--backend", "tflite", "--delegate", str(tmp_path / "no.so")])
    assert result.exit_code == 2 and "no such file" in result.output
