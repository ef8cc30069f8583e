"""``backend="auto"`` on a machine with a GPU: the torch backend on the accelerator competes too.

Two candidates join the CPU ones when torch is installed and sees an accelerator (CUDA or ROCm
``cuda:0``, else Apple's ``mps``): torch on it alone (numpy, on the CPU, for what torch
refuses), and torch on it first with the first CPU engine (onnxruntime by preference) on the
CPU, the mixed CPU+GPU plan of a model whose pre- or post-processing ops torch refuses.
A candidate names its devices (``"torch@cuda:0"``, ``"onnxruntime@cpu"``; see
``placement.spec_device``), so the choice, cached as a list of names, says where each part ran.

They are added only when the session's device leaves the choice open (``"cpu"``, the default,
or ``"gpu"``) and the caller did not place torch itself (``backend_options={"torch":
{"device": ...}}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OPEN_DEVICES = ("cpu", "gpu")


def accelerator() -> str | None:
    """The torch accelerator of this machine (``"cuda:0"`` or ``"mps"``), None without one."""
    try:
        import torch
    except ImportError:
        return None
    if torch.cuda.is_available():
        return "cuda:0"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return None


def accelerator_candidates(installed: list[str], device: str,
                           options: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """The torch-on-the-accelerator candidate lists (none without torch or an accelerator)."""
    if "torch" not in installed or device not in OPEN_DEVICES or "device" in options.get("torch", {}):
        return []
    where = accelerator()
    if where is None:
        return []
    on_gpu = f"torch@{where}"
    found = [[on_gpu, "numpy"]]
    cpu_engines = [name for name in installed if name not in ("torch", "numpy")]
    if cpu_engines:
        found.append([on_gpu, f"{cpu_engines[0]}@cpu", "numpy"])
    return found
