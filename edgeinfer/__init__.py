"""edgeinfer: convert models from every framework into one IR, optimize, and run them on the
best backend for each part.

    import edgeinfer as ei
    model = ei.convert("model.onnx")
    model.save("model.eim")
    sess = ei.Session(ei.load("model.eim"), backend="numpy", threads=2)
    outputs = sess.run({"input": x})
    ei.export(model, "model.tflite")   # or "model.onnx"
"""

from edgeinfer.api import convert, export, load
from edgeinfer.errors import (
    BackendError,
    ConversionError,
    EdgeInferError,
    InputError,
    ModelFormatError,
    ModelValidationError,
    PassError,
    UnsupportedOpError,
)
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.model import Model, TensorInfo
from edgeinfer.quantize import quantize
from edgeinfer.session import Session

__version__ = "0.1.0"

__all__ = [
    "convert",
    "export",
    "load",
    "quantize",
    "Session",
    "Model",
    "TensorInfo",
    "Graph",
    "Node",
    "Value",
    "EdgeInferError",
    "ModelFormatError",
    "ModelValidationError",
    "UnsupportedOpError",
    "InputError",
    "BackendError",
    "PassError",
    "ConversionError",
]
