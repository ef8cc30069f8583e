"""The torch backend: each graph becomes a ``torch.fx.GraphModule`` on a torch device.

``Session(model, backend="torch", device="cpu" | "gpu" | "cuda:N" | "mps", ...)``. Engine options:

- ``precision``: ``"fp32"`` (default), ``"fp16"`` or ``"bf16"``: float32 weights and inputs
  compute in that type; float32 outputs are returned as float32;
- ``fp32_nodes``: output names of nodes that compute in float32 under a reduced ``precision``
  (their float inputs cast in, their weights kept float32): mixed precision;
- ``cuda_graphs``: capture one CUDA graph per input shape signature and replay it (CUDA only;
  on another device a ``BackendError``); ``cuda_graph_cache``: signatures kept (default 8);
- ``torch_compile``: ``True`` or a dict of ``torch.compile`` keyword arguments.

``available_devices()`` lists the torch devices of this machine. Lowerings are registered per
op in ``lowerings/`` (``LOWERINGS``, keyed by ``(domain, op_type, since)``).
"""

from typing import Any

from edgeinfer.backends.torch import lowerings  # noqa: F401  (registers every lowering)
from edgeinfer.backends.torch.backend import (
    ENGINE_OPTIONS,
    TorchBackend,
    TorchExecutable,
    accepts_device,
    available_devices,
    resolve_device,
)
from edgeinfer.backends.torch.registry import LOWERINGS, lowering


def reduced_precisions(native: Any) -> dict[str, Any]:
    """``precision="auto"``'s configurations on the CPU (``edgeinfer.runtime.precision``): bf16
    (oneDNN's bf16 kernels; offered only where the CPU has the units). fp16 on the CPU is not
    offered: oneDNN's CPU half type is bf16, fp16 is for GPUs."""
    return {"bf16": {"precision": "bf16"},
            "fp16": "torch on the CPU: fp16 is not offered (oneDNN's CPU half type is bf16; fp16 is for GPUs)"}


def device_precisions(where: str) -> dict[str, Any]:
    """``precision="auto"``'s configurations of torch on an accelerator (``cuda:0``, ``mps``):
    fp16 on CUDA and MPS (their half-precision units), bf16 where CUDA reports it native
    (compute capability 8.0 and later); per precision the engine options, or why not."""
    import torch

    if where.startswith("cuda"):
        bf16 = {"precision": "bf16"} if torch.cuda.is_bf16_supported(including_emulation=False) else \
            f"torch on {where}: this GPU has no native bf16 (compute capability 8.0 or later)"
        return {"fp16": {"precision": "fp16"}, "bf16": bf16}
    if where.startswith("mps"):
        return {"fp16": {"precision": "fp16"}, "bf16": f"torch on {where}: bf16 is not offered on MPS"}
    return {p: f"torch on {where}: no reduced precision offered" for p in ("bf16", "fp16")}


keeps_fp32_nodes = True  # the engine option fp32_nodes: mixed precision (runtime.precision)


def create_backend(*, device: str = "cpu", fallback: bool = False, **engine_options: Any) -> TorchBackend:
    return TorchBackend(device=device, fallback=fallback, **engine_options)


__all__ = ["ENGINE_OPTIONS", "LOWERINGS", "TorchBackend", "TorchExecutable", "accepts_device",
           "available_devices", "create_backend", "device_precisions", "keeps_fp32_nodes", "lowering", "reduced_precisions",
           "resolve_device"]
