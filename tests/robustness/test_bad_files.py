"""Empty, truncated, random and wrong-format files for every loader: a typed error naming the
file through the API, one line and exit status 2 through the CLI.

Format detection: a file whose content carries a signature (the .eim magic, TFLite's 'TFL3',
a Keras or PyTorch zip, a pickle) is recognised by it whatever its suffix; ONNX, caffemodel
and prototxt files carry none and go by their suffix, so such a file under another suffix
gets the error of the loader its suffix names."""

from __future__ import annotations

import random
import warnings

import pytest
from clicheck import cli_fails

import edgeinfer as ei
from edgeinfer.api import detect_frontend, load_any, sniff_format
from edgeinfer.errors import EdgeInferError

KINDS = ["eim", "onnx", "tflite", "prototxt", "pt", "pt2", "keras"]
SIGNED = {"eim", "tflite", "pt", "pt2", "keras"}  # recognised by content


def load(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_any(path)


def bad_variants(data: bytes) -> dict[str, bytes]:
    rng = random.Random(len(data))
    return {"empty": b"", "one byte": data[:1], "truncated": data[:len(data) // 2],
            "random": rng.randbytes(len(data)), "zeros": bytes(len(data))}


@pytest.mark.parametrize("variant", ["empty", "one byte", "truncated", "random", "zeros"])
@pytest.mark.parametrize("kind", KINDS)
def test_broken_file_is_a_typed_error_naming_it(seeds, tmp_path, kind, variant):
    path = seeds.place(kind, bad_variants(seeds.data(kind))[variant], tmp_path)
    with pytest.raises(EdgeInferError) as info:
        load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("variant", ["empty", "truncated", "random"])
def test_broken_caffemodel_is_a_typed_error_naming_it(seeds, tmp_path, variant):
    weights = seeds.place("caffemodel", bad_variants(seeds.data("caffemodel"))[variant], tmp_path)
    with pytest.raises(EdgeInferError, match="tiny.caffemodel"):
        ei.convert(weights.with_name("tiny.prototxt"), weights=weights)


@pytest.mark.parametrize("variant", ["empty", "truncated", "random"])
@pytest.mark.parametrize("kind", KINDS)
def test_cli_prints_one_line_and_exits_2(seeds, tmp_path, kind, variant):
    path = seeds.place(kind, bad_variants(seeds.data(kind))[variant], tmp_path)
    assert str(path) in cli_fails(["inspect", path])
    if kind != "eim":
        cli_fails(["convert", path, "-o", tmp_path / "out.eim"])
        assert not (tmp_path / "out.eim").exists()


def test_cli_with_a_bad_caffemodel(seeds, tmp_path):
    weights = seeds.place("caffemodel", b"\xff" * 40, tmp_path)
    cli_fails(["convert", weights.with_name("tiny.prototxt"), "--weights", weights, "-o", tmp_path / "o.eim"],
              "tiny.caffemodel")


@pytest.mark.parametrize("content", KINDS)
@pytest.mark.parametrize("suffix_of", KINDS)
def test_wrong_suffix(seeds, tmp_path, content, suffix_of):
    """A signed format is detected by content; any other gives its suffix's loader's error."""
    if content == suffix_of:
        pytest.skip("same format")
    path = tmp_path / f"model{seeds.path(suffix_of).suffix}"
    path.write_bytes(seeds.data(content))
    if content in SIGNED and content != "pt":
        load(path)  # converts (or loads) as what it is
    else:
        with pytest.raises(EdgeInferError) as info:  # a TorchScript .pt needs --input-shape
            load(path)
        assert str(path) in str(info.value)


def test_content_wins_over_the_suffix(seeds, tmp_path):
    renamed = tmp_path / "model.onnx"
    renamed.write_bytes(seeds.data("tflite"))
    assert sniff_format(renamed) == "tflite" and detect_frontend(renamed) == "tflite"
    assert ei.convert(renamed).metadata["source_format"] == "tflite"


def test_an_onnx_file_named_tflite_says_what_tflite_expected(seeds, tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(seeds.data("onnx"))
    with pytest.raises(ei.ModelFormatError, match="expected a TFLite flatbuffer"):
        ei.convert(path)
    cli_fails(["inspect", path], "expected a TFLite flatbuffer")


def test_converting_an_eim_file_says_to_load_it(seeds, tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(seeds.data("eim"))
    with pytest.raises(ei.ModelFormatError, match="load it with edgeinfer.load"):
        ei.convert(path)
    assert load(path).summary()["nodes"] > 0  # what inspect/run/export do: load it


@pytest.mark.parametrize("name", ["model.bin", "model", "model.txt"])
def test_unknown_suffix_without_a_signature(seeds, tmp_path, name):
    path = tmp_path / name
    path.write_bytes(seeds.data("onnx"))
    with pytest.raises(ei.ModelFormatError, match="cannot convert file"):
        ei.convert(path)
    cli_fails(["inspect", path], "cannot convert file")


def test_directory_and_missing_file(tmp_path):
    for path in (tmp_path / "absent.onnx", tmp_path / "absent.eim", tmp_path / "absent.tflite"):
        with pytest.raises(EdgeInferError, match="absent"):
            load(path)
        cli_fails(["inspect", path], "absent")
    folder = tmp_path / "dir.eim"
    folder.mkdir()
    with pytest.raises(EdgeInferError, match="directory"):
        load(folder)
