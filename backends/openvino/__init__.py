"""The OpenVINO backend: a graph lowered to ONNX, read by OpenVINO's ONNX frontend, compiled
with ``Core.compile_model`` for the CPU, an (Intel) GPU or an NPU.

Importing this package imports ``openvino``; without it the ``ImportError`` makes
``edgeinfer.backend.installed_backends()`` skip the backend.

``device=`` maps ``"cpu"`` / ``"gpu"`` / ``"npu"`` to OpenVINO's ``CPU`` / ``GPU`` / ``NPU``.
A device ``Core().available_devices`` does not list is a ``BackendError``, or with
``fallback=True`` a logged warning and the CPU.

Engine options (``Session(model, backend="openvino", performance_hint="THROUGHPUT")``):

- ``performance_hint``: ``"LATENCY"`` (default: one stream, every thread on one request),
  ``"THROUGHPUT"`` or ``"CUMULATIVE_THROUGHPUT"`` (several streams, for many concurrent
  requests: the executable keeps one infer request per calling thread);
- ``precision``: ``INFERENCE_PRECISION_HINT``, ``"f32"`` (default on every device but an NPU, so results
  match the other backends within fp32 tolerances even on CPUs with bf16/AMX units, where
  OpenVINO would otherwise compute in bf16), ``"bf16"`` or ``"f16"``;
- ``fp32_nodes``: tensor names whose writing nodes stay f32 under a reduced ``precision``
  (mixed precision, ``precision.py``; ``precision="auto"`` finds them);
- ``device_name``: an exact OpenVINO device string instead of the one ``device=`` maps to,
  e.g. ``"GPU.1"``, ``"AUTO:GPU,CPU"`` or ``"HETERO:NPU,CPU"``;
- ``config``: further ``compile_model`` properties, passed to OpenVINO as they are
  (``{"NUM_STREAMS": 2, "ENABLE_CPU_PINNING": False}``).

``CompileOptions.threads`` becomes ``INFERENCE_NUM_THREADS``; ``CompileOptions.debug`` turns
on OpenVINO's per-node profiling (``Executable.stats()["profile"]``).

INT8: where this CPU plugin's u8 x s8 kernels saturate (``int8.saturates()``, probed once per
process: x86 without VNNI), compile rewrites int8 weights as uint8 with zero point + 128, which
OpenVINO computes in float32 kernels, exactly and at about fp32 speed; ``int8.integer_path()``
names the path, the plan says it per part and ``Executable.stats()["integer_path"]`` per executable.
"""

from typing import Any

import openvino  # noqa: F401  (the ImportError that marks this backend as not installed)

from edgeinfer.backends.openvino.backend import (
    DEVICE_NAMES,
    ENGINE_OPTIONS,
    PERFORMANCE_HINTS,
    PRECISIONS,
    OpenVinoBackend,
    OpenVinoExecutable,
)
from edgeinfer.backends.openvino.precision import reduced_precisions
from edgeinfer.ir import Graph

keeps_fp32_nodes = True  # engine option fp32_nodes: mixed precision on one engine


def create_backend(*, device: str = "cpu", fallback: bool = False, **engine_options: Any) -> OpenVinoBackend:
    return OpenVinoBackend(device=device, fallback=fallback, **engine_options)


def describe_part(graph: Graph) -> str | None:
    """What the plan says of a part placed here: whether its int8 products are exact on this
    CPU (see ``int8.py``)."""
    from edgeinfer.backends.openvino.int8 import graph_integer_path
    from edgeinfer.ir.lowering import lower_graph

    path = graph_integer_path(lower_graph(graph))
    return None if path is None else f"int8 {path} (CPU)"


__all__ = [
    "DEVICE_NAMES",
    "ENGINE_OPTIONS",
    "PERFORMANCE_HINTS",
    "PRECISIONS",
    "OpenVinoBackend",
    "OpenVinoExecutable",
    "create_backend",
    "describe_part",
    "keeps_fp32_nodes",
    "reduced_precisions",
]
