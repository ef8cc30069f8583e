"""Inputs from files on the command line: -i NAME=photo.jpg with --mean/--std/--layout, and --calib
with one .npy, .npz or image file."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

import edgeinfer as ei
from devkit.testing import assert_close
from edgeinfer.cli import main

SAMPLE = Path(__file__).resolve().parents[1] / "models" / "sample_cnn.onnx"  # input 1x3x64x64, NCHW
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def photo(tmp_path_factory) -> Path:
    rng = np.random.default_rng(7)
    pixels = cv2.GaussianBlur((rng.random((90, 120, 3)) * 255).astype(np.uint8), (5, 5), 0)
    path = tmp_path_factory.mktemp("img") / "photo.jpg"
    cv2.imwrite(str(path), pixels)
    return path


def preprocessed(path: Path, size=(64, 64), layout="NCHW") -> np.ndarray:
    """The same preprocessing written out with OpenCV: RGB, resized, [0, 1], normalized."""
    rgb = cv2.cvtColor(cv2.resize(cv2.imread(str(path)), size[::-1], interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)
    x = (rgb.astype(np.float32) / 255 - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    return (x.transpose(2, 0, 1) if layout == "NCHW" else x)[None].astype(np.float32)


def test_run_on_a_jpeg_computes_what_the_model_computes_on_the_preprocessed_array(photo, tmp_path):
    result = invoke("run", SAMPLE, "-i", f"input={photo}", "--mean", ",".join(map(str, MEAN)),
                    "--std", ",".join(map(str, STD)), "--repeat", 1, "--output-dir", tmp_path)
    assert result.exit_code == 0, result.output
    expected = ei.Session(ei.convert(SAMPLE)).run({"input": preprocessed(photo)})["logits"]
    assert_close(np.load(tmp_path / "logits.npy"), expected)


def test_an_image_for_a_symbolic_size_input_keeps_its_own_size_or_takes_shape(photo, tmp_path):
    import onnx

    model = onnx.load(SAMPLE)
    for dim, symbol in zip(model.graph.input[0].type.tensor_type.shape.dim[2:], ("H", "W")):
        dim.dim_param = symbol
    del model.graph.value_info[:]
    dynamic = tmp_path / "dynamic.onnx"
    onnx.save(model, dynamic)
    result = invoke("run", dynamic, "-i", photo, "--repeat", 1, "--output-dir", tmp_path / "own")
    assert result.exit_code == 0, result.output
    own = (np.asarray(cv2.cvtColor(cv2.imread(str(photo)), cv2.COLOR_BGR2RGB), np.float32) / 255).transpose(2, 0, 1)[None]
    assert_close(np.load(tmp_path / "own" / "logits.npy"), ei.Session(ei.convert(dynamic)).run({"input": own})["logits"])
    result = invoke("run", dynamic, "-i", photo, "--shape", "input:1x3x48x40", "--repeat", 1, "--output-dir",
                    tmp_path / "resized", "--mean", ",".join(map(str, MEAN)), "--std", ",".join(map(str, STD)))
    assert result.exit_code == 0, result.output
    feed = preprocessed(photo, size=(48, 40))
    assert_close(np.load(tmp_path / "resized" / "logits.npy"),
                 ei.Session(ei.convert(dynamic)).run({"input": feed})["logits"])


def test_an_undecodable_image_is_one_line_that_does_not_mention_pickles(tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really a jpeg")
    result = invoke("run", SAMPLE, "-i", f"input={broken}")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"error: image {broken}: OpenCV cannot decode it"]


@pytest.mark.parametrize("kind", ["npy", "npz", "jpg"])
def test_quantize_calibrates_on_one_file(photo, tmp_path, kind):
    sample = preprocessed(photo)
    if kind == "npy":
        calib = tmp_path / "one.npy"
        np.save(calib, sample)
    elif kind == "npz":
        calib = tmp_path / "one.npz"
        np.savez(calib, input=sample)
    else:
        calib = photo
    out = tmp_path / "q.eim"
    extra = ["--mean", ",".join(map(str, MEAN)), "--std", ",".join(map(str, STD))] if kind == "jpg" else []
    result = invoke("quantize", SAMPLE, "--calib", calib, "-o", out, "-q", *extra)
    assert result.exit_code == 0, result.output
    reference = ei.Session(ei.convert(SAMPLE)).run({"input": sample})["logits"]
    got = ei.Session(ei.load(out)).run({"input": sample})["logits"]
    assert np.argmax(got) == np.argmax(reference)  # calibrated on this very sample
    assert_close(got, reference, rtol=0.2, atol=0.2 * float(np.abs(reference).max()))  # int8: a few steps
