"""Seed files for every loader, the loaders themselves, and the mutations the fuzzers apply.

Shared by ``tests/robustness`` and ``benchmarks/fuzz_loaders.py`` (which puts this folder on
``sys.path``). Seeds are small valid files written from scratch: an ``.eim`` and an ``.onnx``
of a tiny MLP, a ``.tflite`` written by edgeinfer's own exporter (no TensorFlow), a Caffe
``.prototxt`` with its ``.caffemodel``, a TorchScript ``.pt`` and an ExportedProgram ``.pt2``
(when torch is installed) and a ``.keras`` archive (when Keras is installed).

A *loader* takes a path and does everything ``edgeinfer convert``/``inspect`` does with a file
of that kind (parse, verify, import, type inference); the property under test is that it
returns or raises an ``EdgeInferError``, never anything else.
"""

from __future__ import annotations

import importlib.util
import random
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

import edgeinfer as ei
from devkit.testing import parse_model

MLP_TEXT = """
    <ir_version: 8, opset_import: ["" : 17]>
    mlp (float[N, 4] x) => (float[N, 3] y)
    <float[4, 5] w1 = {W1}, float[5] b1 = {B1}, float[5, 3] w2 = {W2}>
    {{
        h = MatMul(x, w1)
        hb = Add(h, b1)
        a = Relu(hb)
        z = MatMul(a, w2)
        y = Softmax<axis = -1>(z)
    }}"""

CAFFE_NET = """name: "tiny"
input: "data"
input_shape { dim: 1 dim: 1 dim: 6 dim: 6 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 2 kernel_size: 3 pad: 1 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1" inner_product_param { num_output: 3 } }
layer { name: "prob" type: "Softmax" bottom: "ip1" top: "prob" }
"""


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def mlp_onnx() -> onnx.ModelProto:
    rng = np.random.default_rng(7)

    def floats(n: int) -> str:
        return "{" + ",".join(f"{v:.4f}" for v in rng.standard_normal(n)) + "}"

    return parse_model(MLP_TEXT.format(W1=floats(20), B1=floats(5), W2=floats(15)))


def write_onnx(folder: Path) -> Path:
    path = folder / "mlp.onnx"
    onnx.save(mlp_onnx(), path)
    return path


def write_eim(folder: Path) -> Path:
    path = folder / "mlp.eim"
    ei.convert(mlp_onnx()).save(path)
    return path


def write_tflite(folder: Path) -> Path:
    path = folder / "mlp.tflite"
    model = ei.convert(mlp_onnx(), input_shapes={"x": (1, 4)})
    ei.export(model, path)
    return path


def write_caffe(folder: Path) -> Path:
    from edgeinfer.converters import caffe

    prototxt = folder / "tiny.prototxt"
    prototxt.write_text(CAFFE_NET)
    caffe.random_caffemodel(prototxt, folder / "tiny.caffemodel", seed=0)
    return prototxt


def _tiny_module():
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.relu(self.fc(x))

    torch.manual_seed(0)
    return Tiny().eval(), torch.randn(2, 4)


def write_pt2(folder: Path) -> Path:
    import torch

    module, example = _tiny_module()
    path = folder / "tiny.pt2"
    torch.export.save(torch.export.export(module, (example,)), path)
    return path


def write_pt(folder: Path) -> Path:
    import torch

    module, _ = _tiny_module()
    path = folder / "tiny.pt"
    torch.jit.save(torch.jit.script(module), path)
    return path


def write_keras(folder: Path) -> Path:
    import keras

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3, activation="relu")(inputs))
    path = folder / "tiny.keras"
    model.save(path)
    return path


# kind -> (suffix, writer, module it needs or None)
SEED_WRITERS: dict[str, tuple[str, Callable[[Path], Path], str | None]] = {
    "eim": (".eim", write_eim, None),
    "onnx": (".onnx", write_onnx, None),
    "tflite": (".tflite", write_tflite, "flatbuffers"),
    "prototxt": (".prototxt", write_caffe, "google.protobuf"),
    "caffemodel": (".caffemodel", write_caffe, "google.protobuf"),
    "pt": (".pt", write_pt, "torch"),
    "pt2": (".pt2", write_pt2, "torch"),
    "keras": (".keras", write_keras, "keras"),
}


