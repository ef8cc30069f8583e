"""The onnxruntime backend: one ``InferenceSession`` per compiled graph.

Engine options (``Session(model, backend="onnxruntime", providers=[...])``):

- ``providers``: execution providers in order of precedence (default ``["CPUExecutionProvider"]``);
  an entry may be a name or a ``(name, options)`` pair;
- ``provider_options``: one options dict per provider;
- ``optimization_level``: ``"disable"``, ``"basic"``, ``"extended"`` or ``"all"`` (default);
- ``session_config``: extra ``SessionOptions`` config entries (key -> value);
- ``log_severity``: onnxruntime's log level (default 4: fatal only; errors are raised instead).
"""

from typing import Any

from edgeinfer.backends.onnxruntime.backend import (
    DEFAULT_PROVIDERS,
    ENGINE_OPTIONS,
    OnnxRuntimeBackend,
    OnnxRuntimeExecutable,
)
from edgeinfer.backends.onnxruntime.lowerings import LOWERINGS, lower_graph, lowering


def create_backend(**engine_options: Any) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(**engine_options)


__all__ = [
    "DEFAULT_PROVIDERS",
    "ENGINE_OPTIONS",
    "LOWERINGS",
    "OnnxRuntimeBackend",
    "OnnxRuntimeExecutable",
    "create_backend",
    "lower_graph",
    "lowering",
]
