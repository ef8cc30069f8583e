"""The onnxruntime backend: one ``InferenceSession`` per compiled graph.

Engine options (``Session(model, backend="onnxruntime", providers=[...])``):

- ``providers``: execution providers in order of precedence; an entry may be a name or a
  ``(name, options)`` pair. Default: chosen by ``device`` (``DEVICE_PROVIDERS``): the CPU
  provider for ``"cpu"``; for ``"gpu"`` / ``"npu"`` every provider of that kind this onnxruntime
  build has (CUDA, TensorRT, ROCm, DirectML, CoreML, OpenVINO / QNN, NNAPI, CoreML, VitisAI),
  then the CPU provider for the nodes they do not take;
- ``provider_options``: one options dict per provider;
- ``optimization_level``: ``"disable"``, ``"basic"``, ``"extended"`` or ``"all"`` (default);
- ``session_config``: extra ``SessionOptions`` config entries (key -> value);
- ``log_severity``: onnxruntime's log level (default 4: fatal only; errors are raised instead).

INT8: where this CPU's u8 x s8 kernels saturate (``int8.saturates()``, probed once per process),
compile rewrites int8 weights as uint8 with zero point + 128 so that results are exact on
every CPU; ``int8.integer_path()`` names the path, and the plan says it per part.
"""

from typing import Any

from edgeinfer.backends.onnxruntime.backend import (
    DEFAULT_PROVIDERS,
    DEVICE_PROVIDERS,
    ENGINE_OPTIONS,
    OnnxRuntimeBackend,
    OnnxRuntimeExecutable,
    device_providers,
)
from edgeinfer.backends.onnxruntime.int8 import graph_integer_path, integer_path, saturates
from edgeinfer.ir import Graph

_LOWERINGS = ("LOWERINGS", "lower_graph", "lowering")  # imported on first use: lowering imports onnx


def __getattr__(name: str) -> Any:
    if name in _LOWERINGS:
        from edgeinfer.backends.onnxruntime import lowerings

        return getattr(lowerings, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def create_backend(*, device: str = "cpu", fallback: bool = False, **engine_options: Any) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(device=device, fallback=fallback, **engine_options)


def describe_part(graph: Graph) -> str | None:
    """What the plan says of a part placed here: the integer path of its int8 products."""
    from edgeinfer.backends.onnxruntime.lowerings import lower_graph

    path = graph_integer_path(lower_graph(graph))
    return None if path is None else f"int8 {path}"


__all__ = [
    "DEFAULT_PROVIDERS",
    "DEVICE_PROVIDERS",
    "ENGINE_OPTIONS",
    "LOWERINGS",
    "OnnxRuntimeBackend",
    "OnnxRuntimeExecutable",
    "create_backend",
    "describe_part",
    "device_providers",
    "integer_path",
    "lower_graph",
    "lowering",
    "saturates",
]
