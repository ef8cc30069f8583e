"""Hostile and broken Caffe files: a typed error naming the file and the layer, never a crash,
a hang, or an allocation the file merely declares."""

from __future__ import annotations

import warnings

import pytest

import edgeinfer as ei
from edgeinfer.converters.caffe import prototxt
from edgeinfer.errors import ConversionError, ModelFormatError, UnsupportedOpError

pytest.importorskip("google.protobuf")
from corpus import CAFFE_NET, wire_field  # noqa: E402

BAD_NETS = {
    "conv stride 0": (CAFFE_NET.replace("kernel_size: 3 pad: 1", "kernel_size: 3 pad: 1 stride: 0"),
                      ModelFormatError, "stride and dilation >= 1"),
    "conv kernel 0": (CAFFE_NET.replace("kernel_size: 3 pad: 1", "kernel_size: 0 pad: 1"),
                      ModelFormatError, "kernel_size, stride and dilation >= 1"),
    "conv group 0": (CAFFE_NET.replace("pad: 1 }", "pad: 1 group: 0 }"), ModelFormatError, "group 0 must divide"),
    "pool stride 0": (CAFFE_NET.replace("kernel_size: 2 stride: 2", "kernel_size: 2 stride: 0"),
                      ModelFormatError, "expected stride >= 1"),
    "pool kernel too big": (CAFFE_NET.replace("kernel_size: 2 stride: 2", "kernel_size: 99 stride: 2"),
                            ModelFormatError, "does not fit"),
    "huge pad": (CAFFE_NET.replace("kernel_size: 3 pad: 1", "kernel_size: 3 pad: 2000000000"),
                 ModelFormatError, "more than 2147483648 elements"),
    "huge input": (CAFFE_NET.replace("dim: 6 dim: 6", "dim: 60000000 dim: 60000000"),
                   ModelFormatError, "2147483648 elements"),
    "negative dim": (CAFFE_NET.replace("dim: 6 dim: 6", "dim: -6 dim: 6"), ModelFormatError, "positive dims"),
    "zero dim": (CAFFE_NET.replace("dim: 6 dim: 6", "dim: 0 dim: 6"), ModelFormatError, "positive dims"),
    "rank 70": (CAFFE_NET.replace("dim: 1 dim: 1 dim: 6 dim: 6", " ".join(["dim: 1"] * 70)),
                ModelFormatError, "at most 64 dims"),
    "duplicate layer": (CAFFE_NET.replace('name: "relu1"', 'name: "conv1"'), ModelFormatError, "used twice"),
    "unknown layer": (CAFFE_NET.replace('type: "ReLU"', 'type: "Frobnicate"'), UnsupportedOpError, "'Frobnicate'"),
    "cycle": (CAFFE_NET.replace('bottom: "data" top: "conv1"', 'bottom: "prob" top: "conv1"'),
              ModelFormatError, "no earlier layer or input produces"),
    "no inputs": ("\n".join(CAFFE_NET.splitlines()[3:]), ModelFormatError, "declares no inputs"),
    "not text format": ("layer { name: ", ModelFormatError, "cannot parse"),
    "nested 1000 deep": (CAFFE_NET.replace('layer { name: "prob"', 'layer { name: "prob" python_param '
                                           + "{ x " * 1000 + "}" * 1000),
                         ModelFormatError, "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(BAD_NETS))
def test_bad_prototxt(tmp_path, case):
    text, error, message = BAD_NETS[case]
    path = tmp_path / "net.prototxt"
    path.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error, match=message) as info:
            ei.convert(path)
    assert str(path) in str(info.value)


def test_prototxt_larger_than_the_limit(tmp_path, monkeypatch):
    path = tmp_path / "net.prototxt"
    path.write_text(CAFFE_NET)
    monkeypatch.setattr(prototxt, "MAX_TEXT_BYTES", 100)
    with pytest.raises(ModelFormatError, match="at most 100 bytes"):
        ei.convert(path)


def test_prototxt_that_is_not_utf8(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_bytes(CAFFE_NET.encode() + b"\xff\xfe")
    with pytest.raises(ModelFormatError, match="cannot read it"):
        ei.convert(path)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return wire_field(number, payload, wire)


def caffemodel_with_blob(blob: bytes) -> bytes:
    """A NetParameter with one V2 layer 'conv1' holding one blob of the given wire bytes."""
    layer = _field(1, 2, b"conv1") + _field(2, 2, b"Convolution") + _field(7, 2, blob)
    return _field(100, 2, layer)


@pytest.mark.parametrize("blob, message", [
    (_field(5, 5, b"\0\0"), "running past the end"),  # an unpacked float cut short (was a BufferError)
    (_field(7, 2, _field(1, 0, b"\x05") + _field(1, 0, b"\x05")) + _field(5, 2, b"\0" * 8), "holding 2 values"),
    (_field(7, 2, b"".join(_field(1, 0, b"\x01") for _ in range(70))), "70 dims"),
    (_field(7, 2, _field(1, 0, b"\xff" * 9 + b"\x01") * 2), "holding 0 values"),  # dims 2**64-1: no wrap-around
])
def test_bad_caffemodel_blobs(tmp_path, seeds, blob, message):
    prototxt_path = seeds.path("prototxt")
    weights = tmp_path / "w.caffemodel"
    weights.write_bytes(caffemodel_with_blob(blob))
    with pytest.raises(ModelFormatError, match=message):
        ei.convert(prototxt_path, weights=weights)


def test_caffemodel_that_is_a_prototxt(seeds):
    with pytest.raises(ModelFormatError, match="caffemodel"):
        ei.convert(seeds.path("prototxt"), weights=seeds.path("prototxt"))


def test_caffemodel_blob_of_the_wrong_shape(tmp_path, seeds):
    from edgeinfer.converters.caffe import read_caffemodel, write_caffemodel

    layers = read_caffemodel(seeds.path("caffemodel"))
    weights = tmp_path / "w.caffemodel"
    write_caffemodel(weights, [(name, lw.type, [b.reshape(-1) for b in lw.blobs][:1] + lw.blobs[1:])
                               for name, lw in layers.items()])
    with pytest.raises((ModelFormatError, ConversionError), match="w.caffemodel"):
        ei.convert(seeds.path("prototxt"), weights=weights)
