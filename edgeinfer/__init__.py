"""edgeinfer: convert models from every framework into one IR, optimize, and run them on the
best backend for each part.

    import edgeinfer as ei
    model = ei.convert("model.onnx")
    model.save("model.eim")
    sess = ei.Session(ei.load("model.eim"), backend="numpy", threads=2)
    ei.compile(model, "model.eim", backend="auto")   # plan and engine artifacts, decided here
    sess = ei.Session("model.eim")                     # on the device: built from them
    outputs = sess.run({"input": x})
    ei.export(model, "model.tflite")   # or "model.onnx"
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from edgeinfer.api import convert, export, load
    from edgeinfer.ir import Graph, Node, Value
    from edgeinfer.model import Model, TensorInfo
    from edgeinfer.quantize import quantize
    from edgeinfer.runtime.aot_compile import compile_model as compile
    from edgeinfer.runtime.options import AutoOptions, RayOptions, RunOptions, StreamOptions
    from edgeinfer.runtime.session import Session

# Imported on first use (PEP 562), so that `import edgeinfer.cli` and `edgeinfer --help` load
# neither onnx (whose ml_dtypes import alone takes about a second) nor an engine.
_LAZY = {"convert": "edgeinfer.api", "export": "edgeinfer.api", "load": "edgeinfer.api",
         "quantize": "edgeinfer.quantize", "Session": "edgeinfer.runtime.session", "Model": "edgeinfer.model",
         "TensorInfo": "edgeinfer.model", "Graph": "edgeinfer.ir", "Node": "edgeinfer.ir", "Value": "edgeinfer.ir",
         **dict.fromkeys(("RunOptions", "AutoOptions", "StreamOptions", "RayOptions"), "edgeinfer.runtime.options"),
         "compile": "edgeinfer.runtime.aot_compile"}
_RENAMED = {"compile": "compile_model"}  # ei.compile is aot.compile_model (runtime.compile compiles parts)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeinfer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """``edgeinfer.quantize`` is the function, as when it was imported eagerly: importing the
    subpackage ``edgeinfer.quantize`` (which the import system then sets as this attribute) must
    not replace it; the subpackage stays in ``sys.modules``."""

    def __setattr__(self, name: str, value) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__version__ = "0.1.0"

__all__ = [
    "convert",
    "compile",
    "export",
    "load",
    "quantize",
    "Session",
    "RunOptions",
    "AutoOptions",
    "StreamOptions",
    "RayOptions",
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
