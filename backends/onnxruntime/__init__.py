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
from edgeinfer.backends.onnxruntime.lowerings import LOWERINGS, lower_graph, lowering


def create_backend(*, device: str = "cpu", fallback: bool = False, **engine_options: Any) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(device=device, fallback=fallback, **engine_options)


__all__ = [
    "DEFAULT_PROVIDERS",
    "DEVICE_PROVIDERS",
    "ENGINE_OPTIONS",
    "LOWERINGS",
    "OnnxRuntimeBackend",
    "OnnxRuntimeExecutable",
    "create_backend",
    "device_providers",
    "lower_graph",
    "lowering",
]
