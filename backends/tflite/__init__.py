"""The tflite backend: a graph exported to a ``.tflite`` flatbuffer once, run by a TFLite
interpreter (``ai_edge_litert``, else ``tflite_runtime``).

Engine options (``Session(model, backend="tflite", delegate="libedgetpu.so.1")``):

- ``op_resolver``: ``"auto"`` (default: builtin kernels with the XNNPACK delegate),
  ``"builtin"`` (builtin kernels, no default delegate) or ``"reference"`` (reference kernels);
- ``delegate``: path of a delegate library (GPU, NNAPI, Hexagon, Edge TPU, ...) loaded with
  ``load_delegate``; required for ``device="gpu"`` / ``"npu"``;
- ``delegate_options``: a dict of the delegate's options (strings).

An interpreter must not be called from two threads at once: an executable lends each
concurrent call an idle interpreter of its shapes (another one from the same flatbuffer when all
are busy), so it is thread safe on the CPU. With a delegate it keeps one interpreter and stays
on the thread that made it.
Importing this module raises ``ImportError`` when no TFLite runtime is installed.
"""

from typing import Any

from edgeinfer.backends.tflite.backend import (
    ENGINE_OPTIONS,
    OP_RESOLVERS,
    TFLiteBackend,
    TFLiteExecutable,
    runtime,
)

runtime()  # ImportError here when neither ai_edge_litert nor tflite_runtime is installed


def create_backend(*, device: str = "cpu", fallback: bool = False, **engine_options: Any) -> TFLiteBackend:
    return TFLiteBackend(device=device, fallback=fallback, **engine_options)


__all__ = ["ENGINE_OPTIONS", "OP_RESOLVERS", "TFLiteBackend", "TFLiteExecutable", "create_backend", "runtime"]
