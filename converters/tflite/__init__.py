"""TFLite front end: ``.tflite`` flatbuffers (float, fp16-weight and full-integer INT8) into the IR.

No TensorFlow at run time: ``reader`` verifies and parses the flatbuffer with a checked
accessor the project owns (field slots from ``schema.fbs``), ``importer`` maps each operator
through a registry of per-op rules (``ops/``) to standard ONNX ops (opset 17). Quantized
models import as QuantizeLinear/DequantizeLinear around float ops, except the int8 ops whose
fixed-point arithmetic differs from float-then-round (FULLY_CONNECTED, BATCH_MATMUL, ADD,
SUB, MUL, SQUARED_DIFFERENCE, MEAN, SOFTMAX, RSQRT): those become ``edgeinfer::TFLite*``
integer kernels, bit-exact with TFLite's builtin kernels (``edgeinfer.ir.lowering_tflite``).
NHWC layout is kept on
tensors and wrapped with Transposes around layout-sensitive ops, which the
``cancel_transposes`` pass removes between layers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from edgeinfer import limits
from edgeinfer.converters.tflite.importer import RULES, import_model
from edgeinfer.converters.tflite.reader import read_model
from edgeinfer.errors import ModelFormatError
from edgeinfer.ir import Graph

SUFFIXES = (".tflite",)
IDENTIFIER = b"TFL3"
MAX_FILE_BYTES = limits.MAX_FILE_BYTES


def _is_flatbuffer(data: Any) -> bool:
    return isinstance(data, (bytes, bytearray, memoryview)) and bytes(data[4:8]) == IDENTIFIER


def accepts(source: Any) -> bool:
    if _is_flatbuffer(source):
        return True
    return isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() in SUFFIXES


def convert(source: str | os.PathLike | bytes | bytearray | memoryview, *, dynamic_batch: bool = True) -> Graph:
    """Import a ``.tflite`` file (path) or flatbuffer bytes.

    ``dynamic_batch``: dims that the model's shape signature marks dynamic (-1) become symbolic
    (the batch is ``N``); with False the stored static shape (what the TFLite interpreter
    allocates by default) is used.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, where = source, "<tflite bytes>"
    else:
        data, where = read_file(source), os.fspath(source)
    return import_model(read_model(data, where), signature_shapes=dynamic_batch)


def read_file(path: str | os.PathLike) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise ModelFormatError(f"{path}: expected a .tflite file, found no such file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ModelFormatError(f"{path}: {size} bytes is larger than the {MAX_FILE_BYTES}-byte limit")
    return path.read_bytes()


def supported_ops() -> list[str]:
    """The TFLite builtin ops this importer converts."""
    from edgeinfer.converters.tflite import ops  # noqa: F401

    return sorted(op for _, op in RULES.keys())


__all__ = ["accepts", "convert", "supported_ops", "read_model", "import_model"]
