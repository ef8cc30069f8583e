"""``edgeinfer devices``: what this machine offers the engines, and the INT8 path each takes here.

- The CPU: its model, and the instruction-set features that decide the speed and the exactness
  of int8 and half-precision kernels, read from ``/proc/cpuinfo`` (x86: AVX2, AVX-512, VNNI, AMX,
  BF16, FP16; ARM: NEON, dot product, i8mm, BF16, FP16, SVE).
- The engines installed, with their version and their providers or devices (onnxruntime's
  execution providers, OpenVINO's devices, torch's devices, LiteRT's CPU kernels and delegates).
- The INT8 path: for onnxruntime, measured by a probe (``edgeinfer.backends.onnxruntime.int8``:
  one MatMulInteger whose exact answer a saturating u8 x s8 kernel cannot give); for the other
  engines, the kernel family this CPU's features select, said as such (not probed).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

from edgeinfer.machine import ARM_FEATURES, X86_FEATURES, cpu_flags, cpu_model, features  # noqa: F401

ENGINES = {  # backend -> (import name, distributions to report the version of)
    "onnxruntime": ("onnxruntime", ("onnxruntime", "onnxruntime-gpu")),
    "openvino": ("openvino", ("openvino",)),
    "tflite": ("ai_edge_litert", ("ai-edge-litert", "tflite-runtime")),
    "torch": ("torch", ("torch",)),
    "numpy": ("numpy", ("numpy",)),
}


@dataclass
class EngineFacts:
    name: str
    version: str | None
    devices: list[str] = field(default_factory=list)
    int8: str = ""
    note: str = ""


@dataclass
class MachineFacts:
    cpu: str
    architecture: str
    cores: int | None
    features: dict[str, bool]
    engines: list[EngineFacts]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _version(distributions: tuple[str, ...]) -> str | None:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def engine_facts(name: str, have: dict[str, bool]) -> EngineFacts | None:
    """One installed engine's devices and int8 path here; None when it is not installed."""
    module, distributions = ENGINES[name]
    if importlib.util.find_spec(module) is None:
        return None
    facts = EngineFacts(name, _version(distributions))
    try:
        describe = {"onnxruntime": _onnxruntime, "openvino": _openvino, "tflite": _tflite, "torch": _torch,
                    "numpy": _numpy}[name]
        describe(facts, have)
    except Exception as exc:  # an engine that is installed but cannot start here: said, not hidden
        facts.note = f"cannot start here: {' '.join(str(exc).split())[:200]}"
    return facts


def _x86_int8_kernels(have: dict[str, bool]) -> str:
    if have.get("AMX-INT8"):
        return "AMX-INT8"
    if have.get("AVX-512 VNNI") or have.get("AVX-VNNI"):
        return "VNNI"
    if have.get("AVX-512"):
        return "AVX-512 (no VNNI)"
    if have.get("AVX2"):
        return "AVX2 (no VNNI)"
    return "SSE"


def _arm_int8_kernels(have: dict[str, bool]) -> str:
    return "i8mm" if have.get("i8mm") else ("dotprod" if have.get("dotprod") else "NEON")


def _kernels(have: dict[str, bool]) -> str:
    return _arm_int8_kernels(have) if "NEON" in have else _x86_int8_kernels(have)


def _onnxruntime(facts: EngineFacts, have: dict[str, bool]) -> None:
    import onnxruntime

    facts.devices = list(onnxruntime.get_available_providers())
    try:
        from edgeinfer.backends.onnxruntime.int8 import integer_path, saturates
    except ImportError:  # an edgeinfer without the probe (backends/onnxruntime/int8.py)
        facts.int8 = "unknown (no saturation probe in this edgeinfer)"
        return
    facts.int8 = f"{integer_path()} (probed: u8 x s8 kernels {'saturate' if saturates() else 'exact'})"


def _openvino(facts: EngineFacts, have: dict[str, bool]) -> None:
    import openvino

    facts.devices = list(openvino.Core().available_devices)
    facts.int8 = f"oneDNN int8 kernels for {_kernels(have)} (from the CPU's features; not probed)"


def _tflite(facts: EngineFacts, have: dict[str, bool]) -> None:
    facts.devices = ["cpu (XNNPACK)", "a delegate library with --delegate PATH"]
    facts.int8 = f"XNNPACK int8 kernels for {_kernels(have)}, int32 accumulation (from the CPU's features; not probed)"


def _torch(facts: EngineFacts, have: dict[str, bool]) -> None:
    try:
        module = importlib.import_module("edgeinfer.backends.torch")
        facts.devices = list(module.available_devices())
    except ImportError:  # no torch backend in this edgeinfer: the engine's own view
        import torch

        facts.devices = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    facts.int8 = "no int8 kernels in edgeinfer's torch backend (float, fp16, bf16)"


def _numpy(facts: EngineFacts, have: dict[str, bool]) -> None:
    facts.devices = ["cpu"]
    facts.int8 = "exact (integer products in int32/int64 numpy arithmetic; slow)"


def machine_facts() -> MachineFacts:
    flags = cpu_flags()
    have = features(flags)
    engines = [facts for name in ENGINES if (facts := engine_facts(name, have)) is not None]
    return MachineFacts(cpu_model(), platform.machine(), os.cpu_count(), have, engines)


def lines(facts: MachineFacts) -> list[str]:
    present = [label for label, on in facts.features.items() if on]
    absent = [label for label, on in facts.features.items() if not on]
    out = [f"cpu      {facts.cpu} ({facts.architecture}, {facts.cores} logical cores)",
           f"isa      has {', '.join(present) or 'none of them'}; lacks {', '.join(absent) or 'none'}",
           "engines"]
    width = max((len(e.name) for e in facts.engines), default=5)
    for engine in facts.engines:
        where = ", ".join(engine.devices) or "-"
        out.append(f"  {engine.name:<{width}} {engine.version or '?':<12} {where}")
        if engine.note:
            out.append(f"  {'':<{width}} {'':<12} {engine.note}")
    out.append("int8 path here")
    out += [f"  {engine.name:<{width}} {engine.int8}" for engine in facts.engines if engine.int8]
    return out