def available_kinds() -> list[str]:
    return [kind for kind, (_, _, needs) in SEED_WRITERS.items() if needs is None or has(needs.split(".")[0])]


def write_seed(kind: str, folder: Path) -> Path:
    """A valid file of ``kind`` in ``folder`` (the .caffemodel of the Caffe pair for "caffemodel")."""
    folder.mkdir(parents=True, exist_ok=True)
    path = SEED_WRITERS[kind][1](folder)
    return path.with_suffix(".caffemodel") if kind == "caffemodel" else path


# -- loaders: what the CLI does with a file of each kind -------------------------------------------
def _load_eim(path: Path) -> object:
    model = ei.load(path)
    from edgeinfer.format.sizes import size_breakdown

    size_breakdown(path)  # what `edgeinfer inspect` adds for an .eim file
    return model.summary()


def _convert(path: Path, **options) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ei.convert(path, **options).summary()


def _load_caffemodel(path: Path) -> object:
    """A mutated caffemodel with the seed's own prototxt next to it."""
    return _convert(path.with_name("tiny.prototxt"), weights=path)


def _load_keras(path: Path) -> object:
    """Only the Keras archive loading: a full conversion runs TensorFlow's converter (seconds)."""
    from edgeinfer.converters.tensorflow import load_keras_file

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_keras_file(path)


LOADERS: dict[str, Callable[[Path], object]] = {
    "eim": _load_eim,
    "onnx": _convert,
    "tflite": _convert,
    "prototxt": _convert,
    "caffemodel": _load_caffemodel,
    "pt": lambda path: _convert(path, input_shapes={"x": (2, 4)}),
    "pt2": _convert,
    "keras": _load_keras,
}


# -- protobuf wire format, for files protobuf's API refuses to write --------------------------------
def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def wire_field(number: int, payload: bytes, wire: int = 2) -> bytes:
    """One protobuf field: wire 2 is length-delimited, 0 takes an encoded varint, 5 raw bytes."""
    return varint((number << 3) | wire) + (varint(len(payload)) + payload if wire == 2 else payload)


# -- mutations -------------------------------------------------------------------------------------
def flip_bits(data: bytes, rng: random.Random, count: int) -> bytes:
    out = bytearray(data)
    for _ in range(count):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def overwrite(data: bytes, rng: random.Random, count: int) -> bytes:
    """Set ``count`` bytes to interesting values (0, 0xff, 0x7f, 0x80, random)."""
    out = bytearray(data)
    for _ in range(count):
        if out:
            out[rng.randrange(len(out))] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
    return bytes(out)


def truncate(data: bytes, rng: random.Random, _count: int) -> bytes:
    return data[:rng.randrange(len(data))] if data else data


def splice(data: bytes, rng: random.Random, count: int) -> bytes:
    """Copy a chunk of the file over another place (or insert it), as corrupt copies do."""
    if len(data) < 2:
        return data
    length = rng.randrange(1, max(2, min(len(data) // 2, 16 * count)))
    source = rng.randrange(len(data) - length + 1)
    target = rng.randrange(len(data))
    chunk = data[source:source + length]
    if rng.random() < 0.5:
        return data[:target] + chunk + data[target + length:]
    return data[:target] + chunk + data[target:]


def random_bytes(data: bytes, rng: random.Random, _count: int) -> bytes:
    return rng.randbytes(rng.randrange(0, 2 * len(data) + 1))


MUTATIONS: dict[str, Callable[[bytes, random.Random, int], bytes]] = {
    "flip_bits": flip_bits, "overwrite": overwrite, "truncate": truncate, "splice": splice,
    "random_bytes": random_bytes,
}


def mutate(data: bytes, mutation: str, seed: int, count: int = 1) -> bytes:
    return MUTATIONS[mutation](data, random.Random(seed), count)
